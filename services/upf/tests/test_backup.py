"""``upf.backup`` on real embedded stores: what a page boundary can split is repaired on restore, ids
stay, the commit version is raised past the fence, and pages are bounded (more keys than one page)."""

from __future__ import annotations

import time
from pathlib import Path

from upf import backup as bk
from upf_keyspace import Envelope, Settings, keys, open_store
from upf_keyspace.drivers.embedded import raise_stamp_floor


async def test_restore_repairs_split_entries_and_raises_the_version(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bk, "PAGE", 7)  # several pages per prefix
    now = int(time.time())
    src = await open_store(Settings(store_path=str(tmp_path / "a.db")))
    try:
        published = [
            await src.publish(
                "upT1", Envelope(time=now, expires=now + 3600 + i, message=f"m{i}"), idem=f"k{i}" if i % 2 else ""
            )
            for i in range(20)
        ]
        lost_x = published[3]  # as if the janitor's page boundary fell between its Q and its X entry

        async def split(tr):  # type: ignore[no-untyped-def]
            tr.clear(keys.expiry_key(now + 3600 + 3, "upT1", lost_x.stamp))
            tr.set(keys.expiry_key(now + 5, "upGONE", b"\x00" * 12), b"")  # an X whose message is gone
            tr.set(keys.idem_key("upGONE", "k", b"\x00" * 12), b"")

        await src.db.transact(split)
        n = await bk.backup(src, str(tmp_path / "b"))
        after = await src.publish("upT1", Envelope(time=now, expires=now + 3600, message="after"))
    finally:
        await src.close()

    _header, end, _pairs = bk.read_backup(str(tmp_path / "b"))
    assert end.pairs == n and end.fence[:8] > published[-1].stamp[:8]
    dst = await open_store(Settings(store_path=str(tmp_path / "c.db")))
    try:
        written, top, floor = await bk.restore(dst, str(tmp_path / "b"))

        async def everything(tr):  # type: ignore[no-untyped-def]
            out = {}
            for p in (keys.Prefix.QUEUE, keys.Prefix.EXPIRY, keys.Prefix.IDEMPOTENCY):
                out[p] = await tr.get_range(*bk.prefix_range(p))
            return out

        got = await dst.db.transact(everything)
    finally:
        await dst.close()
    assert top == published[-1].stamp
    assert [keys.unpack_queue_key(k)[1] for k, _ in got[keys.Prefix.QUEUE]] == [p.stamp for p in published]
    expiries = sorted(keys.unpack_expiry_key(k) for k, _ in got[keys.Prefix.EXPIRY])
    assert expiries == sorted(
        (now + 3600 + i, "upT1", p.stamp) for i, p in enumerate(published)
    )  # repaired, orphan dropped
    assert len(got[keys.Prefix.IDEMPOTENCY]) == 10 and all(b"upGONE" not in k for k, _ in got[keys.Prefix.IDEMPOTENCY])
    assert floor > int.from_bytes(after.stamp[:8], "big")  # above an id issued after the backup, then lost
    assert raise_stamp_floor(str(tmp_path / "c.db"), floor) >= floor  # the restore's own commits may be past it
    dst = await open_store(Settings(store_path=str(tmp_path / "c.db")))
    try:
        new = await dst.publish("upT1", Envelope(time=now, expires=now + 60, message="new"))
    finally:
        await dst.close()
    assert new.stamp > after.stamp > top
