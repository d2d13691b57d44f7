"""Thin I/O adapters for subscriber connections: a WebSocket one and a chunked-HTTP stream one.

Each adapter becomes the connection's asyncio Protocol once the request is routed
(``transport.set_protocol``), so an idle subscriber is just: the transport, this object (slots) and
its Session. A WebSocket's ``websockets`` sans-I/O core (its parser generators, reader and id, ~1.3 KB)
exists only while the peer's bytes are mid-frame, mid-message or closing: between frames it is
dropped and the next read starts a fresh one, which at a frame boundary is the same state. No
extensions are negotiated (permessage-deflate is declined, it costs ~33 KB per connection). No task
and no timer per connection: the hub's sweep drives keepalives.

Overload contract: the transport's write buffer has high/low water marks (``WRITE_HIGH``,
``WRITE_LOW``). Crossing the high mark calls ``pause_writing``, which the hub turns into a
``write_paused`` session event: reading from the store stops, and the store is the buffer. So a slow
subscriber holds at most ``WRITE_HIGH`` plus one ``Send`` (one read's rows: a few batches at most,
``Session.limit``) in its socket buffer, plus the rows of the reads in flight when it paused (held in
the session, as many again). It is closed (aborted: a graceful close would wait on the peer) after
``slow_subscriber_timeout_secs`` paused, and resumes with ``since=<last id>``.

Kernel memory: each subscriber socket's send buffer is fixed at ``send_buffer_bytes`` (SO_SNDBUF; the
kernel's autotuning would otherwise grow it to several MB for a peer that does not read), and a
connection cut as slow is reset (SO_LINGER 0, then close): its queued bytes are dropped at once instead
of sitting in FIN-WAIT-1 for minutes.

A WebSocket peer can make the server work and write without reading (pings). Its frames have a budget
(``FRAME_BURST``, then ``frame_refill``; beyond it, close 1008); of the pongs owed at most one
is ever pending (RFC 6455 5.5.3 allows answering only the latest ping); and while the write buffer is
above its high-water mark, or a pong is owed, the connection is not read at all (``pause_reading``) and
the session counts as paused, so a peer that pings but never reads is cut as slow like any other.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import binascii
import codecs
import contextlib
import logging
import socket
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from websockets.datastructures import Headers, MultipleValuesError
from websockets.exceptions import InvalidHandshake
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import SEND_EOF, State
from websockets.server import ServerProtocol

from upf_edge.errors import Problem
from upf_edge.http11 import LAST_CHUNK, RequestHead, chunk, error_response, response_head
from upf_edge.limits_os import PeerCounter
from upf_keyspace import Message

from . import framing
from .session import Session

if TYPE_CHECKING:
    from .hub import Hub

__all__ = [
    "WRITE_HIGH",
    "WRITE_LOW",
    "WS_MAX_FRAME",
    "KeptAlive",
    "Subscriber",
    "StreamSubscriber",
    "WsSubscriber",
    "ws_handshake",
]

_OPEN, _CLOSED = State.OPEN, State.CLOSED
"""Read per delivery: in 3.11 ``State.OPEN`` goes through the enum metaclass's ``__getattr__`` hook (~850 instructions)."""

WRITE_HIGH = 64 * 1024
WRITE_LOW = 16 * 1024
WS_MAX_FRAME = 4096
"""Largest client frame accepted; clients send only pings, pongs and close frames (ntfy reads 64 bytes)."""

_ws_logger = logging.getLogger("upf.pusher.ws")
_monotonic = time.monotonic
_OP_PONG = 0x8A
"""First byte of a server pong frame (FIN, opcode 0xA); server frames are unmasked, one per write."""
_LINGER_RESET = struct.pack("ii", 1, 0)
_HELD_WRITE = 1
_HELD_PONG = 2
FRAME_BURST = 64
FRAME_REFILL_PER_SEC = 2.0
"""A client may send FRAME_BURST frames at once, then this many a second (plus the pongs our keepalive
pings ask for: ``frame_refill``); beyond, it is closed with 1008. ntfy's clients send a ping a minute at
most: a flood of pings costs the server ~3.6 us of parsing each (~0.8 s of CPU per second at loopback
speed) and is cut after its first read instead."""


