"""Small ASGI helpers of the writer's Litestar routes (the cold ones; the hot ones are ``front.py``):
the shared request codec and body reader come from ``upf_edge``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from litestar.types import Send
from upf_edge import error_body
from upf_edge.asgi import ClientGone, read_body
from upf_edge.http11 import decode_headers, decode_query

from .ingest import Problem

__all__ = [
    "ClientGone",
    "decode_headers",
    "decode_query",
    "read_body",
    "send_json",
    "send_problem",
    "problem_body",
    "JSON_HEADERS",
]

JSON_HEADERS = ((b"content-type", b"application/json"),)


async def send_json(
    send: Send, status: int, body: bytes, extra_headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode("ascii")), *extra_headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def problem_body(problem: Problem) -> bytes:
    return error_body(problem)


async def send_problem(send: Send, problem: Problem, extra_headers: Mapping[str, str] | None = None) -> None:
    extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (extra_headers or {}).items()]
    await send_json(send, problem.http, problem_body(problem), extra)
