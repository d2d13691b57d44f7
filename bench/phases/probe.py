"""probe: the size of the WebSocket frame UPF delivers for loadgen's 100-byte bodies."""

from __future__ import annotations

import asyncio
from pathlib import Path

from harness import BODY, Shape


def phase_probe(work: Path) -> int:
    """The length of the text frame UPF's pusher sends for one loadgen-sized publish (14-char topic)."""
    import httpx
    from websockets.asyncio.client import connect

    shape = Shape("allinone", work)
    try:

        async def go() -> int:
            port = shape.writer.rsplit(":", 1)[1]
            async with connect(f"ws://127.0.0.1:{port}/upPROBEabc00001/ws", compression=None) as ws:
                await ws.recv()  # open
                body = ("lg:0:1764450000000000000:" + "abcdefghijklmnopqrstuvwxyz0123456789" * 3)[:BODY]
                async with httpx.AsyncClient() as c:
                    r = await c.post(
                        f"{shape.writer}/upPROBEabc00001", content=body, headers={"content-type": "text/plain"}
                    )
                    r.raise_for_status()
                m = await asyncio.wait_for(ws.recv(), 10)
                return len(m.encode() if isinstance(m, str) else m)

        return asyncio.run(go())
    finally:
        shape.stop()
