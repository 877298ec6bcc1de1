"""The serve-first start-up's last step, in process: the loaded heap leaves the collector."""

from __future__ import annotations

import asyncio
import gc

from starlette.applications import Starlette
from starlette.types import Message

from web.starting import StartingApp


async def test_once_the_app_has_started_what_it_loaded_is_frozen_out_of_the_collector() -> None:
    gc.unfreeze()
    received: asyncio.Queue[Message] = asyncio.Queue()
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    def failed() -> None:
        raise AssertionError("the app did not start")

    await received.put({"type": "lifespan.startup"})
    lifespan = asyncio.create_task(StartingApp(Starlette, failed)({"type": "lifespan"}, received.get, send))
    try:
        async with asyncio.timeout(30):
            while gc.get_freeze_count() == 0:  # noqa: ASYNC110 - no event says the heap was frozen
                await asyncio.sleep(0.01)
        assert gc.get_freeze_count() > 10_000  # pytest's own heap, at least
    finally:
        await received.put({"type": "lifespan.shutdown"})
        await lifespan
        gc.unfreeze()
    assert sent == [{"type": "lifespan.startup.complete"}, {"type": "lifespan.shutdown.complete"}]
