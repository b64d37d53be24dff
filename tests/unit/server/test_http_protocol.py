"""``server/http_protocol.py``'s header bound on a keep-alive connection, driven through
uvicorn's real protocol with an in-memory transport: a request whose headers came in full is
never refused for the size of its body, also when the client sent it as soon as it had the
last byte of the previous response, before the app had finished that response (the case the
tests met as "closing a connection whose request headers passed 16384 bytes" on an upload
after a streamed file download)."""

from __future__ import annotations

import asyncio

from uvicorn.config import Config
from uvicorn.lifespan.off import LifespanOff
from uvicorn.server import ServerState

from glmserve.server.http_protocol import MAX_HEADER_BYTES, guarded_protocol


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written, self.closed = b"", False

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _upload_right_after_a_download(finish_first_late: bool) -> Transport:
    """The transport after a GET and then a POST of 48 KiB on one connection (left open)."""
    first_done = asyncio.Event()

    async def app(scope, receive, send):
        size = 0
        while True:
            message = await receive()
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"%d" % size
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body, "more_body": True})
        if scope["method"] == "GET" and finish_first_late:
            await first_done.wait()  # the client has every byte; the app has not finished yet
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    config = Config(app=app, lifespan="off")
    protocol = guarded_protocol(30.0)(config=config, server_state=ServerState(), app_state=LifespanOff(config).state,
                                      _loop=asyncio.get_running_loop())
    transport = Transport()
    protocol.connection_made(transport)
    protocol.data_received(b"GET /file HTTP/1.1\r\nHost: x\r\n\r\n")
    for _ in range(20):
        await asyncio.sleep(0)
    assert transport.written.endswith(b"\r\n\r\n0"), transport.written
    body = b"x" * (3 * MAX_HEADER_BYTES)
    upload = b"POST /files HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    protocol.data_received(upload + body[:1024])  # the next request, before the first response ended
    first_done.set()
    for _ in range(20):
        await asyncio.sleep(0)
    for i in range(1024, len(body), 1024):
        protocol.data_received(body[i:i + 1024])
    for _ in range(20):
        await asyncio.sleep(0)
    return transport


def test_an_upload_sent_before_the_previous_response_ended_is_not_refused():
    transport = asyncio.run(_upload_right_after_a_download(finish_first_late=True))
    assert not transport.closed and b" 431 " not in transport.written
    assert transport.written.endswith(b"\r\n\r\n%d" % (3 * MAX_HEADER_BYTES)), transport.written[-300:]


def test_an_upload_after_a_finished_response_is_not_refused():
    transport = asyncio.run(_upload_right_after_a_download(finish_first_late=False))
    assert not transport.closed and b" 431 " not in transport.written
    assert transport.written.endswith(b"\r\n\r\n%d" % (3 * MAX_HEADER_BYTES)), transport.written[-300:]
