"""ntfy's error replies: one error type for every role, and the one builder of its JSON body.

ntfy answers every refused request with ``{"code":40009,"http":400,"error":"..."}`` plus a newline
(server/errors.go), and for some codes a ``"link"`` to the page of its docs that explains them
(e.g. 40101, 42901): a :class:`Problem` for such a code carries ntfy's link verbatim. Writer and
pusher raise :class:`NtfyError` with a :class:`Problem` (a static message: variables never go into
it) and their front doors answer with :func:`error_body`.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

__all__ = ["ErrorBody", "NtfyError", "Problem", "NOT_FOUND", "STORE_UNAVAILABLE", "INSUFFICIENT_STORAGE", "error_body"]


class ErrorBody(msgspec.Struct, frozen=True, omit_defaults=True):
    """ntfy's error JSON: ``{"code":40009,"http":400,"error":"invalid request: topic invalid"}``, plus
    ``"link"`` when there is one (ntfy's ``omitempty``)."""

    code: int
    http: int
    error: str
    link: str = ""


class Problem(NamedTuple):
    """One documented error: ntfy's ``code``, the HTTP status, a static message and, where ntfy's
    errors.go gives this code one, its docs ``link`` (empty: none, and the body has no ``link``)."""

    code: int
    http: int
    error: str
    link: str = ""

    def body(self) -> bytes:
        """The JSON reply body (cached: a role has a few dozen problems, each encoded once)."""
        return error_body(self)


class NtfyError(Exception):
    """A request refused with a documented :class:`Problem`, and any reply headers it needs (a 429's
    ``Retry-After``) as raw (lower-case name, value) pairs."""

    def __init__(self, problem: Problem, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        super().__init__(problem.error)
        self.problem = problem
        self.headers = headers

    @property
    def code(self) -> int:
        return self.problem.code

    @property
    def http(self) -> int:
        return self.problem.http

    @property
    def error(self) -> str:
        return self.problem.error


_encoder = msgspec.json.Encoder()
_BODIES: dict[Problem, bytes] = {}


def error_body(problem: Problem) -> bytes:
    """ntfy's error body for ``problem``: the JSON object and the newline ntfy writes after it."""
    body = _BODIES.get(problem)
    if body is None:
        body = _encoder.encode(ErrorBody(problem.code, problem.http, problem.error, problem.link)) + b"\n"
        if len(_BODIES) < 1024:  # problems are static; the bound only guards against a misuse
            _BODIES[problem] = body
    return body


NOT_FOUND = Problem(40401, 404, "page not found")

STORE_UNAVAILABLE = Problem(50301, 503, "service unavailable: store not responding")
"""UPF's: the store did not answer (publishers retry a 5xx; health reports it)."""

INSUFFICIENT_STORAGE = Problem(50702, 507, "insufficient storage: the store is full")
"""UPF's: the store refused the write for lack of space (ntfy's 50701 is its other 507, "no rate
visitor"); answered at once, since retrying a full disk cannot help."""
