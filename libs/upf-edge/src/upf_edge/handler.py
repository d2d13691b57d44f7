"""The contract between a front door and a role's hot routes: a plain async function, no framework.

A front door (the pusher's asyncio HTTP/1.1 server, or an ASGI adapter under granian) parses the
request once, asks ``handler.wants(method, path)`` and, when it does, reads the body (at most
``handler.body_limit(method, topic, headers, query)`` bytes; ``None`` when over that limit) and awaits
``handler(method, topic, headers, query, body, client)`` for a :class:`Reply`. Why: each extra layer
(an ASGI scope, a second parse, a framework's per-request machinery) costs a share of the CPU a
publish takes (measurements.md: Litestar's route machinery ~3.5x a bare callable).

``topic`` is the percent-decoded path without its leading slash ("" for ``/``); ``headers`` are the
raw (lower-case name, value) byte pairs as ASGI carries them; ``query`` is the raw query string;
``client`` is the peer's IP as the socket reports it ("" when there is none): the request limit needs
it, and only a front door knows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

__all__ = ["Handler", "Reply", "NO_BODY", "JSON", "CORS_ORIGIN", "PREFLIGHT"]

JSON = b"application/json"
NO_BODY = -1
"""``body_limit`` for a route that reads no body (the front door passes ``b""``)."""
CORS_ORIGIN = (b"Access-Control-Allow-Origin", b"*")
"""On every answer, as ntfy sends it (its ``access-control-allow-origin`` default): browsers (ntfy's web
app, web-based app servers) may publish and read the replies. A front door adds it to every reply."""


class Reply(NamedTuple):
    """What a handler answers: the status, the body and any headers beyond Content-Type/-Length."""

    status: int
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = ()
    content_type: bytes = JSON


class Handler(Protocol):
    """A role's hot routes as one callable (see the module docstring)."""

    def wants(self, method: str, path: str) -> bool:
        """Whether this request is the handler's (else the front door routes it elsewhere)."""
        ...

    def body_limit(self, method: str, topic: str, headers: Sequence[tuple[bytes, bytes]], query: bytes) -> int:
        """The most body bytes this request may carry (:data:`NO_BODY`: none is read); a parameter may
        raise it (ntfy's template mode takes a body of 32 KB)."""
        ...

    async def admit(
        self, method: str, topic: str, headers: Sequence[tuple[bytes, bytes]], query: bytes, client: str
    ) -> Reply | None:
        """For a client waiting on ``Expect: 100-continue``: the refusal its body would not change (a
        401 or 403, as Go's server answers before the body is asked for), or None to ask for it. Nothing
        is charged here: the request's own call does that, once."""
        ...

    async def __call__(
        self,
        method: str,
        topic: str,
        headers: Sequence[tuple[bytes, bytes]],
        query: bytes,
        body: bytes | None,
        client: str,
    ) -> Reply:
        """Answer the request; ``body`` is ``None`` when it was over ``body_limit`` (not read whole)."""
        ...


PREFLIGHT = Reply(
    200,
    b"",
    ((b"Access-Control-Allow-Methods", b"GET, PUT, POST, PATCH, DELETE"), (b"Access-Control-Allow-Headers", b"*")),
    b"text/plain; charset=utf-8",
)
"""ntfy's answer to any ``OPTIONS`` (a CORS preflight), on every path; the front door adds ``CORS_ORIGIN``."""
