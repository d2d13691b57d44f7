"""A connection on several topics gets its messages in id order across all of them, black box: a real
all-in-one process, a raw client that stops reading and starts again.

Why it matters: a client resumes every topic of a connection from its last id (the ntfy app sends one
``since=`` for all), so a message delivered after a later one of another topic is lost to a client cut
between the two. The case here made that happen every time: the reader paused while a burst of more
than a read's batch landed on one topic and then a message on another; on resume both topics were read
in one round, the burst's first batch and the other topic's message went out together, and the rest
of the burst after it."""

from __future__ import annotations

import base64
import json
import socket
import time

import httpx

BIG, BURST = 120, 40


def _position(msg_id: str) -> bytes:
    """An id is a global position: its bytes order messages by commit, across topics."""
    return base64.urlsafe_b64decode(msg_id + "=" * (-len(msg_id) % 4))


def test_a_multi_topic_connection_gets_ids_in_order_after_a_pause_across_a_burst(fleet):
    upf = fleet.start("upf", node="order", UPF_WORKERS="1")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills fast: the server pauses the stream
    s.connect(("127.0.0.1", upf.port))
    s.settimeout(10)
    s.sendall(b"GET /upORDc,upORDa,upORDb/json HTTP/1.1\r\nHost: x\r\n\r\n")
    buf = b""
    while b'"open"' not in buf:
        buf += s.recv(65536)
    with httpx.Client(base_url=upf.base, timeout=10) as http:
        for i in range(BIG):  # ~360 KB unread: past the socket buffers and the 64 KB high-water mark
            assert http.post("/upORDc?up=1", content=f"c{i:03d}".ljust(3000, ".")).status_code == 200
        for i in range(BURST):  # more than a read's batch (32) on one topic
            assert http.post("/upORDa", content=f"a{i:03d}").status_code == 200
        assert http.post("/upORDb", content="b000").status_code == 200
    ids: list[str] = []
    deadline = time.monotonic() + 30
    while len(ids) < BIG + BURST + 1 and time.monotonic() < deadline:
        buf += s.recv(1 << 20)
        *lines, buf = buf.split(b"\n")
        for line in lines:
            start = line.find(b"{")
            if start >= 0:
                event = json.loads(line[start:])
                if event.get("event") == "message":
                    ids.append(event["id"])
    s.close()
    assert len(ids) == BIG + BURST + 1 and len(set(ids)) == len(ids)
    positions = [_position(i) for i in ids]
    late = [i for i in range(1, len(ids)) if positions[i] < positions[i - 1]]
    assert late == [], f"{len(late)} messages came after a later id"
