"""The event loop every UPF process runs: uvloop unless ``UPF_UVLOOP=0``.

Why: the roles spend most of their CPU in the loop's own machinery (socket callbacks, handles, futures);
uvloop does that in C. ``UPF_UVLOOP=0`` keeps the standard loop, for a benchmark's same-run comparison
or a platform uvloop does not support (it is then not installed, and the standard loop is used too).
"""

from __future__ import annotations

import asyncio
import os

__all__ = ["install_loop_policy"]


def install_loop_policy() -> str:
    """Install uvloop's policy when wanted and installed; returns the loop's name (for the start log)."""
    if os.environ.get("UPF_UVLOOP", "1") == "0":
        return "asyncio"
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"
