"""bench/instr_writer.py: the commits and event-loop turns it reports are the calls a callgrind dump
records, named once and then referred to by number."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import instr_writer
finally:
    sys.path.remove(str(BENCH))

# Callgrind's compressed names: "(id) name" the first time a function appears, "(id)" after.
_DUMP = """\
events: Ir
fn=(1) committer_loop
cfn=(2) _mdb_txn_commit
calls=3 0x100
5 900
cfn=(3) fdatasync
calls=3 0
5 60
fn=(2)
cfn=(3)
calls=3 0
7 30
fn=(4) other_loop
cob=(9) /lib/liblmdb.so
cfn=(2)
calls=2 0x100
9 600
cfn=(5) _mdb_txn_commit_helper
calls=40 0
9 40
totals: 1660
"""


def test_calls_sum_every_caller_of_the_named_function():
    assert instr_writer._calls(_DUMP, "_mdb_txn_commit") == 5  # 3 from one caller, 2 from another
    assert instr_writer._calls(_DUMP, "fdatasync") == 6
    assert instr_writer._calls(_DUMP, "_mdb_txn_commit_helper") == 40  # a longer name is another function


def test_a_function_never_called_counts_zero():
    assert instr_writer._calls(_DUMP, "uv__io_poll") == 0
    assert instr_writer._calls(_DUMP, "committer_loop") == 0  # defined, never a callee
