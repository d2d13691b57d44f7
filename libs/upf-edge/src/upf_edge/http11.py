"""A lean HTTP/1.1 request-head parser and response-head builder. Pure: bytes in, values out.

Why our own: the pusher holds many idle connections, and a framework's per-connection machinery
costs tens to hundreds of KB each (measurements.md). This parses one head, keeps nothing per
connection, and refuses what it does not need: a head over ``MAX_HEAD`` bytes is 431, anything
malformed is 400, a path that is not UTF-8 after percent-decoding is 400.

Strict on purpose, because a proxy in front may read an ambiguous head differently (request smuggling):
400 for Content-Length with Transfer-Encoding, a repeated Content-Length or Transfer-Encoding, a coding
other than ``chunked``, chunked on HTTP/1.0, a missing or repeated Host on HTTP/1.1, any control byte in
the head (HTAB only between words of a value), bare LF or CR line ends (at once, not at the head
timeout), and chunk-size lines with anything but hex digits and an extension. Wherever h11 refuses a head
this parser refuses it too (tested); it is stricter than h11 on bare-LF lines, obsolete line folding,
control bytes in values, any repeated Content-Length, Content-Length with Transfer-Encoding, chunked on
HTTP/1.0, HTTP versions other than 1.0/1.1 and lengths over 18 digits. (httptools was measured on a
publish's head, same run: ~1.3 us with a parser kept per connection, ~2.8 us with one per request, against
~6-11 us here. That is 2-4% of the ~200 us of CPU an all-in-one publish costs with the store, so it does not
yet pay for a compiled dependency plus re-implementing the 400/431 rules on its callbacks.)

It also holds the request-field decoding every front door shares (``decode_headers``/``decode_query``:
what ntfy's parameter lookups read) and the reply encoder of :class:`upf_edge.handler.Reply`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from urllib.parse import parse_qsl, unquote_to_bytes

from .errors import NtfyError, Problem, error_body
from .handler import Reply

__all__ = [
    "MAX_HEAD",
    "HttpError",
    "HEADERS_TOO_LARGE",
    "ENTITY_TOO_LARGE",
    "EXPECTATION_FAILED",
    "RequestHead",
    "ChunkedDecoder",
    "RequestBody",
    "find_head_end",
    "parse_head",
    "response_head",
    "error_response",
    "json_response",
    "reply_response",
    "decode_headers",
    "header_list",
    "forwarded_of",
    "decode_query",
    "chunk",
    "LAST_CHUNK",
]

MAX_HEAD = 16 * 1024
MAX_HEADERS = 100
LAST_CHUNK = b"0\r\n\r\n"

_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) ([\x21-\x7e]+) HTTP/1\.([01])")
_FIELD = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\x00-\x08\x0a-\x1f\x7f]*")
"""A field line (a chunked body's trailer): a token, a colon, then no control byte but tab. The spaces
and tabs around a value are in that class, so they need no pattern of their own."""
_FIELDS = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\x00-\x08\x0a-\x1f\x7f]*\r\n)*")
"""Every field line of a head, each with its CRLF, checked in one match (as ``_FIELD`` checks one)."""
_OWS = b" \t"
_ABSOLUTE = re.compile(rb"[hH][tT][tT][pP][sS]?://[^/?]*")  # the scheme and authority of an absolute-form target
_BARE_LINE_END = re.compile(rb"\r(?!\n)|(?<!\r)\n")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,8})(?:;[^\x00-\x08\x0a-\x1f\x7f]*)?")
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"host", b"expect"))


class HttpError(NtfyError):
    """A request the server answers with an ntfy error body and then closes the connection. Its own
    kind because front doors catch it apart from other refusals: after it the stream's framing is
    unknown, so the connection cannot serve another request."""


HEADERS_TOO_LARGE = Problem(43100, 431, "request header fields too large")
ENTITY_TOO_LARGE = Problem(41300, 413, "request entity too large")
EXPECTATION_FAILED = Problem(41700, 417, "expectation failed: only 100-continue is supported")
"""UPF's (ntfy's server leaves it to Go's, which answers 417 in plain text): an ``Expect`` other than
100-continue, refused before anything runs (RFC 9110 10.1.1)."""


def too_large() -> HttpError:
    return HttpError(HEADERS_TOO_LARGE)


def bad_request(error: str = "invalid request: malformed HTTP request") -> HttpError:
    """400 40000 with one of this module's static messages (which framing rule the request broke)."""
    return HttpError(Problem(40000, 400, error))


class RequestHead:
    """One parsed request head. ``headers`` keeps the raw (name lower-cased, value) byte pairs for ASGI."""

    __slots__ = (
        "method",
        "raw_target",
        "path",
        "raw_path",
        "query_string",
        "version",
        "headers",
        "content_length",
        "chunked",
    )

    def __init__(
        self,
        method: str,
        raw_target: bytes,
        path: str,
        raw_path: bytes,
        query_string: bytes,
        version: str,
        headers: list[tuple[bytes, bytes]],
        content_length: int | None = None,
        chunked: bool = False,
    ) -> None:
        self.method = method
        self.raw_target = raw_target
        self.path = path
        self.raw_path = raw_path
        self.query_string = query_string
        self.version = version
        self.headers = headers
        self.content_length = content_length
        """The declared body length (validated by parse_head); None when the head declares none."""
        self.chunked = chunked

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower-case)."""
        for k, v in self.headers:
            if k == name:
                return v
        return None

    def header_map(self) -> dict[str, str]:
        """Lower-case name -> first value, decoded latin-1 (HTTP's octets), for parameter lookups."""
        out: dict[str, str] = {}
        for k, v in self.headers:
            out.setdefault(k.decode("latin-1"), v.decode("latin-1"))
        return out

    def query(self) -> dict[str, str]:
        """Query keys -> first value (ntfy reads query params by lower-case name)."""
        out: dict[str, str] = {}
        try:
            pairs = parse_qsl(self.query_string.decode("latin-1"), keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            raise bad_request("invalid request: query string is not UTF-8") from None
        for k, v in pairs:
            out.setdefault(k, v)
        return out

    @property
    def keep_alive(self) -> bool:
        """Connection is a list, over any number of lines (``Connection: keep-alive`` then
        ``Connection: close`` closes, as Go's server does)."""
        if self.version == "1.0":
            return self.has_token(b"connection", b"keep-alive")
        return not self.has_token(b"connection", b"close")

    def has_token(self, name: bytes, token: bytes) -> bool:
        """Whether a comma-list header (Connection, Upgrade) contains ``token``, case-insensitively."""
        for k, v in self.headers:  # a plain loop on the codec's hot path, no nested generator
            # the substring test first: most values (keep-alive asked of "close") need no split
            if k == name and v.lower().find(token) >= 0 and token in (p.strip().lower() for p in v.split(b",")):
                return True
        return False


def find_head_end(buf: bytes | bytearray, scanned: int = 0) -> int:
    """Index just past the blank line ending the head, or -1 if it has not arrived (431 past MAX_HEAD).

    ``scanned``: how much of ``buf`` an earlier call already found no end (nor bare line end) in, so
    that a head arriving a byte at a time is scanned once, not once per byte (a 16 KB head so sent
    cost 2.7 s of CPU when every call scanned from 0)."""
    i = buf.find(b"\r\n\r\n", scanned - 3 if scanned > 3 else 0, MAX_HEAD + 4)
    if i < 0:
        if len(buf) > MAX_HEAD:
            raise too_large()
        # a head with bare LF (or CR) line ends would never end: refuse it now, not at the head timeout
        # (from the byte before ``scanned``: a CR that ended the last part may be followed by an LF)
        if _BARE_LINE_END.search(buf, scanned - 1 if scanned else 0, len(buf) - buf.endswith(b"\r")) is not None:
            raise bad_request()
        return -1
    if i + 4 > MAX_HEAD:
        raise too_large()
    return i + 4


def parse_head(raw: bytes) -> RequestHead:
    """Parse a complete head (ending in CRLF CRLF). Raises HttpError (400) on anything malformed.

    Two compiled regexes check it, one for the request line and one for every field line at once, and
    the fields are then split without a check each: it is on every publish's path, and a regex per
    field line (with a lazy value, to drop the spaces after it) cost the writer 3.5-5.7% of its
    instructions a publish (``bench/instr_writer.py``; BENCHMARKS.md, forty-second pass)."""
    if len(raw) > MAX_HEAD:
        raise too_large()
    first = raw.find(b"\r\n")
    m = _REQUEST_LINE.fullmatch(raw, 0, first)
    if m is None:
        raise bad_request()
    method, target, minor = m.groups()
    lines = raw[first + 2 : -4].split(b"\r\n") if len(raw) - first > 4 else []
    if len(lines) > MAX_HEADERS:
        raise too_large()
    if _FIELDS.fullmatch(raw, first + 2, len(raw) - 2) is None:
        raise bad_request()
    headers: list[tuple[bytes, bytes]] = []
    framing: list[tuple[bytes, bytes]] = []
    for line in lines:
        raw_name, _, value = line.partition(b":")
        name = raw_name.lower()
        value = value.strip(_OWS)
        headers.append((name, value))
        if name in _FRAMING:
            framing.append((name, value))
    content_length, chunked = _framing(framing, minor == b"1")
    if target[0] == 0x2F:  # "/"
        raw_path, _, query_string = target.partition(b"?")
    elif target == b"*":
        raw_path, query_string = target, b""
    else:  # absolute-form (RFC 9112 3.2.2: a server must take it, as Go's does): its path and query
        scheme = _ABSOLUTE.match(target)
        if scheme is None:
            raise bad_request()
        origin = target[scheme.end() :]
        raw_path, _, query_string = (origin if origin[:1] == b"/" else b"/" + origin).partition(b"?")
    try:
        # find, not ``in``: bytes' ``in`` first tries its operand as an int, and raises and clears a
        # TypeError for a bytes one (~2,100 instructions, every request)
        path = (unquote_to_bytes(raw_path) if raw_path.find(b"%") >= 0 else raw_path).decode("utf-8")
    except UnicodeDecodeError:
        raise bad_request("invalid request: path is not UTF-8") from None
    return RequestHead(
        method.decode("ascii"),
        target,
        path,
        raw_path,
        query_string,
        "1." + chr(minor[0]),
        headers,
        content_length,
        chunked,
    )


def _framing(fields: list[tuple[bytes, bytes]], http11: bool) -> tuple[int | None, bool]:
    """(Content-Length, chunked) of a head, refusing every framing two parsers could read two ways."""
    content_length: int | None = None
    chunked = False
    hosts = 0
    for name, value in fields:
        if name == b"host":
            hosts += 1
        elif name == b"expect":
            if value and b"100-continue" not in (p.strip() for p in value.lower().split(b",")):
                raise HttpError(EXPECTATION_FAILED)
        elif name == b"content-length":
            if content_length is not None:
                raise bad_request("invalid request: repeated Content-Length")
            if not value.isdigit() or len(value) > 18:
                raise bad_request("invalid request: bad Content-Length")
            content_length = int(value)
        else:
            if chunked:
                raise bad_request("invalid request: repeated Transfer-Encoding")
            if value.lower() != b"chunked":
                raise bad_request("invalid request: transfer coding not supported")
            chunked = True
    if hosts > 1 or (http11 and hosts == 0):
        raise bad_request("invalid request: HTTP/1.1 needs exactly one Host")
    if chunked and (content_length is not None or not http11):
        raise bad_request("invalid request: ambiguous body framing")
    return content_length, chunked


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def response_head(status: int, headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    out = [b"HTTP/1.1 %d %s\r\n" % (status, _reason(status).encode("ascii"))]
    for k, v in headers:
        out.append(k + b": " + v + b"\r\n")
    out.append(b"\r\n")
    return b"".join(out)


def json_response(
    status: int,
    body: bytes,
    *,
    keep_alive: bool = True,
    head_only: bool = False,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> bytes:
    headers = [
        *extra,
        (b"Content-Type", b"application/json"),
        (b"Content-Length", str(len(body)).encode()),
        (b"Access-Control-Allow-Origin", b"*"),
        (b"Connection", b"keep-alive" if keep_alive else b"close"),
    ]
    return response_head(status, headers) + (b"" if head_only else body)


def error_response(problem: Problem, *, keep_alive: bool = False, extra: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """ntfy's error reply: the JSON body plus a newline, ``Content-Type: application/json``; ``extra``
    are further headers (a 429's ``Retry-After``)."""
    return json_response(problem.http, error_body(problem), keep_alive=keep_alive, extra=extra)


def reply_response(reply: Reply, *, keep_alive: bool = True, head_only: bool = False) -> bytes:
    """A handler's :class:`Reply` as HTTP/1.1 bytes (head, and body unless ``head_only``)."""
    body = reply.body
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nAccess-Control-Allow-Origin: *\r\n" % (
        reply.status,
        _reason_bytes(reply.status),
        reply.content_type,
        len(body),
    )
    for k, v in reply.headers:
        head += k + b": " + v + b"\r\n"
    head += b"Connection: keep-alive\r\n\r\n" if keep_alive else b"Connection: close\r\n\r\n"
    return head if head_only else head + body


_REASONS: dict[int, bytes] = {}


def _reason_bytes(status: int) -> bytes:
    reason = _REASONS.get(status)
    if reason is None:
        reason = _REASONS[status] = _reason(status).encode("ascii")
    return reason


def header_list(raw: Iterable[tuple[bytes, bytes]], name: str) -> str | None:
    """Every value of header ``name`` (lower-case), joined with ", " in order; None when absent.
    Why: a list header sent on several lines is that one list (RFC 9110 5.3), and a proxy that appends
    its own X-Forwarded-For line after the client's (HAProxy's ``option forwardfor``) must be read
    whole: its entry is the last, the one the request limits trust."""
    key = name.encode("latin-1")
    found: bytes | None = None
    for k, v in raw:  # a loop, not a comprehension: ~2x faster on 3.11 for a handful of headers
        if k == key:
            found = v if found is None else found + b", " + v
    return None if found is None else found.decode("latin-1")


def forwarded_of(decoded: Mapping[str, str], raw: Iterable[tuple[bytes, bytes]], name: str) -> str | None:
    """``header_list`` for a request whose headers ``decode_headers`` already read (``decoded``): the
    dict answers the usual request, which has no such header, in one lookup (a publish's hot path)."""
    return None if decoded.get(name) is None else header_list(raw, name)


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


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (never empty: an empty chunk would end the body)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class ChunkedDecoder:
    """A request body in chunked transfer coding, decoded incrementally, refusing more than ``limit`` bytes.

    ``feed`` returns the bytes of the input it did not consume (the start of the next request) once
    the body is complete, else None. Raises HttpError: 400 for bad framing, 413 over the limit.
    """

    __slots__ = ("limit", "body", "_buf", "_need", "_state", "done")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.body = bytearray()
        self._buf = b""
        self._need = 0
        self._state = 0  # 0 size line, 1 data, 2 CRLF after data, 3 trailers
        self.done = False

    def feed(self, data: bytes) -> bytes | None:
        buf = self._buf + data
        self._buf = b""
        pos = 0
        while True:
            if self._state == 0:
                i = buf.find(b"\r\n", pos)
                if i < 0:
                    if len(buf) - pos > 1024 or buf.find(b"\n", pos) >= 0:
                        raise bad_request("invalid request: bad chunk size")
                    break
                m = _CHUNK_SIZE.fullmatch(buf, pos, i)
                if m is None:
                    raise bad_request("invalid request: bad chunk size")
                self._need = int(m[1], 16)
                pos = i + 2
                if self._need == 0:
                    self._state = 3
                else:
                    if len(self.body) + self._need > self.limit:
                        raise HttpError(ENTITY_TOO_LARGE)
                    self._state = 1
            elif self._state == 1:
                take = min(self._need, len(buf) - pos)
                if take == 0:
                    break
                self.body += buf[pos : pos + take]
                pos += take
                self._need -= take
                if self._need == 0:
                    self._state = 2
            elif self._state == 2:
                if len(buf) - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise bad_request("invalid request: bad chunk framing")
                pos += 2
                self._state = 0
            else:
                i = buf.find(b"\r\n", pos)
                if i < 0:
                    if len(buf) - pos > MAX_HEAD:
                        raise too_large()
                    if buf.find(b"\n", pos) >= 0:
                        raise bad_request("invalid request: bad chunk trailer")
                    break
                line = buf[pos:i]
                pos = i + 2
                if not line:
                    self.done = True
                    return bytes(buf[pos:])
                if _FIELD.fullmatch(line) is None:
                    raise bad_request("invalid request: bad chunk trailer")
        self._buf = bytes(buf[pos:])
        return None


class RequestBody:
    """A request body as its head frames it (Content-Length or chunked), fed incrementally, refusing
    more than ``limit`` bytes. Pure: the front door decides what to do with ``expect_continue``.

    Raises HttpError: 413 over ``limit`` (a declared length at once), 400 for bad chunk framing (the
    head's framing headers were checked by :func:`parse_head`).
    """

    __slots__ = ("body", "remaining", "decoder", "expect_continue")

    def __init__(self, head: RequestHead, limit: int) -> None:
        self.body = b""
        self.remaining = 0
        self.decoder: ChunkedDecoder | None = None
        if head.chunked:
            self.decoder = ChunkedDecoder(limit)
        elif head.content_length is not None:
            self.remaining = head.content_length
            if self.remaining > limit:
                raise HttpError(ENTITY_TOO_LARGE)
        expects_body = self.decoder is not None or self.remaining > 0
        # an HTTP/1.0 client's is ignored (RFC 9110 10.1.1: it may take a 100 for the final reply)
        self.expect_continue = expects_body and head.version != "1.0" and head.has_token(b"expect", b"100-continue")

    def feed(self, data: bytes) -> bytes | None:
        """Consume ``data``; once the body is complete (in ``body``), the bytes after it, else None."""
        decoder = self.decoder
        if decoder is not None:
            rest = decoder.feed(data)
            if rest is not None:
                self.body = bytes(decoder.body)
                self.decoder = None
            return rest
        need = self.remaining
        if len(data) <= need:
            self.body += data
            self.remaining = need - len(data)
            return None if self.remaining else b""
        self.body += data[:need]
        self.remaining = 0
        return data[need:]
