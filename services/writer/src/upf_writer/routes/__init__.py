"""The writer's thin HTTP layer: each handler decodes, calls the pure core (``upf_writer.ingest``),
makes at most one store call and encodes. ``build_route_handlers(ctx)`` returns them all."""

from __future__ import annotations

from litestar.types import ControllerRouterHandler

from ..context import WriterContext
from . import account, ops, publish

__all__ = ["build_route_handlers"]


def build_route_handlers(ctx: WriterContext) -> list[ControllerRouterHandler]:
    return [*publish.build(ctx), *ops.build(ctx), *account.build(ctx)]
