"""``upf.backup`` on real embedded stores: what a page boundary can split is repaired on restore, ids
stay, the commit version is raised past the fence, and pages are bounded (more keys than one page)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import fdb.tuple
import pytest

from upf import backup as bk
from upf_keyspace import Envelope, Settings, keys, open_store
from upf_keyspace.drivers.embedded import raise_stamp_floor
from upf_keyspace.msgid import encode_id
from upf_keyspace.ops.publish import IDEM_KEEP_SECS, RELEASED_MARK


async def test_restore_repairs_split_entries_and_raises_the_version(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bk, "PAGE", 7)  # several pages per prefix
    now = int(time.time())
    src = await open_store(Settings(store_path=str(tmp_path / "a.db")))
    try:
        published = [
            await src.publish(
                "upT1", Envelope(time=now, expires=now + 3600 + i, message=f"m{i}"), idem=f"k{i}" if i % 2 else ""
            )
            for i in range(20)
        ]
        lost_x = published[3]  # as if the janitor's page boundary fell between its Q and its X entry

        async def split(tr):  # type: ignore[no-untyped-def]
            tr.clear(keys.expiry_key(now + 3600 + 3, "upT1", lost_x.stamp))
            tr.set(keys.expiry_key(now + 5, "upGONE", b"\x00" * 12), b"")  # an X whose message is gone
            tr.set(keys.idem_key("upGONE", "k", b"\x00" * 12), b"")

        await src.db.transact(split)
        n = await bk.backup(src, str(tmp_path / "b"))
        after = await src.publish("upT1", Envelope(time=now, expires=now + 3600, message="after"))
    finally:
        await src.close()

    _header, end, _pairs = bk.read_backup(str(tmp_path / "b"))
    assert end.pairs == n and end.fence[:8] > published[-1].stamp[:8]
    dst = await open_store(Settings(store_path=str(tmp_path / "c.db")))
    try:
        written, top, floor = await bk.restore(dst, str(tmp_path / "b"))

        async def everything(tr):  # type: ignore[no-untyped-def]
            out = {}
            for p in (keys.Prefix.QUEUE, keys.Prefix.EXPIRY, keys.Prefix.IDEMPOTENCY):
                out[p] = await tr.get_range(*bk.prefix_range(p))
            return out

        got = await dst.db.transact(everything)
    finally:
        await dst.close()
    assert top == published[-1].stamp
    assert [keys.unpack_queue_key(k)[1] for k, _ in got[keys.Prefix.QUEUE]] == [p.stamp for p in published]
    expiries = sorted(keys.unpack_expiry_key(k) for k, _ in got[keys.Prefix.EXPIRY])
    assert expiries == sorted(
        (now + 3600 + i, "upT1", p.stamp) for i, p in enumerate(published)
    )  # repaired, orphan dropped
    assert len(got[keys.Prefix.IDEMPOTENCY]) == 10 and all(b"upGONE" not in k for k, _ in got[keys.Prefix.IDEMPOTENCY])
    assert floor > int.from_bytes(after.stamp[:8], "big")  # above an id issued after the backup, then lost
    assert raise_stamp_floor(str(tmp_path / "c.db"), floor) >= floor  # the restore's own commits may be past it
    dst = await open_store(Settings(store_path=str(tmp_path / "c.db")), restoring=True)
    await bk.finish_restore(dst)  # as upf restore does once the floor is raised
    await dst.close()
    dst = await open_store(Settings(store_path=str(tmp_path / "c.db")))
    try:
        new = await dst.publish("upT1", Envelope(time=now, expires=now + 60, message="new"))
    finally:
        await dst.close()
    assert new.stamp > after.stamp > top


async def _ranges(store, *prefixes: keys.Prefix):  # type: ignore[no-untyped-def]
    """Every key and value of each prefix, in one read."""

    async def body(tr):  # type: ignore[no-untyped-def]
        return [await tr.get_range(*bk.prefix_range(p)) for p in prefixes]

    return await store.db.transact(body)


@pytest.mark.parametrize(
    ("before", "in_queue"),
    [
        (keys.Prefix.SCHEDULED, True),  # released before S was read: the Q copy only
        (keys.Prefix.RELEASED, True),  # between the S and SR pages: in S, SR and Q
        (keys.Prefix.QUEUE, True),  # between the SR and Q pages: in S and Q, its SR entry missing
        (keys.Prefix.TIME_INDEX, False),  # after the Q pages: the S copy only
    ],
)
async def test_a_message_released_during_the_backup_is_restored_once(
    tmp_path: Path, monkeypatch, before: keys.Prefix, in_queue: bool
) -> None:
    """The releaser moves a message from S to Q (and SR) in one commit while the backup reads its pages:
    wherever that commit falls, the restored store holds the message once, in Q with its SR map, or in S."""
    now = int(time.time())
    src = await open_store(Settings(store_path=str(tmp_path / "a.db")))
    try:
        await src.publish("upPLAIN", Envelope(time=now, expires=now + 3600, message="plain"))
        sched = await src.schedule("upSCHED", Envelope(time=now + 5, expires=now + 3605, message="later"), now + 5)
        real_page, first_page, released = bk._page, bk.prefix_range(before)[0], []

        async def page(store, begin, end):  # type: ignore[no-untyped-def]
            if begin == first_page and not released:
                released.append(await src.release_due(now + 5))
            return await real_page(store, begin, end)

        monkeypatch.setattr(bk, "_page", page)
        await bk.backup(src, str(tmp_path / "b"))
    finally:
        await src.close()
    assert released == [1]

    dst = await open_store(Settings(store_path=str(tmp_path / "c.db")))
    try:
        await bk.restore(dst, str(tmp_path / "b"))
        rows = await dst.read_after("upSCHED", None)
        scheduled, mapped = await _ranges(dst, keys.Prefix.SCHEDULED, keys.Prefix.RELEASED)
    finally:
        await dst.close()
    if in_queue:
        assert [(r.envelope.message, r.envelope.origin_id) for r in rows] == [("later", encode_id(sched.stamp))]
        assert scheduled == []
        assert [k for k, _ in mapped] == [keys.released_key("upSCHED", sched.stamp, rows[0].stamp)]
    else:
        assert rows == [] and mapped == []
        assert [keys.unpack_scheduled_key(k) for k, _ in scheduled] == [(now + 5, sched.stamp, "upSCHED")]


def _upf(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "FDB_", "OTEL_"))}
    env.update(UPF_STORE_PATH=str(store), UPF_LOG_LEVEL="WARNING")
    return subprocess.run(
        [sys.executable, "-m", "upf", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (bk.Pair(keys.ROOT + fdb.tuple.pack(("ZZ", "durable")), b"v"), "a kind this UPF does not know"),
        (bk.Pair(keys.queue_key("upZZ", b"\xff" * 12), b"\xc1"), "a QUEUE entry this UPF cannot read"),
    ],
    ids=["newer-kind", "undecodable-message"],
)
async def test_restore_refuses_what_it_cannot_read_before_writing_anything(
    tmp_path: Path, monkeypatch, bad: bk.Pair, says: str
) -> None:
    """A pair restore cannot read, last in a file whose framing is sound, is refused before the first
    write (restore commits every PAGE keys: else the keys before it stay, and a retry finds the store
    not empty); the CLI says so in one line."""
    monkeypatch.setattr(bk, "PAGE", 7)
    now = int(time.time())
    src = await open_store(Settings(store_path=str(tmp_path / "a.db")))
    try:
        for i in range(30):
            await src.publish("upPART", Envelope(time=now, expires=now + 3600, message=f"m{i}"))
        await bk.backup(src, str(tmp_path / "good"))
    finally:
        await src.close()
    header, end, pairs = bk.read_backup(str(tmp_path / "good"))
    kept = [*pairs, bad]
    digest = hashlib.sha256()  # an undamaged file: its checksum matches
    with open(tmp_path / "bad", "wb") as f:
        f.write(bk.MAGIC)
        bk._put(f, header, digest)
        for p in kept:
            bk._put(f, p, digest)
        bk._put(f, bk._sealed(bk.End(len(kept), end.fence, end.fenced_at), digest))

    with pytest.raises(bk.BackupError, match=says):
        bk.read_backup(str(tmp_path / "bad"))
    dst = await open_store(Settings(store_path=str(tmp_path / "c.db")))
    try:
        with pytest.raises(bk.BackupError, match=says):
            await bk.restore(dst, str(tmp_path / "bad"))
        assert await bk._empty(dst)
        await bk.restore(dst, str(tmp_path / "good"))  # the retry
        assert len(await dst.read_after("upPART", None)) == 30
    finally:
        await dst.close()

    r = _upf(tmp_path / "d.db", "restore", str(tmp_path / "bad"))
    assert r.returncode == 1 and r.stderr.startswith("upf: ") and r.stderr.count("\n") == 1, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr


async def test_repaired_ttl_entries_let_the_janitor_clear_idempotency_and_released_entries(tmp_path: Path) -> None:
    """The X entries restore re-creates carry what the writer's do (the idempotency key, or the released
    message's publish id), and the janitor's hold on an expired released message's SR entry is restored:
    the janitor's expiry then leaves no ID or SR entry behind."""
    now = int(time.time())
    src = await open_store(Settings(store_path=str(tmp_path / "a.db"), default_ttl_secs=3600))
    try:
        keyed = Envelope(time=now, expires=now + 60, message="keyed", idem="key-1")  # as the writer builds it
        await src.publish("upK", keyed, idem="key-1")
        sched = await src.schedule("upR", Envelope(time=now, expires=now + 60, message="released"), now)
        gone = await src.schedule("upR2", Envelope(time=now, expires=now + 1, message="expired"), now)
        assert await src.release_due(now) == 2
        assert await src.expire(now + 2) == 1  # upR2: its SR entry is kept, by an X entry of its own

        async def split(tr):  # type: ignore[no-untyped-def]  # as if the janitor's page fell between Q and X
            for k, _ in await tr.get_range(*bk.prefix_range(keys.Prefix.EXPIRY)):
                if keys.unpack_expiry_key(k)[0] == now + 60:
                    tr.clear(k)

        await src.db.transact(split)
        await bk.backup(src, str(tmp_path / "b"))
    finally:
        await src.close()

    dst = await open_store(Settings(store_path=str(tmp_path / "c.db"), default_ttl_secs=3600))
    try:
        await bk.restore(dst, str(tmp_path / "b"))
        (x,) = await _ranges(dst, keys.Prefix.EXPIRY)
        assert sorted(v for _, v in x) == sorted(
            [b"key-1", RELEASED_MARK + encode_id(sched.stamp).encode(), RELEASED_MARK + encode_id(gone.stamp).encode()]
        )
        assert await dst.expire(now + 10 * 3600) == 3
        left = await _ranges(dst, keys.Prefix.QUEUE, keys.Prefix.EXPIRY, keys.Prefix.IDEMPOTENCY, keys.Prefix.RELEASED)
    finally:
        await dst.close()
    assert left == [[], [], [], []]


