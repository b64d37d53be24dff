"""uvicorn's HTTP/1.1 (h11) protocol with a deadline for request headers.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) and bounds a header's size
(``h11_max_incomplete_event_size``), but waits forever for headers that trickle in (a
"slowloris" client holds its connection and socket as long as it likes). Here a connection
that has begun a request must deliver its complete headers within ``header_timeout`` seconds
(nginx's ``client_header_timeout``), or it is closed. The body's deadline is the app's
(``server/limits.py``), since the app is what waits for it.
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("glmserve.http")


class HeaderTimeoutH11Protocol(H11Protocol):
    header_timeout: float = 30.0

    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # a request's headers are still incomplete
            self._arm_header_timer()
        else:
            self._disarm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None and not self.transport.is_closing():
            self._header_timer = self.loop.call_later(self.header_timeout, self._header_timeout_expired)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout_expired(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing() and (
                self.cycle is None or self.cycle.response_complete):
            log.info("closing a connection whose request headers did not arrive within %.0f s", self.header_timeout)
            self.transport.close()


def protocol_with_header_timeout(seconds: float) -> type[H11Protocol]:
    """The protocol class to pass to ``uvicorn.run(http=...)``."""
    return type("HeaderTimeoutH11Protocol", (HeaderTimeoutH11Protocol,), {"header_timeout": seconds})
