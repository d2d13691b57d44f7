"""The open-files limit helper raises the soft limit to the hard one and logs what is in force."""

from __future__ import annotations

import logging
import resource

import pytest

from upf_edge.limits_os import raise_open_files_limit


@pytest.fixture
def lowered_soft_limit():
    """This process's soft limit lowered (as a default 1024 would be), restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
    yield hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_soft_limit_is_raised_to_the_hard_limit(lowered_soft_limit, caplog) -> None:
    hard = lowered_soft_limit
    if hard == resource.RLIM_INFINITY:
        pytest.skip("the hard limit is unlimited here: the soft limit is left as it is")
    with caplog.at_level(logging.INFO, logger="upf.edge.limits"):
        assert raise_open_files_limit() == (hard, hard)
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    [record] = [r for r in caplog.records if r.name == "upf.edge.limits"]
    assert record.getMessage() == "open files limit" and (record.soft, record.hard) == (hard, hard)


def test_peer_counter_caps_each_address_and_frees_on_release() -> None:
    from upf_edge.limits_os import PeerCounter

    c = PeerCounter(2, ("10.0.0.0/8",))
    assert [c.acquire("192.0.2.1") for _ in range(3)] == [True, True, False]
    assert c.acquire("192.0.2.2")  # another address has its own count
    c.release("192.0.2.1")
    assert c.acquire("192.0.2.1") and not c.acquire("192.0.2.1")
    assert all(c.acquire("10.1.2.3") for _ in range(10))  # exempt: never counted
    assert "10.1.2.3" not in c.open
    assert c.acquire("") and c.acquire("not-an-ip")  # no IP (a Unix socket): local
    for _ in range(2):
        c.release("192.0.2.1")
    c.release("192.0.2.2")
    assert c.open == {}  # nothing left behind for addresses that went away
    assert all(PeerCounter(0, ()).acquire("192.0.2.9") for _ in range(1000))  # 0: no cap


async def test_acceptor_pauses_when_out_of_descriptors_and_logs_once(caplog) -> None:
    import asyncio
    import errno
    import logging
    import socket

    from upf_edge import limits_os

    class Refusing:
        """A listening socket out of descriptors: every accept fails with EMFILE, readable stays true."""

        def __init__(self) -> None:
            self.real = socket.create_server(("127.0.0.1", 0))
            self.accepts = 0

        def fileno(self) -> int:
            return self.real.fileno()

        def setblocking(self, flag: bool) -> None:
            self.real.setblocking(flag)

        def accept(self):  # type: ignore[no-untyped-def]
            self.accepts += 1
            raise OSError(errno.EMFILE, "Too many open files")

        def close(self) -> None:
            self.real.close()

    sock = Refusing()
    loop = asyncio.get_running_loop()
    client = socket.create_connection(sock.real.getsockname())  # keeps the listening socket readable
    acceptor = limits_os.Acceptor(loop, sock, asyncio.Protocol)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="upf.edge.limits"):
        acceptor.start()
        await asyncio.sleep(limits_os.ACCEPT_BACKOFF_SECS * 2.5)
    acceptor.close()
    client.close()
    assert 2 <= sock.accepts <= 4  # one attempt per backoff period, not a busy loop
    assert [r.getMessage() for r in caplog.records] == ["accept paused: out of descriptors"]


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_request_that_arrived_before_accepting_stopped_gets_its_reply(loop_kind: str) -> None:
    """A stop can close the acceptor after a connection's request arrived but before the task that
    made its transport finished (uvloop delivers the data first). Cancelling that task made uvloop
    close the socket under the request: a publish was stored and its reply lost (seen in the rolling
    restart test). The connection must be left to its protocol, which answers."""
    import asyncio
    import socket
    from typing import cast

    import uvloop

    from upf_edge import limits_os

    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        server = socket.create_server(("127.0.0.1", 0))
        address = server.getsockname()
        acceptor: limits_os.Acceptor

        class Handler(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a registered subclass

            def data_received(self, data: bytes) -> None:
                acceptor.close()  # the stop, in the loop iteration that read the request
                loop.call_later(0.05, self.reply)  # the handler's store call

            def reply(self) -> None:
                if not self.transport.is_closing():
                    self.transport.write(b"stored")

        acceptor = limits_os.Acceptor(loop, server, Handler)
        acceptor.start()
        reader, writer = await asyncio.open_connection(*address)
        writer.write(b"publish")
        try:
            return await asyncio.wait_for(reader.read(100), 5)
        finally:
            writer.close()
            await acceptor.wait_closed()

    run = uvloop.run if loop_kind == "uvloop" else asyncio.run
    assert run(main()) == b"stored"