async def test_restore_refuses_a_store_a_running_node_uses(tmp_path: Path) -> None:
    """A running server's store holds no durable state until its first publish, so it passes as empty;
    a fresh heartbeat (what every running pusher writes) makes the CLI refuse in one line and write
    nothing, and one older than the janitor's dead-node age (3 heartbeats: 30 s) lets it through."""
    now = int(time.time())
    src = await open_store(Settings(store_path=str(tmp_path / "a.db")))
    try:
        await src.publish("upLIVE", Envelope(time=now, expires=now + 3600, message="kept"))
        await bk.backup(src, str(tmp_path / "b"))
    finally:
        await src.close()
    dst = await open_store(Settings(store_path=str(tmp_path / "c.db")))
    try:
        await dst.heartbeat("node-a", int(time.time()) - 5)
        r = _upf(tmp_path / "c.db", "restore", str(tmp_path / "b"))
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert re.search(r"UPF node node-a uses this store \(its heartbeat is [56] s old\)", r.stderr), r.stderr
        assert await bk._empty(dst)
        await dst.heartbeat("node-a", int(time.time()) - 31)  # stopped: its heartbeat is past the dead-node age
        r = _upf(tmp_path / "c.db", "restore", str(tmp_path / "b"))
        assert r.returncode == 0, r.stderr
    finally:
        await dst.close()
    dst = await open_store(Settings(store_path=str(tmp_path / "c.db")))
    try:
        assert [s.envelope.message for s in await dst.read_after("upLIVE", None)] == ["kept"]
    finally:
        await dst.close()


