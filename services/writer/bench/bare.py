BODY = b'{"id":"AAAAAAAAAAIAAAAA","time":1,"expires":2,"event":"message","topic":"bench1","message":"x"}\n'


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        m = await receive()
        more = m.get("more_body", False)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": BODY})
