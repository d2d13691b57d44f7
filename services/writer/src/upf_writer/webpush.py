"""The writer's Web Push adapter: the VAPID policy of a publish and RFC 8030's reply.

The checks themselves are pure (``upf_edge.vapid``); this module applies the settings to them:
- a Web Push publish's VAPID token is always verified and counted by outcome
  (``upf.writer.vapid.checks``); it is refused (401 40191) only with ``UPF_VAPID_VERIFY=1``, so the
  default stays as permissive as ntfy (a wrong ``UPF_PUBLIC_URL`` would otherwise cut off every app
  server at once);
- with ``UPF_VAPID_RESTRICT=1`` every publish to a topic bound to a VAPID key must carry that key,
  verified (else 401 40192), and the first verified key to publish to an unbound topic binds it.
A Web Push publish is answered 201 with ``Location`` and ``TTL`` (RFC 8030 section 5), the ntfy
message JSON as its body.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from upf_edge import NtfyError, Reply
from upf_edge.vapid import OUTCOMES, VapidVerifier, parse_credentials
from upf_keyspace import Settings, Store
from upf_keyspace import telemetry as tm

from .ingest import VAPID_INVALID, VAPID_KEY_REFUSED, Ingested

__all__ = ["WebPushPolicy", "webpush_reply"]

ABSENT = "absent"
"""The outcome of a Web Push publish without VAPID credentials (RFC 8030 does not require them)."""


class WebPushPolicy:
    """One per writer front: the verifier (and its cache), the settings and the outcome counter."""

    __slots__ = ("verifier", "verify", "restrict", "_outcomes")

    def __init__(self, settings: Settings, registry: tm.Registry) -> None:
        self.verifier = VapidVerifier(settings.public_url)
        self.verify = settings.vapid_verify
        self.restrict = settings.vapid_restrict
        family = registry.counter(
            "upf.writer.vapid.checks",
            "VAPID credentials of Web Push publishes checked, by outcome (ok, absent, or why they failed)",
            attributes=("outcome",),
        )
        self._outcomes = {o: family.cell(o) for o in (*OUTCOMES, ABSENT)}

    def verified_key(self, ingested: Ingested, headers: Mapping[str, str], now: float) -> tuple[str | None, bool]:
        """(the publish's VAPID key when its token verifies, whether it sent credentials that do not);
        with verification on, the latter is 401 40191 here."""
        if not ingested.webpush:
            return None, False
        creds = parse_credentials(headers.get("authorization"), headers.get("crypto-key"))
        if creds is None:
            self._outcomes[ABSENT].add()
            return None, False
        outcome = self.verifier.verify(creds, now)
        self._outcomes[outcome].add()
        if outcome == "ok":
            return creds.key, False
        if self.verify:
            raise NtfyError(VAPID_INVALID)
        return None, True

    async def admit(self, store: Store, ingested: Ingested, headers: Mapping[str, str], now: float) -> None:
        """Raise the 401 this publish gets, if any; with restriction on, bind an unbound topic."""
        key, invalid = self.verified_key(ingested, headers, now)
        if self.restrict and not await store.vapid_admit(ingested.topic, key, bind=key is not None):
            raise NtfyError(VAPID_INVALID if invalid else VAPID_KEY_REFUSED)


class _Kept(msgspec.Struct):
    """What the reply's ``Location`` and ``TTL`` are read from: the message as stored (a replay's is
    the original's), ``expires`` absent when it is never kept (``X-Cache: no``)."""

    id: str = ""
    time: int = 0
    expires: int = 0


_kept_decoder = msgspec.json.Decoder(_Kept)


def webpush_reply(public_url: str, ingested: Ingested, payload: bytes, extra: tuple[tuple[bytes, bytes], ...]) -> Reply:
    """RFC 8030 section 5: 201 Created, ``Location`` naming the message, ``TTL`` the retention kept
    (0 for a message kept for no one offline, ``X-Cache: no``)."""
    kept = _kept_decoder.decode(payload)
    ttl = max(kept.expires - kept.time, 0)
    headers = (
        (b"location", f"{public_url}/{ingested.topic}/m/{kept.id}".encode()),
        (b"ttl", str(ttl).encode()),
        *extra,
    )
    return Reply(201, payload, headers)