async def _small_backup(tmp_path: Path) -> Path:
    now = int(time.time())
    src = await open_store(Settings(store_path=str(tmp_path / "src.db")))
    try:
        for i in range(3):
            await src.publish("upFLIP", Envelope(time=now, expires=now + 3600, message=f"m{i}"), idem=f"k{i}")
        await bk.backup(src, str(tmp_path / "small"))
    finally:
        await src.close()
    return tmp_path / "small"


async def test_every_damaged_byte_of_a_backup_is_refused_never_restored_or_a_crash(tmp_path: Path) -> None:
    """A flipped bit anywhere (the frames, their lengths, the checksum, the fence after it) is a
    BackupError: before the checksum, 55% of such files restored, some with changed messages."""
    good = (await _small_backup(tmp_path)).read_bytes()
    bad = tmp_path / "bad"
    for i in range(len(good)):
        bad.write_bytes(good[:i] + bytes([good[i] ^ 0x01]) + good[i + 1 :])
        with pytest.raises(bk.BackupError):
            bk.read_backup(str(bad))
    r = _upf(tmp_path / "d.db", "restore", str(bad))
    assert r.returncode == 1 and "damaged" in r.stderr and "Traceback" not in r.stderr, r.stderr


async def test_a_version_1_backup_without_a_checksum_still_restores(tmp_path: Path) -> None:
    header, end, pairs = bk.read_backup(str(await _small_backup(tmp_path)))
    kept = list(pairs)
    with open(tmp_path / "v1", "wb") as f:
        f.write(bk.MAGIC)
        bk._put(f, bk.Header(version=1, created=header.created, store_format=header.store_format))
        for p in kept:
            bk._put(f, p)
        bk._put(f, bk.End(len(kept), end.fence, end.fenced_at))
    dst = await open_store(Settings(store_path=str(tmp_path / "v1.db")))
    try:
        await bk.restore(dst, str(tmp_path / "v1"))
        assert [r.envelope.message for r in await dst.read_after("upFLIP", None)] == ["m0", "m1", "m2"]
    finally:
        await dst.close()


