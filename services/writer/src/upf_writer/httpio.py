"""Small ASGI helpers of the writer's HTTP layer: decode headers and query, read a body with a hard
cap, send a JSON answer. The only I/O the hot path does besides the one store call."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl

from litestar.types import Receive, Send

from . import schemas
from .ingest import Problem

__all__ = ["ClientGone", "decode_headers", "decode_query", "read_body", "send_json", "send_problem", "JSON_HEADERS"]

JSON_HEADERS = ((b"content-type", b"application/json"),)


class ClientGone(Exception):
    """The client disconnected before its request body was complete."""


def decode_headers(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Lower-case name -> first value (as Go's Header.Get); values as UTF-8, invalid bytes replaced."""
    out: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1").lower()
        if key not in out:
            out[key] = value.decode("utf-8", "replace")
    return out


def decode_query(raw: bytes) -> dict[str, str]:
    """Query key -> first value, percent-decoded as UTF-8 with invalid bytes replaced."""
    if not raw:
        return {}
    text = raw.decode("utf-8", "replace")
    out: dict[str, str] = {}
    if "%" in text or "+" in text:
        pairs = parse_qsl(text, keep_blank_values=True, errors="replace")
    else:  # nothing to unescape (the usual ``up=1``): the same pairs, without parse_qsl's cost
        pairs = [pair.partition("=")[::2] for pair in text.split("&") if pair]
    for key, value in pairs:
        if key not in out:
            out[key] = value
    return out


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or ``None`` as soon as it is known to exceed ``limit`` bytes (the rest is not
    read). Never holds more than ``limit + 1`` bytes of it."""
    buf = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone
        chunk = message.get("body", b"")
        if chunk:
            room = limit + 1 - len(buf)
            buf += chunk[:room] if len(chunk) > room else chunk
            if len(buf) > limit:
                return None
        if not message.get("more_body", False):
            return bytes(buf)


async def send_json(
    send: Send, status: int, body: bytes, extra_headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode("ascii")), *extra_headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


_PROBLEM_BODIES: dict[Problem, bytes] = {}


def problem_body(problem: Problem) -> bytes:
    body = _PROBLEM_BODIES.get(problem)
    if body is None:
        body = _PROBLEM_BODIES[problem] = schemas.encode(problem.body())
    return body


async def send_problem(send: Send, problem: Problem, extra_headers: Mapping[str, str] | None = None) -> None:
    extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (extra_headers or {}).items()]
    await send_json(send, problem.http, problem_body(problem), extra)
