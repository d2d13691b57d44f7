"""bench/writer_layers.py: each layer serves what it claims to (real granian servers), so the
increments it prints are the layers' and not an artefact of the stubs."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import procs
    import writer_layers
finally:
    sys.path.remove(str(BENCH))


def _post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


async def _stored(store_path: Path, topic: str) -> int:
    from upf_keyspace import Settings, open_store

    store = await open_store(Settings(store_path=str(store_path)))
    try:
        return len(await store.read_after(topic, None))
    finally:
        await store.close()


def test_the_edge_layer_answers_the_fixed_reply_and_the_front_layer_the_real_one_storing_nothing(tmp_path):
    started = []
    try:
        edge, edge_port = writer_layers._start("edge", tmp_path)
        started.append(edge)
        front, front_port = writer_layers._start("front", tmp_path)
        started.append(front)

        assert _post(edge_port, "/upLAYERS0001", b"hello") == (200, writer_layers._BODY)

        status, body = _post(front_port, "/upLAYERS0001", b"hello", {"Title": "t"})
        reply = json.loads(body)
        assert status == 200 and (reply["topic"], reply["message"], reply["title"]) == ("upLAYERS0001", "hello", "t")
        second = json.loads(_post(front_port, "/upLAYERS0001", b"again")[1])
        assert second["id"] != reply["id"]  # each publish gets a position of its own
        # The front's validation runs as in the writer: ntfy's error body for a bad priority.
        status, body = _post(front_port, "/upLAYERS0001", b"hello", {"Priority": "9"})
        assert status == 400 and json.loads(body)["code"] == 40007
    finally:
        for p in started:
            p.stop()
    procs.stop_all()
    # Neither stub layer reached the store: the increments of `front` and `writer` stay apart.
    for layer in ("edge", "front"):
        assert asyncio.run(_stored(tmp_path / f"{layer}.db", "upLAYERS0001")) == 0
