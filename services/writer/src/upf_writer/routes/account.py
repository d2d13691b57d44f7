"""ntfy's token API for a logged-in user: ``POST`` (create), ``PATCH`` (change label or expiry) and
``DELETE /v1/account/token``. Cold routes, so Litestar serves them (standalone writer) and the
all-in-one's front door reaches them through its fallback.

ntfy's wire behaviour (server/server_account.go): an empty body is allowed; a token is created
expiring in 72 hours unless ``expires`` (unix seconds; 0 never) says otherwise; a ``PATCH`` without
``label`` or ``expires`` extends the token by 72 hours; ``PATCH`` and ``DELETE`` act on the token named
(``token`` in the body, the ``X-Token`` header for ``DELETE``) or else on the one the request logged in
with (400 40023 without either). Anonymous: 401; a UPF without users (ntfy without an auth file): 404.
UPF differs where ntfy cannot be followed: tokens are stored as digests, so a token is only ever shown
when created, and a ``PATCH`` of an unknown token is 404 40491 (ntfy: 500).
"""

from __future__ import annotations

import time

import msgspec
from litestar import Request, Response, route
from litestar.types import ControllerRouterHandler

from upf_edge import NtfyError
from upf_edge.access import UNAUTHORIZED, new_token, parse_credentials, valid_token
from upf_edge.gate import auth_param
from upf_edge.tokenuse import origin_of
from upf_keyspace.auth import Token, token_digest

from .. import ingest
from ..context import WriterContext
from ..httpio import decode_headers, decode_query, header_list, read_body
from ..ingest import Problem

__all__ = [
    "build",
    "TokenRequest",
    "TokenResponse",
    "parse_token_request",
    "TOKEN_EXPIRY_SECS",
    "NO_TOKEN",
    "JSON_BODY_INVALID",
    "TOKEN_NOT_FOUND",
]

PATH = "/v1/account/token"
TOKEN_EXPIRY_SECS = 72 * 3600
"""ntfy's tokenExpiryDuration: a new token's life, and how far a bare PATCH extends one."""
JSON_BODY_LIMIT = 32768
"""ntfy's jsonBodyBytesLimit."""

NO_TOKEN = Problem(40023, 400, "invalid request: no token provided")
JSON_BODY_INVALID = Problem(40024, 400, "invalid request: request body must be valid JSON")
TOKEN_NOT_FOUND = Problem(40491, 404, "token not found")  # UPF (ntfy answers 500)

_JSON = "application/json"
_SUCCESS = b'{"success":true}\n'


class TokenRequest(msgspec.Struct, frozen=True):
    """ntfy's apiAccountTokenIssueRequest / apiAccountTokenUpdateRequest (``token`` only in a PATCH)."""

    token: str = ""
    label: str | None = None
    expires: int | None = None


class TokenResponse(msgspec.Struct, frozen=True, omit_defaults=True):
    """ntfy's apiAccountTokenResponse: every field but ``token`` is omitted when empty."""

    token: str
    label: str = ""
    last_access: int = 0
    last_origin: str = ""
    expires: int = 0


_decoder = msgspec.json.Decoder(TokenRequest)
_encoder = msgspec.json.Encoder()


def parse_token_request(body: bytes) -> TokenRequest:
    """The request body (empty is allowed, as in ntfy); 400 40024 for anything but such an object."""
    if not body.strip():
        return TokenRequest()
    try:
        req = _decoder.decode(body)
    except (msgspec.DecodeError, RecursionError):  # nested deeper than msgspec follows: invalid, not a 500
        raise NtfyError(JSON_BODY_INVALID) from None
    if req.expires is not None and not -(1 << 63) <= req.expires < 1 << 63:
        raise NtfyError(JSON_BODY_INVALID)
    return req


def _origin(ctx: WriterContext, request: Request) -> str:
    client = request.client.host if request.client else ""
    if ctx.limiter is None:
        return client
    forwarded = header_list(request.scope["headers"], ctx.settings.proxy_forwarded_header.lower())
    return origin_of(client, forwarded, ctx.limiter.config.trusted)


def _reply(token: str, record: Token) -> Response[bytes]:
    body = TokenResponse(token, record.label, record.last_access or record.created, record.origin, record.expires)
    return Response(_encoder.encode(body) + b"\n", media_type=_JSON)


def build(ctx: WriterContext) -> list[ControllerRouterHandler]:
    async def login(request: Request) -> tuple[str, str | None]:
        """The logged-in user and the token it logged in with (None: a password)."""
        gate = ctx.require_gate()
        if gate.open:
            raise NtfyError(ingest.NOT_FOUND)  # ntfy without a user database has no account API
        headers = decode_headers(request.scope["headers"])
        query = decode_query(request.scope.get("query_string", b""))
        client = request.client.host if request.client else ""
        authorization, param = headers.get("authorization"), auth_param(query)
        forwarded = header_list(request.scope["headers"], ctx.settings.proxy_forwarded_header.lower())
        who = await ctx.identify(authorization, param, client, forwarded)
        if who.user is None:
            raise NtfyError(UNAUTHORIZED)
        return who.user, parse_credentials(authorization, param).token

    async def body_of(request: Request) -> TokenRequest:
        raw = await read_body(request.receive, JSON_BODY_LIMIT)  # type: ignore[arg-type]  # litestar's ASGI aliases
        if raw is None:
            raise NtfyError(ingest.JSON_TOO_LARGE)
        return parse_token_request(raw)

    @route(PATH, http_method=["POST"], name="account_token_create", status_code=200)
    async def create(request: Request) -> Response[bytes]:
        user, _ = await login(request)
        req = await body_of(request)
        now = int(time.time())
        token = new_token()
        record = Token(
            label=req.label or "",
            expires=now + TOKEN_EXPIRY_SECS if req.expires is None else req.expires,
            created=now,
            hint=token[:7],
            origin=_origin(ctx, request),
        )
        await ctx.require_store().create_token(user, token_digest(token), record)
        await ctx.require_gate().refresh()
        return _reply(token, record)

    @route(PATH, http_method=["PATCH"], name="account_token_update", status_code=200)
    async def update(request: Request) -> Response[bytes]:
        user, current = await login(request)
        req = await body_of(request)
        token = req.token or current
        if not token:
            raise NtfyError(NO_TOKEN)
        expires = req.expires
        if expires is None and req.label is None:
            expires = int(time.time()) + TOKEN_EXPIRY_SECS  # ntfy: a bare PATCH extends the token
        record = None
        if valid_token(token):
            record = await ctx.require_store().change_token(user, token_digest(token), req.label, expires)
        if record is None:
            raise NtfyError(TOKEN_NOT_FOUND)
        await ctx.require_gate().refresh()
        return _reply(token, record)

    @route(PATH, http_method=["DELETE"], name="account_token_delete", status_code=200)
    async def delete(request: Request) -> Response[bytes]:
        user, current = await login(request)
        headers = decode_headers(request.scope["headers"])
        query = decode_query(request.scope.get("query_string", b""))
        token = headers.get("x-token") or headers.get("token") or query.get("x-token") or query.get("token") or current
        if not token:
            raise NtfyError(NO_TOKEN)
        if valid_token(token):  # ntfy answers success whether or not the token existed
            await ctx.require_store().remove_token(user, token_digest(token))
            await ctx.require_gate().refresh()  # revoked from this reply on, in this process
        return Response(_SUCCESS, media_type=_JSON)

    return [create, update, delete]
