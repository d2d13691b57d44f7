"""Thin I/O adapters for subscriber connections: a WebSocket one and a chunked-HTTP stream one.

Each adapter becomes the connection's asyncio Protocol once the request is routed
(``transport.set_protocol``), so an idle subscriber is just: the transport, this object (slots), its
Session and, for WebSocket, the ``websockets`` sans-I/O core (no extensions: permessage-deflate is
declined, it costs ~33 KB per connection). No task and no timer per connection: the hub's sweep
drives keepalives.

Overload contract: the transport's write buffer has high/low water marks (``WRITE_HIGH``,
``WRITE_LOW``). Crossing the high mark calls ``pause_writing``, which the hub turns into a
``write_paused`` session event: reading from the store stops, and the store is the buffer. So a slow
subscriber holds at most ``WRITE_HIGH`` plus one ``Send`` (one read batch, ``hub.READ_BATCH``
messages) in its socket buffer, plus at most one batch per topic of rows whose read was in flight
when it paused (held in the session). It is closed (aborted: a graceful close would wait on the
peer) after ``slow_subscriber_timeout_secs`` paused, and resumes with ``since=<last id>``.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import binascii
import codecs
import logging
from typing import TYPE_CHECKING

from websockets.datastructures import Headers, MultipleValuesError
from websockets.exceptions import InvalidHandshake
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import SEND_EOF, State
from websockets.server import ServerProtocol

from upf_edge.http11 import LAST_CHUNK, RequestHead, chunk, error_response, response_head
from upf_keyspace import Message

from . import framing
from .session import Session

if TYPE_CHECKING:
    from .hub import Hub

__all__ = ["WRITE_HIGH", "WRITE_LOW", "WS_MAX_FRAME", "Subscriber", "StreamSubscriber", "WsSubscriber", "ws_handshake"]

WRITE_HIGH = 64 * 1024
WRITE_LOW = 16 * 1024
WS_MAX_FRAME = 4096
"""Largest client frame accepted; clients send only pings, pongs and close frames (ntfy reads 64 bytes)."""

_ws_logger = logging.getLogger("upf.pusher.ws")
_STREAM_KINDS = {(name, chunked): name + "/chunked" if chunked else name for name in framing.ENCODERS for chunked in (False, True)}


class Subscriber(asyncio.Protocol, abc.ABC):
    """The parts every transport shares: the hub's callbacks for backpressure and disconnects."""

    __slots__ = ("hub", "session", "transport")

    transport_name = ""
    frame_kind = ""
    """Connections of one kind frame a message to identical bytes (``frame``)."""

    def __init__(self, hub: Hub, session: Session, transport: asyncio.Transport) -> None:
        self.hub = hub
        self.session = session
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.session!r})"

    # asyncio callbacks -------------------------------------------------------------------------------
    def pause_writing(self) -> None:
        self.hub.write_paused(self)

    def resume_writing(self) -> None:
        self.hub.write_resumed(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.hub.detach(self)

    def eof_received(self) -> bool:
        return False  # the peer half-closed: close our side too

    def data_received(self, data: bytes) -> None:
        pass  # a streaming client has nothing more to say

    # hub-facing --------------------------------------------------------------------------------------
    @abc.abstractmethod
    def accept(self) -> None:
        """Write the response head: the stream or the WebSocket starts now."""

    @abc.abstractmethod
    def frame(self, msg: Message) -> bytes:
        """``msg`` as the bytes this transport writes for it. Depends only on ``frame_kind``, so the hub
        frames a message once per kind and shares the bytes among connections."""

    @abc.abstractmethod
    def writable(self) -> bool:
        """Frames written now would reach the peer (the stream or WebSocket is open)."""

    def write(self, frames: list[bytes]) -> None:
        """Write already-framed bytes in one call (one send, not one per frame); the caller checked
        ``writable``."""
        if frames:
            self.transport.write(frames[0] if len(frames) == 1 else b"".join(frames))

    def send(self, messages: list[Message]) -> None:
        """Frame and write ``messages``."""
        if self.writable():
            self.write([self.frame(m) for m in messages])

    @abc.abstractmethod
    def close(self, reason: str) -> None:
        """End the stream (last chunk, or a WebSocket close frame) and the connection."""

    def fail(self, http: int, code: int, error: str) -> None:
        """Refuse the request before anything was written (e.g. the store is unreachable)."""
        if not self.transport.is_closing():
            self.transport.write(error_response(http, code, error))
            self.transport.close()


class StreamSubscriber(Subscriber):
    """/json, /sse and /raw: a chunked HTTP/1.1 response that never ends (or ends after a poll)."""

    __slots__ = ("frame_kind", "chunked", "transport_name", "accepted")

    def __init__(self, hub: Hub, session: Session, transport: asyncio.Transport, name: str, *, chunked: bool) -> None:
        super().__init__(hub, session, transport)
        self.transport_name = name
        self.frame_kind = _STREAM_KINDS[name, chunked]  # a shared string, not one per connection
        self.chunked = chunked
        self.accepted = False

    def accept(self) -> None:
        self.accepted = True
        headers = [
            (b"Content-Type", framing.CONTENT_TYPES[self.transport_name]),
            (b"Cache-Control", b"no-cache"),
            (b"Access-Control-Allow-Origin", b"*"),
            (b"X-Accel-Buffering", b"no"),
            (b"Connection", b"close"),
        ]
        if self.chunked:
            headers.append((b"Transfer-Encoding", b"chunked"))
        self.transport.write(response_head(200, headers))

    def frame(self, msg: Message) -> bytes:
        data = framing.ENCODERS[self.transport_name](msg)
        return chunk(data) if self.chunked else data

    def writable(self) -> bool:
        return not self.transport.is_closing()

    def close(self, reason: str) -> None:
        if self.transport.is_closing():
            return
        if reason == "slow":
            self.transport.abort()  # its buffer is full: a graceful close would wait on the peer
            return
        if self.chunked and self.accepted:
            self.transport.write(LAST_CHUNK)
        self.transport.close()


class WsSubscriber(Subscriber):
    """/ws: one text frame per event; pings are answered by the sans-I/O core."""

    __slots__ = ("ws", "head", "transport_name", "text")

    frame_kind = "ws"

    def __init__(self, hub: Hub, session: Session, transport: asyncio.Transport, ws: ServerProtocol, head: bytes) -> None:
        super().__init__(hub, session, transport)
        self.transport_name = "ws"
        self.ws = ws
        self.head: bytes | None = head
        self.text: codecs.IncrementalDecoder | None = None
        """The UTF-8 check of a text message fragmented over several frames (rare: None otherwise)."""

    def accept(self) -> None:
        head, self.head = self.head, None
        if head is not None:
            self.transport.write(head)

    def _flush(self) -> None:
        for data in self.ws.data_to_send():
            if data is SEND_EOF or data == SEND_EOF:
                self.transport.close()
                return
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        ws = self.ws
        ws.receive_data(data)
        for frame in ws.events_received():  # pings are answered inside the core; text is only checked
            if (frame.opcode is Opcode.TEXT or frame.opcode is Opcode.CONT) and not self._utf8(frame):
                ws.fail(CloseCode.INVALID_DATA, "invalid UTF-8")  # RFC 6455 8.1: close with 1007
                break
        self._flush()
        if ws.state is State.CLOSED or ws.close_expected():
            self.transport.close()

    def _utf8(self, frame: Frame) -> bool:
        """Whether a text frame keeps its message valid UTF-8 (fragments are checked across frames)."""
        if frame.opcode is Opcode.TEXT:
            if frame.fin:
                try:
                    frame.data.decode("utf-8")
                    return True
                except UnicodeDecodeError:
                    return False
            self.text = codecs.getincrementaldecoder("utf-8")()
        decoder = self.text
        if decoder is None:
            return True  # a continuation of a binary message
        if frame.fin:
            self.text = None
        try:
            decoder.decode(frame.data, final=frame.fin)
            return True
        except UnicodeDecodeError:
            return False

    def eof_received(self) -> bool:
        self.ws.receive_eof()
        return False

    def frame(self, msg: Message) -> bytes:
        # Server frames are unmasked and, with no extension negotiated, carry no per-connection state:
        # written straight to the transport they are exactly what the sans-I/O core's send_text emits.
        return framing.ws_frame(msg)  # a keepalive is a ping frame, as ntfy sends it

    def writable(self) -> bool:
        return self.ws.state is State.OPEN and not self.transport.is_closing()

    def close(self, reason: str) -> None:
        if self.transport.is_closing():
            return
        if reason == "slow":
            self.transport.abort()
            return
        if self.head is None and self.ws.state is State.OPEN:
            self.ws.send_close(1001 if reason == "shutdown" else 1000)
            for data in self.ws.data_to_send():
                if data != SEND_EOF:
                    self.transport.write(data)
        self.transport.close()


def ws_handshake(head: RequestHead) -> tuple[ServerProtocol, bytes]:
    """Validate a WebSocket upgrade and build the 101 head; no extensions are ever negotiated.

    Raises InvalidHandshake when the request is not a valid handshake.
    """
    headers = Headers()
    for k, v in head.headers:
        headers[k.decode("latin-1")] = v.decode("latin-1")
    ws = ServerProtocol(state=State.OPEN, max_size=WS_MAX_FRAME, logger=_ws_logger)
    try:
        key = headers.get("Sec-WebSocket-Key", "")
        if len(base64.b64decode(key.encode(), validate=True)) != 16:
            raise InvalidHandshake("bad Sec-WebSocket-Key")
    except (binascii.Error, ValueError, MultipleValuesError):  # two keys: RFC 6455 wants exactly one
        raise InvalidHandshake("bad Sec-WebSocket-Key") from None
    request = Request(head.path, headers, method=head.method, protocol="HTTP/" + head.version)
    accept, _extensions, _protocol = ws.process_request(request)
    ws.extensions = []
    out = response_head(
        101,
        [(b"Upgrade", b"websocket"), (b"Connection", b"Upgrade"), (b"Sec-WebSocket-Accept", accept.encode("ascii"))],
    )
    return ws, out
