"""Cross-process wake-ups of the embedded store: a commit in one handle (or process) wakes another's
watches through its datagram socket; a lost datagram is caught by the slow fallback poll, duplicates
are harmless, and sockets left by killed processes are cleaned up."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from upf_keyspace.drivers._wake import wake_dir
from upf_keyspace.drivers.embedded import open_embedded

KEY = b"\x01test-wake/bell"


async def _set(db, value: bytes) -> None:
    async def body(tr):
        tr.set(KEY, value)

    await db.transact(body)


async def _watch(db):
    async def body(tr):
        return tr.watch(KEY)

    return await db.transact(body)


async def _wait(watch) -> None:
    await watch


async def test_other_handle_commit_wakes_watch_without_polling(pair):
    """With the fallback poll pushed out of reach, only the datagram can fire the watch."""
    a, b = pair
    a.fallback_poll_secs = 3600
    await _set(b, b"0")
    watch = await _watch(a)
    await _set(b, b"1")
    await asyncio.wait_for(_wait(watch), 10)
    assert watch.done()


async def test_dropped_wakes_still_fire_through_the_fallback_poll(pair):
    """Every datagram to ``a`` is dropped (its reader is gone); the 1 s backstop (here 0.1 s) fires it."""
    a, b = pair
    a.fallback_poll_secs = 0.1
    a._loop.remove_reader(a._inbox.fileno())
    await _set(b, b"0")
    watch = await _watch(a)
    await _set(b, b"1")
    await asyncio.wait_for(_wait(watch), 10)
    assert a._inbox.drain() >= 1, "the commit sent a wake that nobody read"


async def test_duplicate_wakes_fire_a_watch_once_and_nothing_else(pair):
    a, b = pair
    a.fallback_poll_secs = 3600
    await _set(b, b"0")
    first = await _watch(a)
    await _set(b, b"1")
    await asyncio.wait_for(_wait(first), 10)
    second = await _watch(a)  # armed on the new value b"1"
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        for _ in range(5):
            sender.sendto(b"!", a._inbox.dir.address(a._inbox.name))
    finally:
        sender.close()
    for _ in range(20):  # let the loop read the duplicates and run the check they schedule
        await asyncio.sleep(0.01)
    assert a._inbox.drain() == 0, "the loop read the duplicates"
    assert not second.done(), "a wake without a change fired a watch"
    await _set(b, b"2")
    await asyncio.wait_for(_wait(second), 10)
    assert first.future.result() is None and second.future.result() is None


def _count_checks(db) -> list[float]:
    """The loop times of ``db``'s watch checks from here on."""
    checks: list[float] = []
    check = db._check_watches

    def counted() -> None:
        checks.append(db._loop.time())
        check()

    db._check_watches = counted
    return checks


async def test_wakes_faster_than_the_pace_are_checked_once_per_pace(pair):
    """A wake after a quiet spell is checked at once, and so are the next few within a pace of the
    check before them (``_QUICK_WAKES``: a client publishing twice is not delayed). The one after
    those makes the handle deaf to wakes until the pace is up: the commits meanwhile are seen by one
    check then, and none before it; while they keep coming it stays on that beat; a pace with none
    and it listens again, so the next commit is seen at once."""
    from upf_keyspace.drivers.embedded.watches import _QUICK_WAKES

    a, b = pair
    a.fallback_poll_secs = 3600
    a._wake_pace = pace = 0.3
    await _set(b, b"0")
    await asyncio.sleep(pace * 1.5)  # the wake of that commit is long checked: a quiet spell
    checks = _count_checks(a)
    for i in range(1 + _QUICK_WAKES):  # one after the quiet spell, then the quick ones
        watch = await _watch(a)
        began = a._loop.time()
        await _set(b, b"quick %d" % i)
        await asyncio.wait_for(_wait(watch), 10)
        assert a._loop.time() - began < pace / 2, f"wake {i} waited for the pace"
    assert a._paced_check is None
    quick_checks = len(checks)
    second = await _watch(a)
    for value in (b"2", b"3", b"4"):  # the stream goes on: these wait for the pace
        await _set(b, value)
    await asyncio.sleep(0.05)
    assert not second.done(), "checked before the pace was up"
    assert len(checks) == quick_checks and a._paced_check is not None
    await asyncio.wait_for(_wait(second), 10)
    assert checks[-1] - checks[-2] >= pace * 0.9, "the paced check came early"
    third = await _watch(a)  # armed on b"4": the paced check saw all three commits
    await _set(b, b"5")  # within a pace of the paced check: still on the beat
    await asyncio.wait_for(_wait(third), 10)
    assert checks[-1] - checks[-2] >= pace * 0.9
    await asyncio.sleep(pace * 2.5)  # a pace with no wake: listening again
    assert a._paced_check is None
    fourth = await _watch(a)
    began = a._loop.time()
    await _set(b, b"6")
    await asyncio.wait_for(_wait(fourth), 10)
    assert a._loop.time() - began < pace / 2, "a commit after the stream stopped waited for the pace"


