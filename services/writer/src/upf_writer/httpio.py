"""The request codec and body reader of the writer's Litestar routes (the cold ones; the hot ones are
``front.py``): ``upf_edge``'s, the one copy every front door uses."""

from __future__ import annotations

from upf_edge.asgi import ClientGone, read_body
from upf_edge.http11 import decode_headers, decode_query, header_list

__all__ = ["ClientGone", "decode_headers", "decode_query", "header_list", "read_body"]