def frame_refill(keepalive_secs: float) -> float:
    """Client frames a second a WebSocket's budget refills: ``FRAME_REFILL_PER_SEC`` and one for each of
    our keepalive pings. Why: a client that answers every ping (as RFC 6455 asks) would otherwise
    spend the budget at a keepalive under 0.5 s and be closed for doing what it must."""
    return FRAME_REFILL_PER_SEC + 1.0 / keepalive_secs


PONG_CHECK_SECS = 0.1
"""How often a connection owing a pong checks whether the previous one has left (rare: flooders only)."""
WS_PONG_WAIT_SECS = 15.0
"""ntfy's wsPongWait: a WebSocket peer that sent nothing, not even the pong of a keepalive ping, for
the keepalive interval plus this is gone (a phone off the network, a NAT that forgot the flow)."""


def bound_send_buffer(transport: asyncio.BaseTransport, size: int) -> None:
    """Fix the socket's kernel send buffer at ``size`` bytes (0: leave the kernel's autotuning)."""
    sock = transport.get_extra_info("socket")
    if size > 0 and sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


def reset(transport: asyncio.Transport) -> None:
    """Abortive close: the kernel drops whatever is still queued and sends RST (no FIN-WAIT-1)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    transport.abort()


_PENDING_MAX = 64 * 1024
"""Bytes a keep-alive poll keeps of the requests pipelined behind it before it stops reading."""


class KeptAlive:
    """A poll on a keep-alive connection: the requests pipelined behind it, whether the peer reads
    the reply (``paused``: above the write buffer's high mark), whether the peer has half-closed
    (``eof``), and where the connection goes when the poll's reply has ended (``take(transport,
    pipelined, paused, eof)``, the front door's parser)."""

    __slots__ = ("take", "pipelined", "paused", "eof")

    def __init__(self, take: Callable[[asyncio.Transport, bytes, bool, bool], None]) -> None:
        self.take = take
        self.pipelined = b""
        self.paused = False
        self.eof = False


_STREAM_KINDS = {
    (name, chunked): name + "/chunked" if chunked else name for name in framing.ENCODERS for chunked in (False, True)
}


