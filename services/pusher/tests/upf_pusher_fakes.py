"""Fakes for the pusher's unit tests: a transport that records what is written, and a hub that records
what a connection told it. One copy for every test that drives a subscriber without a socket."""

from __future__ import annotations

import asyncio

from upf_keyspace import Settings
from upf_pusher.transports import frame_refill


class FakeTransport(asyncio.Transport):
    """Records writes. ``drains``: the fake kernel takes every write at once (the buffer stays empty);
    otherwise ``unsent`` grows with each write until the test empties it, as a peer that reads."""

    def __init__(self, *, drains: bool = True) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.drains = drains
        self.unsent = 0
        """What the fake kernel has not taken yet: the user-space write buffer."""
        self.reading = True
        self.closed = False
        self.aborted = False

    @property
    def data(self) -> bytes:
        return b"".join(self.written)

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.written.append(bytes(data))
        if not self.drains:
            self.unsent += len(data)

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True
        self.aborted = True


class FakeHub:
    """The part of the hub a subscriber calls back: flow-control events and detaches, recorded."""

    def __init__(self) -> None:
        self.settings = Settings()
        self.frame_refill = frame_refill(self.settings.keepalive_secs)
        self.events: list[str] = []
        self.detached = 0

    def write_paused(self, sub: object) -> None:
        self.events.append("paused")

    def write_resumed(self, sub: object) -> None:
        self.events.append("resumed")

    def detach(self, sub: object) -> None:
        self.detached += 1
