"""The ceiling app: a bare ASGI callable answering ``POST /{topic}`` with a fixed JSON message of the
same shape and size as UPF's publish reply. Served by granian exactly as the writer is (one worker,
HTTP/1, no websockets): ``granian --interface asgi --working-dir bench bare_asgi:app``. It runs with the
collector policy of UPF's roles (upf_edge.gcpolicy), set at import, so the ratio compares like with like."""

import gc

gc.freeze()
gc.set_threshold(20_000, 10, 10)

BODY = (
    b'{"id":"AAAAAAAAAAIAAAAAAAAA","time":1764450000,"expires":1766869200,"event":"message",'
    b'"topic":"upBENCH0000000","message":"lg:0:0:abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz'
    b'0123456789abcdefghijklmnopqrstuvwxyz0"}\n'
)
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope, receive, send):
    if scope["type"] != "http":  # lifespan: granian carries on without it
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
