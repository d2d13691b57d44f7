"""upf-edge: what the roles' front doors share.

- ``upf_edge.http11``: the HTTP/1.1 request-head codec (parse a head, decode its fields, build replies);
- ``upf_edge.errors``: ntfy's one error type and the builder of its JSON body;
- ``upf_edge.handler``: the plain-function contract a role's hot routes implement, so any front door
  (UPF's own asyncio server, or ``upf_edge.asgi`` under granian) calls them with no framework between;
- ``upf_edge.frontdoor``: UPF's own HTTP/1.1 server (the writer's alone, and the pusher's on a subclass
  that adds the subscribe routes), with ``upf_edge.asgi_bridge`` for a role's fallback ASGI app;
- ``upf_edge.limits`` / ``upf_edge.limiter``: ntfy's request limit (visitor, exemptions, the client behind
  a trusted proxy, the 429) and the adapter that leases each visitor's fleet-wide tokens from the store;
- ``upf_edge.ops``: the ops endpoints every role serves (health, heartbeats, version, metrics), as one
  such handler.

Stable surface: everything in ``__all__``. Names with a leading underscore are internal.
"""

from .errors import ErrorBody, NtfyError, Problem, error_body
from .handler import JSON, NO_BODY, Handler, Reply

__version__ = "0.1.0"

__all__ = ["ErrorBody", "Handler", "JSON", "NO_BODY", "NtfyError", "Problem", "Reply", "error_body"]
