"""The pusher's own refusals are named upf_edge Problems; their wire bytes are ntfy's error JSON, word for
word what they were when each was written out as a status, code and message at its call site."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from upf_pusher_fakes import FakeTransport

from upf_edge import frontdoor
from upf_edge.asgi_bridge import INTERNAL_ERROR
from upf_edge.errors import NOT_FOUND, Problem
from upf_edge.http11 import error_response
from upf_keyspace import Settings
from upf_pusher import server
from upf_pusher.hub import STORE_SILENT
from upf_pusher.session import Session, SessionConfig
from upf_pusher.transports import StreamSubscriber


@pytest.mark.parametrize(
    "problem, status, body",
    [
        (NOT_FOUND, b"404 Not Found", b'{"code":40401,"http":404,"error":"page not found"}\n'),
        (INTERNAL_ERROR, b"500 Internal Server Error", b'{"code":50000,"http":500,"error":"internal server error"}\n'),
        (
            frontdoor.SHUTTING_DOWN,
            b"503 Service Unavailable",
            b'{"code":50300,"http":503,"error":"service unavailable: shutting down"}\n',
        ),
        (
            STORE_SILENT,
            b"503 Service Unavailable",
            b'{"code":50301,"http":503,"error":"service unavailable: the store did not answer"}\n',
        ),
        (
            server._NOT_WEBSOCKET,
            b"400 Bad Request",
            b'{"code":40016,"http":400,"error":"invalid request: client not using the websocket protocol",'
            b'"link":"https://ntfy.sh/docs/subscribe/api/#websockets"}\n',
        ),
        (
            server._BAD_HANDSHAKE,
            b"400 Bad Request",
            b'{"code":40000,"http":400,"error":"invalid request: bad websocket handshake"}\n',
        ),
        (
            frontdoor.TOO_MANY_CONNECTIONS.problem,
            b"429 Too Many Requests",
            b'{"code":42903,"http":429,"error":"limit reached: too many open connections",'
            b'"link":"https://ntfy.sh/docs/publish/#limitations"}\n',
        ),
    ],
)
def test_refusal_bytes(problem: Problem, status: bytes, body: bytes) -> None:
    raw = error_response(problem)
    head, _, got = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status + b"\r\n") and b"Content-Length: %d\r\n" % len(body) in head
    assert got == body


def test_a_failed_subscribe_is_refused_with_its_problem_and_closed() -> None:
    """What the hub does when a subscribe's first reads fail: ntfy's error reply, then the connection ends."""
    t = FakeTransport()
    hub = SimpleNamespace(settings=Settings())
    sub = StreamSubscriber(hub, Session(("a",), "a", SessionConfig()), t, "json", chunked=True)  # type: ignore[arg-type]
    sub.fail(STORE_SILENT)
    assert t.data == error_response(STORE_SILENT) and t.closed
    sub.fail(STORE_SILENT)  # a second refusal after the close writes nothing
    assert t.data == error_response(STORE_SILENT)
