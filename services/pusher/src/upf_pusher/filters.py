"""ntfy's subscribe filters (``id``, ``message``, ``title``, ``priority``, ``tags``) and the rule that
matches a stored row against them. Pure: no I/O.

ntfy's rule (``types.go`` ``queryFilter.Pass``): the filters apply to ``message`` events only, every
other event passes (``open``, ``keepalive``, ``poll_request``, and the v2.16 ``message_clear`` and
``message_delete``, which name a sequence id and carry no title, priority or tags to match); ``id``,
``message`` and ``title`` match exactly; ``priority`` is a set matched with OR, a message without one
counting as 3 (default); ``tags`` must ALL be among the message's tags.

A session holds a ``Filter`` only when its subscriber asked for one (``session.FilteredSession``): the
rows a read returns are shared by every connection at that cursor, and an unfiltered connection sends
them as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from upf_keyspace import Envelope, Stored, encode_id

__all__ = ["DEFAULT_PRIORITY", "Filter"]

DEFAULT_PRIORITY = 3
"""What a message without a priority (0) counts as: ntfy's "default priority is the same as not set"."""


class Filter(msgspec.Struct, frozen=True, gc=False):
    """What a subscriber asked for; empty fields match everything (``query.parse_filter`` builds it)."""

    id: str = ""
    message: str = ""
    title: str = ""
    priorities: tuple[int, ...] = ()
    """Any of these (OR), sorted, each once (a tuple: 5 items at most, smaller than a set). ntfy's parser
    maps a blank item to 0, which no message has: kept, as it matches nothing."""
    tags: tuple[str, ...] = ()
    """All of these (AND), compared exactly as sent (ntfy does not trim the items of the list)."""

    def passes(self, stamp: bytes, env: Envelope) -> bool:
        """Whether the row at ``stamp`` goes to the subscriber."""
        if env.event and env.event != "message":
            return True  # filters only apply to messages
        if self.id and (env.origin_id or encode_id(stamp)) != self.id:
            return False  # the id the subscriber saw (``wire.message_from_envelope``)
        if self.message and env.message != self.message:
            return False
        if self.title and env.title != self.title:
            return False
        if self.priorities and (env.priority or DEFAULT_PRIORITY) not in self.priorities:
            return False
        return not self.tags or all(t in env.tags for t in self.tags)

    def rows(self, rows: Sequence[Stored]) -> list[Stored]:
        """The rows of one topic that pass, in order."""
        return [r for r in rows if self.passes(r.stamp, r.envelope)]

    def rows_and_topics(self, rows: Sequence[Stored], topics: Sequence[str]) -> tuple[list[Stored], list[str]]:
        """The rows that pass and their topics (a merged catch-up interleaves topics), in order."""
        kept: list[Stored] = []
        kept_topics: list[str] = []
        for row, topic in zip(rows, topics, strict=True):
            if self.passes(row.stamp, row.envelope):
                kept.append(row)
                kept_topics.append(topic)
        return kept, kept_topics
