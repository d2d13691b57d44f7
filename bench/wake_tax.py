"""What this host charges for waking: the same Python work timed right after a sleep and run back to back.

Why: at 2,000 publishes/s UPF's processes sleep between requests, and each publish and delivery cost
about twice the CPU they cost at saturation, although ``bench/instr_writer.py --gap`` counts about the
same instructions per publish either way (BENCHMARKS.md, forty-fourth pass). On a virtual machine a
vCPU that idles can lose its caches to other guests and come back slower; how much is the host's, and
it moves with the hour. This prices it, so that a run's CPU figures at a moderate rate can be read
against it. Not part of bench/run.py.

Each round, on one CPU (0 unless ``--cpu``), for each sleep (0, 0.5, 2 and 10 ms): sleep, then run a
unit of interpreter work (~45 us here: small objects, a method call each, dict stores, a bytes join)
``--units`` times in a row, each timed by the thread's CPU clock. It prints, per sleep, the first
unit's CPU and the later units' mean, in us (medians over rounds), and each over the units' mean with
no sleep.

    python3 -m uv run python bench/wake_tax.py
    python3 -m uv run python bench/wake_tax.py --rounds 5 --reps 600
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

SLEEPS_MS = (0.0, 0.5, 2.0, 10.0)


class _Item:
    __slots__ = ("n", "tag")

    def __init__(self, n: int, tag: bytes) -> None:
        self.n = n
        self.tag = tag

    def key(self) -> bytes:
        return self.tag + self.n.to_bytes(4, "big")


def unit(n: int = 120) -> int:
    """A slice of the kind of work a request does: small objects, dicts, bytes, calls."""
    seen: dict[int, bytes] = {}
    parts = []
    total = 0
    for i in range(n):
        item = _Item(i, b"t")
        k = item.key()
        seen[i & 31] = k
        parts.append(k)
        total += i * i
    return total + len(b"".join(parts)) + len(seen)


def one_sleep(sleep_s: float, units: int, reps: int) -> list[float]:
    """Mean CPU us of each position 0..units-1 after ``sleep_s``, over ``reps`` repetitions."""
    acc = [0] * units
    clock = time.thread_time_ns
    for _ in range(reps):
        if sleep_s:
            time.sleep(sleep_s)
        for k in range(units):
            t0 = clock()
            unit()
            acc[k] += clock() - t0
    return [a / reps / 1000 for a in acc]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=400, help="sleeps per sleep length and round")
    ap.add_argument("--units", type=int, default=8, help="units run back to back after each sleep")
    ap.add_argument("--cpu", type=int, default=0)
    a = ap.parse_args()
    if a.rounds < 1 or a.reps < 1 or a.units < 2:
        ap.error("--rounds and --reps are at least 1, --units at least 2")
    if a.cpu not in os.sched_getaffinity(0):
        ap.error(f"CPU {a.cpu} is not one this process may run on")
    os.sched_setaffinity(0, {a.cpu})
    unit()  # warm: the specialised bytecode, the allocator's pools
    first: dict[float, list[float]] = {s: [] for s in SLEEPS_MS}
    rest: dict[float, list[float]] = {s: [] for s in SLEEPS_MS}
    for _ in range(a.rounds):
        for s in SLEEPS_MS:
            costs = one_sleep(s / 1000, a.units, a.reps)
            first[s].append(costs[0])
            rest[s].append(statistics.fmean(costs[1:]))
    steady = statistics.median(rest[0.0])
    print(f"CPU {a.cpu}, {a.rounds} rounds of {a.reps} sleeps, {a.units} units after each (medians, us of CPU)")
    print("| sleep before | first unit | later units | first / back to back | later / back to back |")
    print("|---|---|---|---|---|")
    for s in SLEEPS_MS:
        f, r = statistics.median(first[s]), statistics.median(rest[s])
        print(f"| {s:g} ms | {f:.1f} | {r:.1f} | {f / steady:.2f} | {r / steady:.2f} |")


if __name__ == "__main__":
    main()
