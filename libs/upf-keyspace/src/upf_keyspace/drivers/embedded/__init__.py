"""The embedded store: FoundationDB's transaction contract on one LMDB file that several processes on
one host share.

How it keeps FoundationDB's meaning:
- Keys are the same tuple-encoded bytes in LMDB's ``kv`` database, which orders them by memcmp (a
  shorter key first when one is a prefix of the other): FoundationDB's byte order.
- Optimistic serializable transactions. A transaction's read version is the store's commit counter
  when it first reads. Each read is one LMDB read transaction (a snapshot that includes the counter);
  if the counter moved since the read version, the read is checked against the write log and the
  transaction fails with NOT_COMMITTED (1020, retryable) if anything it has seen changed, so every
  transaction sees one snapshot. At commit the committer fails it the same way if a commit after its
  read version wrote anything it read (the resolver's rule), including earlier transactions of the
  same batch.
- Reads that avoid the file: a transaction's first read version may be the commit counter read once
  per event-loop iteration and shared (FoundationDB's proxies batch read versions the same way), and a
  small range result read before is reused while no commit between its version and the snapshot wrote
  into the range.
- Group commit: one committer thread per process takes every waiting transaction (while they stream
  in, after sleeping up to ``UPF_EMBEDDED_COMMIT_WAIT_MS``, default 20 ms, for more, or less once as
  many wait as recent commits carried and none has come for twice the longest gap seen while
  gathering), and applies them in one LMDB write transaction (processes serialise on LMDB's writer
  mutex, which a killed holder releases), each with its own batch order, then commits: a commit
  returns only once LMDB has synced the data pages and then the meta page. The 10-byte stamp is 8
  bytes big-endian, kept in the file so strictly increasing across processes and at least the wall
  clock in microseconds (ids never go backwards, even after the file lost its last commits), plus the
  2-byte batch order. Read versions and the write log use a separate dense commit counter.
- Grouped transactions (``transact_grouped``, publishes) run in the committer thread inside the
  group commit's write transaction, after the batch's other transactions: LMDB's single writer means
  their reads see every commit before them, so they need no read version and no conflict check, and
  every item waiting for a commit shares one transaction (``grouped``).
- Lost commits are noticed: each commit's stamp is also written to a mark file beside the store; a
  file that opens below its mark (an older copy put back) is logged as an error and stamps resume
  above the mark.
- The write log (``wlog``) keeps each physical commit's coalesced write ranges for 10 s (longer than
  the 5 s transaction lifetime), so any process can check conflicts against any other's commits.
- Watches: armed at commit with the value the transaction saw. This process's commits schedule the
  check directly; other processes' commits arrive as a datagram on this handle's wake socket (see
  ``_wake``), read by the event loop, so nothing runs while nothing commits. Once four in a row
  have come within ``UPF_EMBEDDED_WAKE_PACE_MS`` (default 10 ms) of the check before them, the handle
  stops reading them and checks once per that pace, until a pace passes with none
  (``watches._WAKE_PACE_SECS``). A 1 s poll of the commit
  counter, only while watches exist, is the backstop for a lost datagram: it costs latency, never a
  missed watch. The check compares only the watched keys the new commits wrote.
- A full disk (ENOSPC, LMDB's map full) fails a commit with STORAGE_FULL, not retried, logged once a
  minute, and reported to the process's ``errors.STORAGE`` for the health endpoints.
  ``UPF_EMBEDDED_MAX_BYTES`` (default 0, none) caps the databases' pages the same way: a quota, and
  how the tests fill a "disk" without root. A commit that frees pages passes even over the quota, so
  a full store can always delete its way back.
- A store file from before LMDB (SQLite) is converted at its first open (``convert``).

Modules: ``transaction`` (``EmbeddedTransaction``: reads on one snapshot, the mutation list, watches
armed at commit), ``reads`` (point and range reads, the shared read version, the small-range cache),
``writelog`` (the write log and its bounded in-memory copy; conflict checks), ``committer`` (the group
commit thread), ``watches`` (registration, the incremental check, wake-ups and the backstop poll),
``mutations`` (how a batch's mutations are applied), ``grouped`` (grouped transactions inside the
commit), ``file`` (the environment, opened once per
process and shared by its handles, and its databases), ``convert`` (SQLite store files), ``health``
(a full disk and the size quota), ``database`` (``EmbeddedDatabase``, ``open_embedded``,
``raise_stamp_floor``). ``EmbeddedDatabase`` is the layers stacked: write log, reads, watches,
committer, each a class holding one seam's methods over the one handle's state.
"""

from __future__ import annotations

from .database import EmbeddedDatabase, open_embedded, raise_stamp_floor
from .transaction import EmbeddedTransaction

__all__ = ["EmbeddedDatabase", "EmbeddedTransaction", "open_embedded", "raise_stamp_floor"]
