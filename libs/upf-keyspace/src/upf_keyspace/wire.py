"""The ntfy message object as it goes on the wire, shared by the writer (publish reply) and the pusher
(stream frames). Field order is ntfy's; empty fields are omitted as ntfy omits them, except the
fields ntfy always sends (id, time, event, topic).

``event`` is ``message`` unless the envelope names another (``message_clear``, ``message_delete``,
``poll_request``); ``sequence_id`` is sent only when the publisher gave one (a client takes the ``id``
otherwise); a message not to be cached (``nocache``: ``X-Cache: no``, a poll request) has no
``expires``, as in ntfy.
"""

from __future__ import annotations

import msgspec

from .envelope import Envelope
from .msgid import encode_id

__all__ = ["Attachment", "Message", "message_from_envelope", "encode_json"]


class Attachment(msgspec.Struct, frozen=True):
    """ntfy's ``attachment`` object for an external URL (``X-Attach``): ``name`` and ``url`` always sent;
    ``type``, ``size`` and ``expires`` exist only for uploaded files, which UPF does not store."""

    name: str
    url: str


_NO_ACTIONS = msgspec.Raw()


class Message(msgspec.Struct, frozen=True, omit_defaults=True):
    """Every field has a default, so ``message_from_envelope`` can pass its fields by position: with
    ``kw_only`` (the only way to give defaults to some fields and not to the ones between them) a
    delivery's 17 keywords cost 1.1 us against 0.4 by position. The four fields ntfy always sends
    default to values no message has (an empty id, event or topic, time 0), so they are never omitted."""

    id: str = ""
    sequence_id: str = ""
    time: int = 0
    expires: int = 0
    event: str = ""
    topic: str = ""
    title: str = ""
    message: str = ""
    priority: int = 0
    tags: tuple[str, ...] = ()
    click: str = ""
    icon: str = ""
    poll_id: str = ""
    actions: msgspec.Raw = _NO_ACTIONS
    """ntfy's action buttons: the envelope's JSON array text, sent as it was stored."""
    attachment: Attachment | None = None
    content_type: str = ""
    encoding: str = ""


def message_from_envelope(stamp: bytes, topic: str, env: Envelope) -> Message:
    """A released scheduled message keeps the id its publisher was given (``origin_id``); an
    ``X-Cache: no`` one has no ``expires`` (ntfy's wire form: it is never kept)."""
    # By position, in the field order above (see ``Message``).
    return Message(
        env.origin_id or encode_id(stamp),
        env.sequence_id,
        env.time,
        0 if env.nocache else env.expires,
        env.event or "message",
        topic,
        env.title,
        env.message,
        env.priority,
        env.tags,
        env.click,
        env.icon,
        env.poll_id,
        msgspec.Raw(env.actions.encode()) if env.actions else _NO_ACTIONS,
        Attachment(env.attach_name, env.attach_url) if env.attach_url else None,
        env.content_type,
        env.encoding,
    )


_json_encoder = msgspec.json.Encoder()


def encode_json(obj: msgspec.Struct) -> bytes:
    return _json_encoder.encode(obj)
