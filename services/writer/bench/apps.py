"""Apps for the local throughput check (see README.md): the writer with a no-op store, and the same
work behind an ordinary Litestar route handler, to price the HTTP layer alone.

    granian --interface asgi --workers 1 --port 18090 services.writer.bench.apps:lean      # run from /work/main
"""

from __future__ import annotations

from litestar import Litestar, Request, Response, post

from upf_keyspace import Envelope, Published, Settings, message_from_envelope
from upf_writer import ingest, schemas
from upf_writer.app import create_app
from upf_writer.httpio import decode_headers, decode_query

SETTINGS = Settings()
LIMITS = ingest.Limits.from_settings(SETTINGS)
_STAMP = bytes(12)


class NullStore:
    """Publishes nothing: the answer a store would give, with no I/O."""

    async def publish(self, topic: str, envelope: Envelope, *, idem: str = "") -> Published:
        return Published(_STAMP, envelope, False)

    async def read_after(self, *args: object) -> list[object]:
        return []

    async def close(self) -> None:
        pass


lean = create_app(SETTINGS, NullStore())  # type: ignore[arg-type]


@post("/{topic:str}", status_code=200)
async def routed_publish(topic: str, request: Request) -> Response[bytes]:
    body = await request.body()
    headers = decode_headers(request.scope["headers"])
    query = decode_query(request.scope["query_string"])
    ing = ingest.ingest_publish(topic, headers, query, body, now=0, limits=LIMITS)
    published = await NullStore().publish(ing.topic, ing.envelope)
    return Response(
        schemas.encode(message_from_envelope(published.stamp, ing.topic, published.envelope)),
        media_type="application/json",
    )


routed = Litestar([routed_publish], openapi_config=None, logging_config=None)


def _endpoint_only():  # the writer's plain-function front alone, under the thin ASGI adapter (no Litestar)
    from upf_edge.asgi import serve_asgi
    from upf_writer.context import WriterContext
    from upf_writer.front import WriterFront

    front = WriterFront(WriterContext(SETTINGS, NullStore()))  # type: ignore[arg-type]

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http":
            await serve_asgi(front, scope, receive, send)

    return app


endpoint_only = _endpoint_only()
