"""uvicorn's h11 protocol with deadlines for reading each request and for a client to read the
response.

uvicorn (0.54) times out only an idle connection after a response (timeout_keep_alive).
- A client that connects and never finishes its headers, or its body, held its connection forever
  (60 half-sent requests were all still open after 25 s). Here each request must arrive whole
  within `read_timeout_s` of the connection opening or the previous response; a connection that
  misses the deadline is closed. Once a request is in, the app takes as long as it needs: a reply
  that streams for a minute is not cut.
- A client that stops reading the response held its connection, its request's place in admission
  and, when streaming, its generation: the transport pauses the response once its buffer is full
  and uvicorn waits for it to drain, for ever. Here a response paused for `write_timeout_s` is
  aborted, which the app sees as the client's disconnect.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class DeadlineH11Protocol(H11Protocol):
    read_timeout_s: float = 10.0
    write_timeout_s: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None

    @classmethod
    def with_timeouts(cls, read_timeout_s: float, write_timeout_s: float) -> type[DeadlineH11Protocol]:
        """uvicorn builds the protocol itself, from a class: the timeouts travel on a subclass."""
        return type(cls.__name__, (cls,), {"read_timeout_s": read_timeout_s, "write_timeout_s": write_timeout_s})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_read()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_read()
        self._disarm_write()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is h11.DONE:  # the whole request is in: the rest is the app's time
            self._disarm_read()

    def on_response_complete(self) -> None:
        # Armed first: the next request may already be buffered, and reading it disarms again.
        self._arm_read()
        super().on_response_complete()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._disarm_write()
        self._write_deadline = self.loop.call_later(self.write_timeout_s, self._write_timed_out)

    def resume_writing(self) -> None:
        self._disarm_write()
        super().resume_writing()

    def _arm_read(self) -> None:
        self._disarm_read()
        self._read_deadline = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm_read(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _disarm_write(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def _write_timed_out(self) -> None:
        self._write_deadline = None
        self.transport.abort()  # close() would wait to send the buffer the client does not read