async def test_restore_sums_the_stored_bytes_again_and_drops_time_entries_without_their_message(
    tmp_path: Path,
) -> None:
    """The stats page is read after the messages' pages, so a copy of it is off by what was published or
    expired in between, for good (the janitor only ever subtracts what it deletes). Restore sums the bytes
    of the messages it restores; the message count is the file's. A time-index entry whose message was
    expired between the pages is dropped: nothing would ever clear it."""
    from upf_keyspace.ops import stats
    from upf_keyspace.ops.publish import STAT_SLOTS, TALLY, add_tally

    now = int(time.time())
    src = await open_store(Settings(store_path=str(tmp_path / "a.db")))
    try:
        for i in range(5):
            await src.publish(f"upSUM{i}", Envelope(time=now, expires=now + 3600, message="x" * (10 + i)))

        async def drift(tr):  # type: ignore[no-untyped-def]
            add_tally(tr, "upSUM0", 0, 233)  # as if published between the Q pages and the ST page
            tr.set(keys.time_index_key("upGONE", now), b"\x00" * 12)  # its message expired meanwhile

        await src.db.transact(drift)
        assert await src.db.transact(stats.stored_bytes) > 233
        await bk.backup(src, str(tmp_path / "b"))
    finally:
        await src.close()
    dst = await open_store(Settings(store_path=str(tmp_path / "c.db")))
    try:
        await bk.restore(dst, str(tmp_path / "b"))

        async def read(tr):  # type: ignore[no-untyped-def]
            q = await tr.get_range(*bk.prefix_range(keys.Prefix.QUEUE))
            qt = await tr.get_range(*bk.prefix_range(keys.Prefix.TIME_INDEX))
            return sum(len(v) for _, v in q), [keys.unpack_time_index_key(k)[0] for k, _ in qt]

        q_bytes, indexed = await dst.db.transact(read)
        assert await dst.db.transact(stats.stored_bytes) == q_bytes
        assert await dst.db.transact(stats.total) == 5
        assert sorted(indexed) == [f"upSUM{i}" for i in range(5)]
        slots = await dst.db.transact(lambda tr: tr.get_range(*keys.stat_range(TALLY)))
        assert len(slots) <= STAT_SLOTS
    finally:
        await dst.close()


async def test_a_backup_file_replaced_between_its_check_and_its_restore_is_refused(tmp_path: Path) -> None:
    """Restore checks the whole file, then reads it again to write: another backup renamed onto the
    path in between would be written unchecked."""
    path = await _small_backup(tmp_path)
    _, _, pairs = bk.read_backup(str(path))
    other = tmp_path / "other"
    other.write_bytes(path.read_bytes())
    os.replace(other, path)
    with pytest.raises(bk.BackupError, match="changed while it was read"):
        next(pairs)


