"""The pages a writer's physical commit writes, by what they hold: why its closed loop waits on the disk.

Why: ``bench/writer_io.py`` shows the writer's rate bound by its group commit's flushes, and the
disk flushing scattered pages at a fifth to a third of the speed of contiguous ones. This says which
pages those are. It runs ``upf-writer`` on its front door (one core, 64 keep-alive connections over
``--topics`` topics, ``bench/pubdrive.py``), traces the process's page writes for ``--trace-secs``
with ``strace`` (its ``pwrite64``/``writev`` of 4 KiB pages and each ``fdatasync``), and sorts each
page a commit wrote by the last key on it: a leaf or branch page of the store's keyspace by the key's
prefix (``keys.Prefix``: Q, QT, X, ...); pages keyed by 8-byte integers (the write log, and LMDB's
free list); overflow pages (a value bigger than a page: the write log's); LMDB's own (its meta
database, the names of its databases). A page holding keys of two prefixes counts for the second.

Not part of bench/run.py (it needs ``strace``, and tracing slows the writer down: the figures are
pages per commit and per publish, not rates).

    python3 -m uv run python bench/writer_pages.py
    python3 -m uv run python bench/writer_pages.py --topics 100000   # more topics than pages in a commit
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import procs
from harness import SERVER_CPUS, pubdrive
from writer_io import commit_tallies

_PAGE = 4096
_LEAF, _BRANCH, _OVERFLOW = 0x02, 0x01, 0x04
_TUPLE_KEY = re.compile(rb"\x02upf\x00\x02([A-Z]+)\x00")
_BLOB = re.compile(r'"((?:\\x[0-9a-f]{2})+)"')
_CALL = re.compile(r"^\d+ +(pwrite64|writev|fdatasync)\((\d+)")


def page_kind(page: bytes) -> str:
    """What an LMDB page holds, by its flags and its last node's key (see the module's docstring)."""
    flags = struct.unpack_from("<H", page, 10)[0]
    if flags & _OVERFLOW:
        return "overflow (a write-log entry)"
    kind = "leaf" if flags & _LEAF else "branch" if flags & _BRANCH else f"flags {flags:#x}"
    lower = struct.unpack_from("<H", page, 12)[0]
    nodes = (lower - 16) // 2
    if not 0 < nodes < _PAGE // 2 - 8:
        return f"{kind}, empty"
    at = struct.unpack_from("<H", page, 16 + 2 * (nodes - 1))[0]
    if at + 8 > _PAGE:
        return f"{kind}, unreadable"
    size = struct.unpack_from("<H", page, at + 6)[0]
    key = page[at + 8 : at + 8 + size]
    m = _TUPLE_KEY.match(key)
    if m:
        return f"{kind}, {m.group(1).decode()}"
    if len(key) == 8:
        return f"{kind}, write log or free list"
    return f"{kind}, LMDB's own"


_RUNS = "writes (each one run of contiguous pages)"


def commits_of(trace: str, data_fd: int) -> list[collections.Counter[str]]:
    """The pages each commit wrote to the store file (``data_fd``), one Counter per ``fdatasync``, and
    under ``_RUNS`` its write calls: LMDB writes each run of contiguous dirty pages with one call."""
    out: list[collections.Counter[str]] = []
    cur: collections.Counter[str] = collections.Counter()
    for line in trace.splitlines():
        m = _CALL.match(line)
        if m is None or int(m.group(2)) != data_fd:
            continue
        if m.group(1) == "fdatasync":
            out.append(cur)
            cur = collections.Counter()
            continue
        cur[_RUNS] += 1
        for blob in _BLOB.findall(line):
            raw = bytes.fromhex(blob.replace("\\x", ""))
            i = 0
            while len(raw) % _PAGE == 0 and i < len(raw):
                kind = page_kind(raw[i : i + _PAGE])
                # An overflow value's pages after its first carry no header: ``mp_pages`` counts them all.
                n = max(1, struct.unpack_from("<I", raw, i + 12)[0]) if kind.startswith("overflow") else 1
                n = min(n, (len(raw) - i) // _PAGE)
                cur[kind] += n
                i += n * _PAGE
    return out[1:]  # the first may have begun before the trace


def data_fd(pid: int, store: Path) -> int:
    """The descriptor the writer flushes the store through: the one of the file's that is not O_DSYNC."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if Path(fd.readlink()) != store:
                continue
            flags = int(Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError, ValueError):
            continue
        if not flags & 0o10000:  # O_DSYNC: LMDB's meta-page descriptor
            return int(fd.name)
    raise SystemExit(f"no descriptor of {store} in process {pid}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--secs", type=float, default=8.0, help="how long pubdrive publishes")
    ap.add_argument("--trace-secs", type=float, default=2.0, help="how long strace watches, from the 3rd second")
    a = ap.parse_args()
    if shutil.which("strace") is None:
        raise SystemExit("needs strace (Debian's package strace)")
    work = Path(tempfile.mkdtemp(prefix="upf-writer-pages-"))
    store = work / "upf.db"
    p, port = procs.start_upf_writer(work, store, SERVER_CPUS, UPF_WRITER_SERVER="upf")
    out = work / "trace.txt"
    try:
        fd = data_fd(p.pid, store)

        def trace() -> None:
            time.sleep(3.0)
            argv = ["strace", "-f", "-qq", "-s", str(16 * _PAGE), "-xx", "-e", "trace=pwrite64,writev,fdatasync"]
            st = subprocess.Popen([*argv, "-p", str(p.pid), "-o", str(out)])
            time.sleep(a.trace_secs)
            st.send_signal(signal.SIGINT)
            st.wait()

        tracer = threading.Thread(target=trace)
        before = commit_tallies(port)
        tracer.start()
        d = pubdrive(f"http://127.0.0.1:{port}", [p.pid], secs=a.secs, conns=64, topics=a.topics)
        tracer.join()
        after = commit_tallies(port)
    finally:
        p.stop()
    commits = commits_of(out.read_text(), fd)
    shutil.rmtree(work, ignore_errors=True)
    if not commits:
        raise SystemExit("no commit traced")
    runs = [c.pop(_RUNS, 0) for c in commits]
    total: collections.Counter[str] = collections.Counter()
    for c in commits:
        total.update(c)
    pages = [sum(c.values()) for c in commits]
    q_leaves = [c["leaf, Q"] for c in commits]
    batch = (after["batch_size_sum"] - before["batch_size_sum"]) / max(
        1.0, after["batch_size_count"] - before["batch_size_count"]
    )
    print(
        f"{a.topics:,} topics, {d.ok_per_s:,.0f} publishes/s (strace slows it), {batch:.1f} publishes per commit; "
        f"{len(commits)} commits traced, {statistics.median(pages):.0f} pages each (median; mean "
        f"{statistics.mean(pages):.1f}, {statistics.mean(pages) / batch:.2f} per publish)"
    )
    print("| pages of a commit | mean per commit |")
    print("|---|---|")
    for kind, n in total.most_common():
        if n / len(commits) >= 0.05:
            print(f"| {kind} | {n / len(commits):.2f} |")
    print(f"Q leaves per commit: median {statistics.median(q_leaves):.0f}, mean {statistics.mean(q_leaves):.1f}")
    print(f"write calls per commit, each a run of contiguous pages: mean {statistics.mean(runs):.1f}")


if __name__ == "__main__":
    main()
