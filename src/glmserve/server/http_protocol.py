"""uvicorn's HTTP/1.1 protocol on httptools (llhttp, in C), with a deadline and a size bound for
request headers.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but waits forever for
headers that trickle in (a "slowloris" client holds its connection and socket as long as it
likes), and on httptools it buffers a request's headers without a bound. Here a connection that
has begun a request must deliver its complete headers within ``header_timeout`` seconds
(nginx's ``client_header_timeout``), or it is closed; and headers still incomplete past
``max_header_bytes`` (uvicorn's h11 default, 16 KiB; the bytes read since the request began, so a
read holding headers and the start of the body counts whole when the headers do not end in it)
are answered with 431 and the connection closed. The body's deadline is the app's
(``server/limits.py``), since the app is what waits for it.

httptools rather than uvicorn's h11 protocol: h11's state machine is Python run for every SSE
chunk, which ``benchmarks/serving_overhead.py`` counts per streamed token; vLLM's server runs on
httptools too.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("glmserve.http")

MAX_HEADER_BYTES = 16 * 1024
LINGER_S = 2.0
_TOO_LARGE = (b'{"error":{"message":"the request\'s headers are larger than the server accepts",'
              b'"type":"invalid_request_error","param":null,"code":"request_header_fields_too_large"}}')


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """See module docstring; ``header_timeout`` is set by ``guarded_protocol``."""

    header_timeout: float = 30.0
    max_header_bytes: int = MAX_HEADER_BYTES

    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes: int | None = 0  # bytes read while a request's headers are incomplete; None: complete
    _message_open = False  # a request is being parsed: its first byte came, its last not yet
    _refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_bytes = 0
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._refused:  # the rest of a refused request: read and dropped until the lingering close
            return
        if self._header_bytes is not None:
            self._header_bytes += len(data)
        super().data_received(data)
        if self._header_bytes is None:
            self._disarm_header_timer()
        elif self._header_bytes > self.max_header_bytes and not self.transport.is_closing():
            self._refuse_headers()
        else:
            self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._message_open = True
        if self._header_bytes is None:  # pipelined: began within a read that held the last request's end
            self._header_bytes = 0

    def on_message_complete(self) -> None:
        self._message_open = False
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # the next bytes begin a request, unless the next request is being read already: a
        # client may send it once it has the response's last byte, before the app has finished
        # (its body must not count as headers)
        if self._header_bytes is None and not self._message_open:
            self._header_bytes = 0

    def on_headers_complete(self) -> None:
        self._header_bytes = None
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _refuse_headers(self) -> None:
        """431, then a lingering close (nginx's): the answer and a FIN go out, what the client
        still sends is dropped for ``LINGER_S``, then the connection closes (closed at once, the
        unread bytes would reset it and the client could lose the answer)."""
        log.info("closing a connection whose request headers passed %d bytes", self.max_header_bytes)
        self._disarm_header_timer()
        if self.cycle is not None and not self.cycle.response_complete:  # a response is still going out
            self.transport.close()
            return
        self._refused = True
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_TOO_LARGE), _TOO_LARGE))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None and not self.transport.is_closing():
            self._header_timer = self.loop.call_later(self.header_timeout, self._header_timeout_expired)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout_expired(self) -> None:
        self._header_timer = None
        if self._header_bytes is not None and not self.transport.is_closing() and (
                self.cycle is None or self.cycle.response_complete):
            log.info("closing a connection whose request headers did not arrive within %.0f s", self.header_timeout)
            self.transport.close()


def guarded_protocol(header_timeout: float) -> type[HttpToolsProtocol]:
    """The protocol class to pass to ``uvicorn.run(http=...)``."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"header_timeout": header_timeout})
