"""UPF's transactional operations. Each takes the transaction first so that it composes into larger
transactions; none has a side effect outside the transaction (the body may run more than once)."""

from . import affinity, auth, inbox, janitor, limits, meta, publish, read, schedule, stats, vapid

__all__ = ["affinity", "auth", "inbox", "janitor", "limits", "meta", "publish", "read", "schedule", "stats", "vapid"]
