"""Bytes over a plain socket, for requests no HTTP client will send (malformed heads, smuggling)."""

from __future__ import annotations

import socket


def exchange(port: int, data: bytes, *, quiet_secs: float = 5.0, half_close: bool = False) -> tuple[bytes, bool]:
    """Send ``data`` (then, with ``half_close``, shut our sending side: the server reads its end);
    read until the server closes (True) or goes quiet for ``quiet_secs`` (False)."""
    with socket.create_connection(("127.0.0.1", port), timeout=quiet_secs) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while True:
                c = s.recv(65536)
                if not c:
                    return b"".join(chunks), True
                chunks.append(c)
        except TimeoutError:
            return b"".join(chunks), False
        except ConnectionResetError:
            return b"".join(chunks), True