class Subscriber(asyncio.Protocol, abc.ABC):
    """The parts every transport shares: the hub's callbacks for backpressure and disconnects."""

    __slots__ = ("hub", "session", "transport", "peers", "peer")

    transport_name = ""
    frame_kind = ""
    """Connections of one kind frame a message to identical bytes (``frame``)."""

    def __init__(self, hub: Hub, session: Session, transport: asyncio.Transport) -> None:
        self.hub = hub
        self.session = session
        self.transport = transport
        self.peers: PeerCounter | None = None
        self.peer = ""
        """Set when this connection counts against its address's connection cap (released when it goes)."""
        transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)
        bound_send_buffer(transport, hub.settings.subscriber_send_buffer_bytes)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.session!r})"

    # asyncio callbacks -------------------------------------------------------------------------------
    def pause_writing(self) -> None:
        self.hub.write_paused(self)

    def resume_writing(self) -> None:
        self.hub.write_resumed(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peers is not None:
            self.peers.release(self.peer)
            self.peers = None
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

    def silent(self, now: float) -> bool:
        """The peer has said nothing for longer than a live one would (``now``: ``time.monotonic()``);
        a stream's client says nothing by design, so only a WebSocket can be."""
        return False

    def write(self, frames: list[bytes]) -> None:
        """Write already-framed bytes in one call (one send, not one per frame); the caller checked
        ``writable``."""
        if frames:
            self.transport.write(frames[0] if len(frames) == 1 else b"".join(frames))

    def write_one(self, data: bytes) -> None:
        """``write([data])`` without the list: most deliveries are one message to one connection."""
        self.transport.write(data)

    def send(self, messages: list[Message]) -> None:
        """Frame and write ``messages``."""
        if self.writable():
            self.write([self.frame(m) for m in messages])

    @abc.abstractmethod
    def close(self, reason: str) -> None:
        """End the stream (last chunk, or a WebSocket close frame) and the connection."""

    def fail(self, problem: Problem) -> None:
        """Refuse the request before anything was written (e.g. the store is unreachable)."""
        if not self.transport.is_closing():
            self.transport.write(error_response(problem))
            self.transport.close()


class StreamSubscriber(Subscriber):
    """/json, /sse and /raw: a chunked HTTP/1.1 response that never ends (or ends after a poll).

    A poll on an HTTP/1.1 keep-alive connection (``kept``) ends its reply with the last chunk and gives
    the connection back to the front door for the next request, as ntfy does: a client polling topic
    after topic (the ntfy app's poll worker) does not pay a connection per poll."""

    __slots__ = ("frame_kind", "chunked", "transport_name", "accepted", "kept")

    def __init__(self, hub: Hub, session: Session, transport: asyncio.Transport, name: str, *, chunked: bool) -> None:
        super().__init__(hub, session, transport)
        self.transport_name = name
        self.frame_kind = _STREAM_KINDS[name, chunked]  # a shared string, not one per connection
        self.chunked = chunked
        self.accepted = False
        self.kept: KeptAlive | None = None
        """Set by the front door for a chunked poll whose client keeps the connection (None otherwise)."""

    def accept(self) -> None:
        self.accepted = True
        head = _POLL_HEAD if self.kept is not None else _STREAM_HEAD if self.chunked else _STREAM_HEAD_10
        self.transport.write(head[self.transport_name])

    def pause_writing(self) -> None:
        if self.kept is not None:
            self.kept.paused = True
        super().pause_writing()

    def resume_writing(self) -> None:
        if self.kept is not None:
            self.kept.paused = False
        super().resume_writing()

    def eof_received(self) -> bool:
        """A poll's reply is finished first, as ntfy's (the client asked for every message it holds);
        a stream ends now."""
        if not self.session.poll:
            return False
        if self.kept is not None:
            self.kept.eof = True  # its pipelined requests are served, then the connection closes
        return True

    def data_received(self, data: bytes) -> None:
        kept = self.kept
        if kept is None:
            return  # a streaming client has nothing more to say
        kept.pipelined += data  # the next requests: parsed once the poll's reply has ended
        if len(kept.pipelined) > _PENDING_MAX:
            self.transport.pause_reading()

    def frame(self, msg: Message) -> bytes:
        data = framing.ENCODERS[self.transport_name](msg)
        return chunk(data) if self.chunked else data

    def writable(self) -> bool:
        return not self.transport.is_closing()

    def close(self, reason: str) -> None:
        if self.transport.is_closing():
            return
        if reason == "slow" or (reason == "denied" and self.session.paused):
            reset(self.transport)  # its buffer is full: a graceful close would wait on the peer
            return
        if self.chunked and self.accepted:
            self.transport.write(LAST_CHUNK)
            self.accepted = False  # the reply has ended: a second close must not end it again
        if reason == "done" and self.kept is not None:
            # Not from inside the hub's round that finished the poll: on the loop's next turn.
            asyncio.get_running_loop().call_soon(self._hand_back)
            return
        self.transport.close()

    def _hand_back(self) -> None:
        kept, self.kept = self.kept, None
        if kept is None or self.transport.is_closing():
            return  # closed meanwhile (shutdown, or the peer left): connection_lost forgets it
        self.hub.detach(self)
        self.peers = None  # the connection's count against its address's cap goes with it
        self.transport.resume_reading()
        kept.take(self.transport, kept.pipelined, kept.paused, kept.eof)


def _stream_heads(*extra: tuple[bytes, bytes]) -> dict[str, bytes]:
    return {
        name: response_head(
            200,
            [
                (b"Content-Type", framing.CONTENT_TYPES[name]),
                (b"Cache-Control", b"no-cache"),
                (b"Access-Control-Allow-Origin", b"*"),
                (b"X-Accel-Buffering", b"no"),
                *extra,
            ],
        )
        for name in framing.CONTENT_TYPES
    }


_STREAM_HEAD = _stream_heads((b"Connection", b"close"), (b"Transfer-Encoding", b"chunked"))
_STREAM_HEAD_10 = _stream_heads((b"Connection", b"close"))
_POLL_HEAD = _stream_heads((b"Transfer-Encoding", b"chunked"))
"""A keep-alive poll's head: no ``Connection: close``."""


class WsSubscriber(Subscriber):
    """/ws: one text frame per event; pings are answered by the sans-I/O core, at most one pong pending."""

    __slots__ = (
        "ws",
        "unparsed",
        "head",
        "transport_name",
        "text",
        "out",
        "pong_end",
        "owed",
        "held",
        "budget",
        "budget_at",
    )

    frame_kind = "ws"

    def __init__(self, hub: Hub, session: Session, transport: asyncio.Transport, head: bytes) -> None:
        super().__init__(hub, session, transport)
        self.transport_name = "ws"
        self.ws: ServerProtocol | None = None
        """The sans-I/O core while the peer is mid-frame, mid-message or closing; None between frames."""
        self.unparsed = 0
        """Bytes fed to ``ws`` that no complete frame has accounted for yet: 0 means a frame boundary."""
        self.head: bytes | None = head
        self.text: codecs.IncrementalDecoder | None = None
        """The UTF-8 check of a text message fragmented over several frames (rare: None otherwise)."""
        self.out = 0
        """Bytes handed to the transport so far; ``out - get_write_buffer_size()`` have left user space."""
        self.pong_end = 0
        """``out`` just after the last pong written: that pong is still pending while fewer have left."""
        self.owed: bytes | None = None
        """The latest ping's pong, held back while the previous one is pending."""
        self.held = 0
        """Why reading is paused: ``_HELD_WRITE`` (above the high-water mark), ``_HELD_PONG`` (a pong owed)."""
        self.budget: float = FRAME_BURST
        """Client frames it may still send now (a token bucket: ``hub.frame_refill``, up to ``FRAME_BURST``)."""
        self.budget_at = 0.0

    def accept(self) -> None:
        head, self.head = self.head, None
        if head is not None:
            self.write_one(head)
        self.budget_at = _monotonic()  # the last time the peer was heard from (``_spend`` moves it)
        ws = self.ws
        if ws is not None:  # frames came before the 101 (``data_received``): answered after it
            self._received(ws)
            if not self.held and not self.transport.is_closing():
                self.transport.resume_reading()

    def silent(self, now: float) -> bool:
        return self.head is None and now - self.budget_at > self.hub.settings.keepalive_secs + WS_PONG_WAIT_SECS

    def write_one(self, data: bytes) -> None:
        self.out += len(data)
        self.transport.write(data)

    def write(self, frames: list[bytes]) -> None:
        if frames:
            data = frames[0] if len(frames) == 1 else b"".join(frames)
            self.out += len(data)  # ``write_one``, inline: once per write
            self.transport.write(data)

    # Reading stops while the peer does not read: above the high-water mark, or with a pong pending and
    # another owed. The session sees both as a paused write, so the slow-subscriber cut applies to both.
    def pause_writing(self) -> None:
        self._hold(_HELD_WRITE)

    def resume_writing(self) -> None:
        self._release(_HELD_WRITE)

    def _hold(self, why: int) -> None:
        if not self.held:
            self.transport.pause_reading()
            self.held = why
            self.hub.write_paused(self)
        self.held |= why

    def _release(self, why: int) -> None:
        if not self.held & why:
            return
        self.held &= ~why
        if not self.held:
            if not self.transport.is_closing():
                self.transport.resume_reading()
            self.hub.write_resumed(self)

    def _pong_pending(self) -> bool:
        return self.pong_end > self.out - self.transport.get_write_buffer_size()

    def _pong(self, data: bytes) -> None:
        """Write a pong, or owe it (replacing an older one owed) while the previous is still pending."""
        if self.owed is None and not self._pong_pending():
            self.write_one(data)
            self.pong_end = self.out
            return
        if self.owed is None:
            asyncio.get_running_loop().call_later(PONG_CHECK_SECS, self._check_pong)
        self.owed = data
        self._hold(_HELD_PONG)

    def _check_pong(self) -> None:
        if self.transport.is_closing() or self.owed is None:
            return
        if self._pong_pending():
            asyncio.get_running_loop().call_later(PONG_CHECK_SECS, self._check_pong)
            return
        data, self.owed = self.owed, None
        self.write_one(data)
        self.pong_end = self.out
        self._release(_HELD_PONG)

    def _core(self) -> ServerProtocol:
        ws = self.ws
        if ws is None:
            ws = self.ws = _SPARE_CORES.pop() if _SPARE_CORES else _ws_core()
            self.unparsed = 0
        return ws

    def _flush(self, ws: ServerProtocol) -> None:
        """Write what the core has to send; of the pongs, only the latest (RFC 6455 5.5.3)."""
        out = ws.data_to_send()
        pong = -1
        for i, data in enumerate(out):
            if data and data[0] == _OP_PONG:
                pong = i
        for i, data in enumerate(out):
            if data is SEND_EOF or data == SEND_EOF:
                self.transport.close()
                return
            if data and data[0] == _OP_PONG:
                if i == pong:
                    self._pong(data)
            else:
                self.write_one(data)

    def data_received(self, data: bytes) -> None:
        if self.ws is None and framing.is_client_pong(data) and self._spend(1):
            # An idle connection's answer to our keepalive, read whole: a core would parse it, check it
            # and do nothing (a pong asks nothing; we track no pings). Over the frame budget, the core
            # below spends it again and fails the connection, as for any frame.
            return
        ws = self._core()
        ws.receive_data(data)
        self.unparsed += len(data)
        if self.head is not None:
            # Sent before our 101 (pipelined behind the upgrade, or while the store resolves the
            # subscription): its answers (a pong, a close) must not precede the 101, so the core keeps
            # them and reading stops; accept() writes the 101, then takes them.
            self.transport.pause_reading()
            return
        self._received(ws)

    def _received(self, ws: ServerProtocol) -> None:
        """Act on what the core parsed: the frame budget, the UTF-8 check, its answers, its release."""
        frames: list[Frame] = ws.events_received()  # type: ignore[assignment]  # after the handshake, only frames
        unparsed = self.unparsed
        for frame in frames:  # a frame sent with a longer length than needed only keeps the core held
            unparsed -= framing.ws_client_frame_size(len(frame.data))
        self.unparsed = unparsed
        if frames and not self._spend(len(frames)):
            ws.fail(CloseCode.POLICY_VIOLATION, "too many frames")  # each costs parsing; ntfy clients send ~none
            frames = []
        for frame in frames:  # pings are answered inside the core; text is only checked
            if (frame.opcode is Opcode.TEXT or frame.opcode is Opcode.CONT) and not self._utf8(frame):
                ws.fail(CloseCode.INVALID_DATA, "invalid UTF-8")  # RFC 6455 8.1: close with 1007
                break
        self._flush(ws)
        if ws.state is _CLOSED or ws.close_expected():
            self.transport.close()
        elif not unparsed and ws.state is _OPEN and ws.current_size is None and not ws.reader.buffer:
            # Every byte read is in a complete frame and no message is open: a fresh core is in this
            # very state, so the idle connection need not hold this one, and the next read may take it.
            self.ws = None
            if len(_SPARE_CORES) < _SPARE_MAX:
                _SPARE_CORES.append(ws)

    def _spend(self, n: int) -> bool:
        """Take ``n`` frames from the budget; False when the peer sends faster than the bucket allows."""
        now = _monotonic()
        self.budget = min(FRAME_BURST, self.budget + (now - self.budget_at) * self.hub.frame_refill) - n
        self.budget_at = now
        return self.budget >= 0

    def _utf8(self, frame: Frame) -> bool:
        """Whether a text frame keeps its message valid UTF-8 (fragments are checked across frames)."""
        if frame.opcode is Opcode.TEXT:
            if frame.fin:
                try:
                    str(frame.data, "utf-8")  # the data is any bytes-like: str() decodes them all
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
        if self.ws is not None:
            self.ws.receive_eof()
        return False

    # Server frames are unmasked and, with no extension negotiated, carry no per-connection state:
    # written straight to the transport they are exactly what the sans-I/O core's send_text emits. A
    # keepalive is a ping frame, as ntfy sends it. ``framing.ws_frame`` itself, not a method calling
    # it: the hub frames one message per delivery.
    frame = staticmethod(framing.ws_frame)

    def writable(self) -> bool:
        return (self.ws is None or self.ws.state is _OPEN) and not self.transport.is_closing()

    def close(self, reason: str) -> None:
        if self.transport.is_closing():
            return
        if reason == "slow" or reason == "silent" or (reason == "denied" and self.session.paused):
            reset(self.transport)  # a graceful close would wait on a peer that is not there, or not reading
            return
        if self.head is None:
            ws = self._core()
            if ws.state is _OPEN:
                ws.send_close(_CLOSE_CODES.get(reason, 1000))
                for data in ws.data_to_send():
                    if data != SEND_EOF:
                        self.write_one(data)
        self.transport.close()


_CLOSE_CODES = {"shutdown": 1001, "denied": 1008}
"""RFC 6455 close codes by ``Close`` reason: going away, policy violation (access revoked); else normal."""

_SPARE_CORES: list[ServerProtocol] = []
"""Cores dropped at a frame boundary, in a fresh core's state: a pong every keepalive per connection
would otherwise build one each time (~6 us: its parser, reader and a random id)."""
_SPARE_MAX = 64


def _ws_core() -> ServerProtocol:
    """A sans-I/O core for an open connection with no extension, waiting for a frame."""
    ws = ServerProtocol(state=_OPEN, max_size=WS_MAX_FRAME, logger=_ws_logger)
    ws.debug = False  # its DEBUG lines print frames (topics, message bodies): never logged, at any level
    ws.extensions = []
    return ws


def ws_handshake(head: RequestHead) -> bytes:
    """Validate a WebSocket upgrade and build the 101 head; no extensions are ever negotiated.

    Raises InvalidHandshake when the request is not a valid handshake.
    """
    headers = Headers()
    for k, v in head.headers:
        headers[k.decode("latin-1")] = v.decode("latin-1")
    ws = _ws_core()
    try:
        key = headers.get("Sec-WebSocket-Key", "")
        if len(base64.b64decode(key.encode(), validate=True)) != 16:
            raise InvalidHandshake("bad Sec-WebSocket-Key")
    except (binascii.Error, ValueError, MultipleValuesError):  # two keys: RFC 6455 wants exactly one
        raise InvalidHandshake("bad Sec-WebSocket-Key") from None
    request = Request(head.path, headers, method=head.method, protocol="HTTP/" + head.version)
    accept, _extensions, _protocol = ws.process_request(request)
    return response_head(
        101,
        [(b"Upgrade", b"websocket"), (b"Connection", b"Upgrade"), (b"Sec-WebSocket-Accept", accept.encode("ascii"))],
    )
