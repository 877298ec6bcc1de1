from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from chat.merging import MergedStream, MergerFigures, RequestMerger

TOKENS = [f"tok{i}" for i in range(10)]


async def drain(stream: MergedStream[str]) -> list[str]:
    """Every item of `stream`, leaving it afterwards, as a non-streaming caller would."""
    async with stream:
        return [item async for item in stream]


class Generation:
    """A producer that counts its runs and yields one token per `release()`-free tick."""

    def __init__(self, tokens: list[str] = TOKENS, delay: float = 0.005, fail_after: int | None = None) -> None:
        self.tokens, self.delay, self.fail_after = tokens, delay, fail_after
        self.runs = 0
        self.cancelled = False

    async def __call__(self) -> AsyncIterator[str]:
        self.runs += 1
        try:
            for position, token in enumerate(self.tokens):
                if position == self.fail_after:
                    raise RuntimeError("engine failed")
                await asyncio.sleep(self.delay)
                yield token
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def test_twenty_identical_requests_share_one_run() -> None:
    merger: RequestMerger[str] = RequestMerger()
    generation = Generation()
    streams = [merger.run("scope:key", generation) for _ in range(20)]
    replies = await asyncio.gather(*(drain(stream) for stream in streams))
    assert generation.runs == 1
    assert replies == [TOKENS] * 20
    assert [s.leader for s in streams] == [True] + [False] * 19
    assert merger.figures() == MergerFigures(leaders=1, merged=19, merged_paraphrases=0, cancelled=0, in_flight=0)


async def test_late_joiner_gets_the_whole_stream() -> None:
    merger: RequestMerger[str] = RequestMerger()
    generation = Generation()
    first = asyncio.create_task(drain(merger.run("k", generation)))
    await asyncio.sleep(generation.delay * 4)
    late = merger.run("k", generation)
    assert not late.leader
    assert await drain(late) == TOKENS and await first == TOKENS
    assert generation.runs == 1


async def test_one_waiter_cancelled_the_rest_complete() -> None:
    merger: RequestMerger[str] = RequestMerger()
    generation = Generation()
    tasks = [asyncio.create_task(drain(merger.run("k", generation))) for _ in range(5)]
    await asyncio.sleep(generation.delay * 3)
    tasks[0].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert results[1:] == [TOKENS] * 4
    assert generation.runs == 1 and not generation.cancelled


async def test_producer_is_cancelled_when_every_waiter_left() -> None:
    merger: RequestMerger[str] = RequestMerger()
    generation = Generation()
    tasks = [asyncio.create_task(drain(merger.run("k", generation))) for _ in range(3)]
    await asyncio.sleep(generation.delay * 3)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(generation.delay * 2)
    assert generation.cancelled and merger.figures().cancelled == 1 and merger.figures().in_flight == 0
    assert await drain(merger.run("k", generation)) == TOKENS  # a new request starts afresh
    assert generation.runs == 2


async def test_errors_reach_every_waiter() -> None:
    merger: RequestMerger[str] = RequestMerger()
    generation = Generation(fail_after=3)
    streams = [merger.run("k", generation) for _ in range(4)]
    results = await asyncio.gather(*(drain(s) for s in streams), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) and str(r) == "engine failed" for r in results)
    assert merger.figures().in_flight == 0


async def test_different_keys_do_not_merge() -> None:
    merger: RequestMerger[str] = RequestMerger()
    generation = Generation()
    await asyncio.gather(drain(merger.run("a", generation)), drain(merger.run("b", generation)))
    assert generation.runs == 2


async def test_a_flight_has_begun_at_its_first_item_or_at_its_end() -> None:
    merger: RequestMerger[str] = RequestMerger()
    stream = merger.run("k", Generation(delay=0.05))
    assert not stream.began.done()
    await stream.began
    assert merger.run("k", Generation()).began.done()  # a joiner's too: they share the flight
    assert [item async for item in stream] == TOKENS

    failing = merger.run("f", Generation(fail_after=0))  # ends before any item
    await asyncio.wait_for(failing.began, 10)
    assert failing.began.result() is None  # the failure is the stream's to raise, not `began`'s
