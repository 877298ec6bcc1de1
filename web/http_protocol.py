"""uvicorn's h11 protocol with a deadline for reading each request.

uvicorn (0.54) times out only an idle connection after a response (timeout_keep_alive); a client
that connects and never finishes its headers, or its body, holds its connection forever (60
half-sent requests were all still open after 25 s). Here each request must arrive whole within
`read_timeout_s` of the connection opening or the previous response; a connection that misses the
deadline is closed. Once a request is in, the app takes as long as it needs: a reply that streams
for a minute is not cut."""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class ReadTimeoutH11Protocol(H11Protocol):
    read_timeout_s: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None

    @classmethod
    def with_timeout(cls, read_timeout_s: float) -> type[ReadTimeoutH11Protocol]:
        """uvicorn builds the protocol itself, from a class: the timeout travels on a subclass."""
        return type(cls.__name__, (cls,), {"read_timeout_s": read_timeout_s})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is h11.DONE:  # the whole request is in: the rest is the app's time
            self._disarm()

    def on_response_complete(self) -> None:
        # Armed first: the next request may already be buffered, and reading it disarms again.
        self._arm()
        super().on_response_complete()

    def _arm(self) -> None:
        self._disarm()
        self._read_deadline = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if not self.transport.is_closing():
            self.transport.close()