async def test_a_restore_stopped_half_way_is_refused_by_the_roles_and_finished_by_restoring_again(
    tmp_path: Path, monkeypatch
) -> None:
    """A restore killed between its writes left part of a backup and no stamp floor, and the server
    then served it as the store. The store is now marked until the restore is whole: the roles refuse
    it (one line, exit 2), and the same restore run again clears the part and finishes."""
    from upf_keyspace import UnfinishedRestoreError

    monkeypatch.setattr(bk, "PAGE", 5)
    now = int(time.time())
    src = await open_store(Settings(store_path=str(tmp_path / "a.db")))
    try:
        for i in range(30):
            await src.publish("upHALF", Envelope(time=now, expires=now + 3600, message=f"m{i}"))
        await bk.backup(src, str(tmp_path / "b"))
    finally:
        await src.close()
    dst_settings = Settings(store_path=str(tmp_path / "c.db"))
    dst = await open_store(dst_settings, restoring=True)
    real = dst.db.transact
    writes = 0

    async def killed(body, *args, **kw):  # type: ignore[no-untyped-def]
        nonlocal writes
        writes += 1
        if writes == 6:  # its checks, the mark, a page of the backup: then the process is gone
            raise KeyboardInterrupt
        return await real(body, *args, **kw)

    monkeypatch.setattr(dst.db, "transact", killed)
    with pytest.raises(KeyboardInterrupt):
        await bk.restore(dst, str(tmp_path / "b"))
    await dst.close()
    with pytest.raises(UnfinishedRestoreError):
        await open_store(dst_settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UPF_", "FDB_", "OTEL_"))}
    env.update(UPF_STORE_PATH=str(tmp_path / "c.db"), UPF_LOG_LEVEL="WARNING", UPF_BIND="127.0.0.1:0", UPF_WORKERS="1")
    r = subprocess.run([sys.executable, "-m", "upf"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unfinished restore" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = _upf(tmp_path / "c.db", "restore", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    dst = await open_store(dst_settings)
    try:
        assert [s.envelope.message for s in await dst.read_after("upHALF", None)] == [f"m{i}" for i in range(30)]
    finally:
        await dst.close()


async def test_an_idempotency_marker_held_past_its_message_is_restored_with_its_hold(tmp_path: Path) -> None:
    """A TTL 0 push's marker outlives its message (``IDEM_KEEP_SECS``) under an X entry of its own: a
    restore keeps both, so a retry after the restore is still answered, not stored, and the janitor
    still clears the marker in time."""
    now = int(time.time())
    src = await open_store(Settings(store_path=str(tmp_path / "a.db")))
    try:
        first = await src.publish("upI", Envelope(time=now, expires=now, message="p", idem="k-0"), idem="k-0")
        assert await src.expire(now + 1) == 1
        await bk.backup(src, str(tmp_path / "b"))
    finally:
        await src.close()
    dst = await open_store(Settings(store_path=str(tmp_path / "c.db")))
    try:
        await bk.restore(dst, str(tmp_path / "b"))
        retry = await dst.publish("upI", Envelope(time=now + 2, expires=now + 2, message="p", idem="k-0"), idem="k-0")
        assert retry.duplicate and retry.stamp == first.stamp and await dst.read_after("upI", None) == []
        assert await dst.expire(now + IDEM_KEEP_SECS + 1) == 1
        assert await _ranges(dst, keys.Prefix.EXPIRY, keys.Prefix.IDEMPOTENCY) == [[], []]
    finally:
        await dst.close()


async def test_a_backup_writes_into_a_pipe_and_through_a_link_never_over_them(tmp_path: Path) -> None:
    """``upf backup FILE`` renamed its temporary file over FILE: a symbolic link became a file (its
    target never written), a pipe a file (its reader got nothing), ``/dev/full`` a file. A link's
    target is now replaced atomically and the link kept; a pipe is written into."""
    src = await open_store(Settings(store_path=str(tmp_path / "a.db")))
    try:
        await src.publish("upP", Envelope(time=int(time.time()), expires=int(time.time()) + 60, message="m"))
        target, link = tmp_path / "real.upfb", tmp_path / "link.upfb"
        link.symlink_to(target)
        n = await bk.backup(src, str(link))
        assert link.is_symlink() and bk.read_backup(str(target))[1].pairs == n
        pipe = tmp_path / "pipe.upfb"
        os.mkfifo(pipe)
        got = asyncio.get_running_loop().run_in_executor(None, pipe.read_bytes)
        assert await bk.backup(src, str(pipe)) == n
        (tmp_path / "from-pipe.upfb").write_bytes(await got)
        assert bk.read_backup(str(tmp_path / "from-pipe.upfb"))[1].pairs == n
    finally:
        await src.close()
    assert stat.S_ISFIFO(os.stat(pipe).st_mode) and [p.name for p in tmp_path.glob("*.tmp*")] == []