async def test_a_pace_of_zero_checks_at_every_wake(pair):
    a, b = pair
    a.fallback_poll_secs = 3600
    a._wake_pace = 0.0
    await _set(b, b"0")
    checks = _count_checks(a)
    for value in (b"1", b"2", b"3"):
        watch = await _watch(a)
        await _set(b, value)
        await asyncio.wait_for(_wait(watch), 10)
    assert len(checks) >= 3 and a._paced_check is None


async def test_close_while_deaf_cancels_the_paced_check(tmp_path):
    path = str(tmp_path / "store.db")
    a = await open_embedded(path)
    b = await open_embedded(path)
    try:
        a._wake_pace = 5.0
        for value in (b"0", b"1", b"2", b"3", b"4"):  # the first wake begins the pace; past the quick ones, deaf
            await _set(b, value)
            await asyncio.sleep(0.05)
        paced = a._paced_check
        assert paced is not None, "a wake within the pace did not make the handle deaf"
        await a.close()
        assert paced.cancelled() and a._paced_check is None
    finally:
        await a.close()
        await b.close()


async def test_close_removes_the_socket(tmp_path):
    path = str(tmp_path / "store.db")
    db = await open_embedded(path)
    name = db._inbox.name
    assert name in os.listdir(wake_dir(path))
    await db.close()
    assert name not in os.listdir(wake_dir(path))


KILLED = textwrap.dedent(
    """
    import asyncio, sys
    from upf_keyspace.drivers.embedded import open_embedded

    async def main(path):
        db = await open_embedded(path)
        print(db._inbox.name, flush=True)
        await asyncio.sleep(60)

    asyncio.run(main(sys.argv[1]))
    """
)


@pytest.mark.slow
async def test_socket_of_a_killed_process_is_removed_and_commits_go_on(tmp_path):
    path = str(tmp_path / "store.db")
    a = await open_embedded(path)
    proc = subprocess.Popen([sys.executable, "-c", KILLED, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        stale = proc.stdout.readline().strip()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    try:
        assert stale in os.listdir(wake_dir(path)), "kill -9 left its socket behind"
        b = await open_embedded(path)
        try:
            b.fallback_poll_secs = 3600
            await _set(a, b"0")
            watch = await _watch(b)
            await _set(a, b"1")  # the committer's send to the stale socket is refused: it removes it
            await asyncio.wait_for(_wait(watch), 10)
            assert stale not in os.listdir(wake_dir(path))
        finally:
            await b.close()
    finally:
        await a.close()


async def test_long_store_path_still_wakes(tmp_path):
    """A wake directory too deep for sun_path (108 bytes) is reached through /proc/self/fd."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    path = str(deep / "store.db")
    a = await open_embedded(path)
    b = await open_embedded(path)
    try:
        assert len(os.path.join(wake_dir(path), a._inbox.name)) > 108
        a.fallback_poll_secs = 3600
        await _set(b, b"0")
        watch = await _watch(a)
        await _set(b, b"1")
        await asyncio.wait_for(_wait(watch), 10)
    finally:
        await a.close()
        await b.close()


WATCH_ONLY = textwrap.dedent(
    """
    import asyncio, sys
    from upf_keyspace.drivers.embedded import open_embedded

    async def main(path):
        db = await open_embedded(path)
        db.fallback_poll_secs = 3600
        async def arm(tr):
            return tr.watch(b"\\x01test-wake/bell")
        watch = await db.transact(arm)
        print("armed", flush=True)
        await asyncio.wait_for(watch, 30)
        print("fired", flush=True)
        await db.close()

    asyncio.run(main(sys.argv[1]))
    """
)


@pytest.mark.slow
async def test_watch_in_another_process_fires_by_notification(tmp_path):
    """A real second process, its fallback poll out of reach: the datagram alone wakes it."""
    path = str(tmp_path / "store.db")
    db = await open_embedded(path)
    try:
        await _set(db, b"0")
        proc = subprocess.Popen([sys.executable, "-c", WATCH_ONLY, path], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "armed"
            await _set(db, b"1")
            line = await asyncio.to_thread(proc.stdout.readline)
            assert line.strip() == "fired"
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    finally:
        await db.close()


async def test_without_a_wake_socket_watches_still_fire_by_polling(tmp_path):
    """If the wake directory cannot be made (here a file is in its way), the store still opens and
    another handle's commit still fires the watch, through the poll."""
    path = str(tmp_path / "store.db")
    open(wake_dir(path), "w").close()
    a = await open_embedded(path)
    b = await open_embedded(path)
    try:
        assert a._inbox is None and a.fallback_poll_secs < 1
        await _set(b, b"0")
        watch = await _watch(a)
        await _set(b, b"1")
        await asyncio.wait_for(_wait(watch), 10)
    finally:
        await a.close()
        await b.close()
