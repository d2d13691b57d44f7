"""The cyclic garbage collector's policy for a serving process: ``settle_gc()`` once it serves.

Why: at CPython's default gen0 threshold (700) a role under load ran ~120 young collections a second,
and a full one about once a second that walked every object its imports left behind (~50,000): 40-70 ms
with the GIL held, so every publish and delivery in flight stalled behind it, and ~40 us of CPU per
publish at 3,000/s (BENCHMARKS.md, "The garbage collector"). A request's objects die by reference count,
not by the collector, so a higher threshold finds the same cycles, only later; the objects alive once the
process serves (modules, the app, settings) are frozen out of every later collection.
``UPF_GC_TUNE=0`` keeps CPython's defaults, for a benchmark's same-run comparison.
"""

from __future__ import annotations

import gc
import os

__all__ = ["GC_THRESHOLDS", "settle_gc"]

# (gen0, gen1, gen2): gen0 counts container allocations net of frees, so 20,000 bounds the cyclic garbage
# waiting for a young collection to a few MB; the older generations keep CPython's ratios.
GC_THRESHOLDS = (20_000, 10, 10)


def settle_gc() -> bool:
    """Freeze what startup left and raise the thresholds; False (nothing changed) under UPF_GC_TUNE=0."""
    if os.environ.get("UPF_GC_TUNE", "1") == "0":
        return False
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return True
