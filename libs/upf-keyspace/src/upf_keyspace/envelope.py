"""The stored message: what a publish puts in Q and a pusher turns into a frame.

Evolution rules (the store outlives any one release, and old and new roles read the same rows):
- The envelope is encoded as a msgpack *array* (``array_like=True``): fields are positional, so new
  fields go last, always with a default, and no field is ever removed, renamed or retyped.
- ``ENVELOPE_VERSION`` goes up by one with every appended field; a reader ignores trailing fields it
  does not know (msgspec does this for array_like structs with defaults) and fills defaults for
  fields an older writer did not write.
- A change that cannot follow these rules needs a new FormatVersion (see format.py), not an edit here.
"""

from __future__ import annotations

import msgspec

__all__ = ["ENVELOPE_VERSION", "Envelope", "decode_envelope", "encode_envelope"]

ENVELOPE_VERSION = 3
"""1: the first release. 2: ``published_ms`` appended. 3: the newer ntfy and Web Push fields appended
(``event`` through ``poll_id``)."""


class Envelope(msgspec.Struct, frozen=True, array_like=True, omit_defaults=False):
    """One published message, stored verbatim; the id is not stored, it is the Q key's versionstamp."""

    time: int
    """Unix seconds at ingest (the ntfy ``time`` field)."""
    expires: int
    """Unix seconds after which the janitor may delete it."""
    message: str
    """Text, or standard base64 of a binary body when ``encoding == "base64"``."""
    encoding: str = ""
    title: str = ""
    priority: int = 0
    tags: tuple[str, ...] = ()
    click: str = ""
    icon: str = ""
    content_type: str = ""
    traceparent: str = ""
    """W3C trace context of the publish, so a delivery span can link to it across processes."""
    idem: str = ""
    """The publisher's idempotency key, kept so the janitor can clear its marker on expiry."""
    published_ms: int = 0
    """Unix milliseconds (the writer's wall clock) just before the publish's transaction was submitted;
    0 when written by an envelope-1 writer. A pusher measures delivery latency from it (that span
    includes the commit; the writer's commit latency is its own metric), across hosts only as well as
    their clocks agree."""
    event: str = ""
    """ntfy's event name when it is not ``message``: ``message_clear``, ``message_delete`` (by sequence
    id) or ``poll_request``."""
    sequence_id: str = ""
    """ntfy's sequence id (``X-Sequence-ID``): a later message with the same one replaces the
    notification on the device."""
    nocache: bool = False
    """``X-Cache: no``: delivered to subscribers connected when it lands, never replayed."""
    origin_id: str = ""
    """The id the publisher was given, when it is not the Q key's (a scheduled message enters Q at
    its delivery time, under a later versionstamp)."""
    urgency: str = ""
    """Web Push ``Urgency`` (very-low, low, normal, high), kept as sent."""
    push_topic: str = ""
    """Web Push ``Topic``: a newer message with the same one replaces this one while undelivered."""
    actions: str = ""
    """ntfy's action buttons, as the JSON array text a subscriber receives."""
    attach_url: str = ""
    """An external attachment URL (``X-Attach``); UPF stores no attachment bodies."""
    attach_name: str = ""
    poll_id: str = ""
    """``X-Poll-ID``: the id a ``poll_request`` event carries."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Envelope)


def encode_envelope(env: Envelope) -> bytes:
    return _encoder.encode(env)


def decode_envelope(raw: bytes) -> Envelope:
    return _decoder.decode(raw)
