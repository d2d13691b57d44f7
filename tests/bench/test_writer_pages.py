"""bench/writer_pages.py: it names the pages of a real LMDB store file by what they hold, and sorts a
traced commit's page writes by the flushes that end them."""

from __future__ import annotations

import sys
from pathlib import Path

import lmdb

from upf_keyspace import keys

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import writer_pages
finally:
    sys.path.remove(str(BENCH))

PAGE = writer_pages._PAGE


def _pages(path: Path) -> list[bytes]:
    raw = path.read_bytes()
    return [raw[i : i + PAGE] for i in range(0, len(raw), PAGE)]


def test_pages_of_a_store_file_are_named_by_their_keys(tmp_path):
    """Queue rows of many topics fill leaves and a branch above them; the time index its own leaf;
    a value bigger than a page goes to overflow pages; LMDB's own pages are told apart."""
    path = tmp_path / "s.db"
    env = lmdb.open(str(path), subdir=False, max_dbs=3, map_size=1 << 26)
    kv = env.open_db(b"kv")
    wlog = env.open_db(b"wlog")
    with env.begin(write=True) as txn:
        for i in range(400):
            txn.put(keys.queue_key(f"topic-{i:04d}", bytes(12)), b"x" * 200, db=kv)
        txn.put(keys.time_index_key("topic-0001", 1_700_000_000), bytes(12), db=kv)
        txn.put((7).to_bytes(8, "big"), b"w" * (3 * PAGE), db=wlog)
    env.close()
    kinds = [writer_pages.page_kind(p) for p in _pages(path)[2:]]  # after the two meta pages
    assert kinds.count("leaf, Q") >= 15, kinds  # 400 rows of ~250 bytes: ~16 per leaf
    assert "branch, Q" in kinds
    assert "leaf, QT" in kinds
    assert "overflow (a write-log entry)" in kinds
    assert "leaf, LMDB's own" in kinds  # the main database: the names kv and wlog


def test_a_traced_commit_is_its_page_writes_up_to_its_flush(tmp_path):
    """Writes to other descriptors are not the store's; the first commit may have begun before the
    trace and is dropped; each write call is one run."""
    path = tmp_path / "s.db"
    env = lmdb.open(str(path), subdir=False, max_dbs=3, map_size=1 << 26)
    kv = env.open_db(b"kv")
    with env.begin(write=True) as txn:
        txn.put(keys.queue_key("t", bytes(12)), b"x", db=kv)
    env.close()
    leaf = next(p for p in _pages(path) if writer_pages.page_kind(p) == "leaf, Q")
    hexed = "".join(f"\\x{b:02x}" for b in leaf)
    trace = "\n".join(
        [
            f'101 pwrite64(14, "{hexed}", 4096, 8192) = 4096',
            "101 fdatasync(14) = 0",  # the end of a commit begun before the trace
            f'101 pwrite64(14, "{hexed}", 4096, 8192) = 4096',
            f'101 writev(14, [{{iov_base="{hexed}", iov_len=4096}}, {{iov_base="{hexed}", iov_len=4096}}], 2) = 8192',
            f'101 pwrite64(15, "{hexed}", 4096, 0) = 4096',  # another descriptor (LMDB's O_DSYNC one)
            "101 fdatasync(14) = 0",
        ]
    )
    commits = writer_pages.commits_of(trace, 14)
    assert len(commits) == 1
    assert commits[0]["leaf, Q"] == 3 and commits[0][writer_pages._RUNS] == 2
