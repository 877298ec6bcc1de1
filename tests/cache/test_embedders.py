import asyncio
import threading

import numpy as np
import pytest

from cache.embeddings import BatchingEmbedder, CachedEmbedder, Embedder
from engine.cpu_claim import CpuClaim


class Counting:
    """The real embedder, noting what each forward is asked; with `gate`, a forward waits for it."""

    def __init__(self, embedder: Embedder, gate: threading.Event | None = None) -> None:
        self.embedder = embedder
        self.name, self.dim = embedder.name, embedder.dim
        self.gate = gate
        self.asked: list[list[str]] = []
        self.entered = threading.Event()  # set as a forward begins
        self.claim = CpuClaim()  # what an engine's claim_cpu holds
        self.claimed: list[bool] = []  # whether each forward ran under the claim

    def encode(self, texts: list[str]) -> np.ndarray:
        self.asked.append(list(texts))
        self.claimed.append(self.claim.is_held)
        self.entered.set()
        if self.gate is not None:
            self.gate.wait()
        return self.embedder.encode(texts)


@pytest.mark.parametrize("name", ["embedder", "minilm"])
def test_batched_normalized_float32(name: str, request: pytest.FixtureRequest) -> None:
    embedder: Embedder = request.getfixturevalue(name)
    texts = ["How do I reset my password?", "How can I reset my password", "What is the capital of France?"]
    vectors = embedder.encode(texts)
    assert vectors.shape == (3, embedder.dim) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    assert embedder.encode([]).shape == (0, embedder.dim)


def test_e5_separates_chinese_paraphrases_from_unrelated_questions(embedder: Embedder) -> None:
    a, paraphrase, unrelated = embedder.encode(["如何重置密码", "密码怎么重置", "今天股市怎么样"])
    assert a @ paraphrase > 0.93 > 0.86 > a @ unrelated


def test_cached_embedder_embeds_a_text_once_and_keeps_the_newest(embedder: Embedder) -> None:
    counting = Counting(embedder)
    asked = counting.asked
    cached = CachedEmbedder(counting, capacity=2)
    vectors = cached.encode(["年假怎么申请", "VPN 连不上", "年假怎么申请"])
    assert asked == [["年假怎么申请", "VPN 连不上"]]
    assert np.allclose(vectors, embedder.encode(["年假怎么申请", "VPN 连不上", "年假怎么申请"]), atol=1e-6)
    cached.encode(["VPN 连不上", "打印机怎么连接"])
    assert asked[-1] == ["打印机怎么连接"]  # the two newest stay: the first question left
    cached.encode(["年假怎么申请"])
    assert asked[-1] == ["年假怎么申请"]


async def test_concurrent_callers_share_forwards_and_each_gets_its_row(embedder: Embedder) -> None:
    counting = Counting(embedder)
    batching = BatchingEmbedder(counting, max_batch=8, window_s=0.002)
    texts = [f"How do I configure service number {i}?" for i in range(20)]
    vectors = await asyncio.gather(*(batching.embed(text) for text in [*texts, *texts[:5]]))
    assert [len(forward) for forward in counting.asked] == [8, 8, 4]  # 25 callers, 20 texts, 3 forwards
    assert batching.forwards == 3 and batching.texts == 20
    assert np.allclose(np.stack(vectors), embedder.encode([*texts, *texts[:5]]), atol=1e-5)


async def test_lookups_fill_a_batch_before_stores(embedder: Embedder) -> None:
    counting = Counting(embedder)
    batching = BatchingEmbedder(counting, max_batch=2, window_s=0)
    stores = [asyncio.create_task(batching.embed(text, urgent=False)) for text in ("store 1", "store 2")]
    lookups = [asyncio.create_task(batching.embed(text)) for text in ("lookup 1", "lookup 2")]
    await asyncio.gather(*stores, *lookups)
    assert counting.asked == [["lookup 1", "lookup 2"], ["store 1", "store 2"]]


async def test_a_forward_with_a_lookup_claims_the_cpu_and_a_store_alone_does_not(embedder: Embedder) -> None:
    counting = Counting(embedder)
    batching = BatchingEmbedder(counting, max_batch=8, window_s=0, claim_cpu=counting.claim.held)
    await batching.embed("a store", urgent=False)
    await asyncio.gather(batching.embed("a lookup"), batching.embed("another store", urgent=False))
    assert counting.asked == [["a store"], ["a lookup", "another store"]]
    assert counting.claimed == [False, True]
    assert not counting.claim.is_held


async def test_a_caller_joins_the_forward_of_its_text_and_the_rest_wait_for_the_next(embedder: Embedder) -> None:
    gate = threading.Event()
    counting = Counting(embedder, gate)
    batching = BatchingEmbedder(counting, max_batch=8, window_s=0)
    first = asyncio.create_task(batching.embed("VPN 连不上"))
    while not counting.asked:  # noqa: ASYNC110 - the forward has begun, in the embedder's thread
        await asyncio.sleep(0.001)
    again = asyncio.create_task(batching.embed("VPN 连不上"))
    other = asyncio.create_task(batching.embed("打印机怎么连接"))
    await asyncio.sleep(0)
    gate.set()
    vectors = await asyncio.gather(first, again, other)
    assert counting.asked == [["VPN 连不上"], ["打印机怎么连接"]]
    assert np.array_equal(vectors[0], vectors[1])


async def test_a_text_whose_callers_left_is_not_embedded(embedder: Embedder) -> None:
    counting = Counting(embedder)
    batching = BatchingEmbedder(counting, max_batch=8, window_s=0)
    gone = asyncio.create_task(batching.embed("年假怎么申请"))
    stays = asyncio.create_task(batching.embed("VPN 连不上"))
    await asyncio.sleep(0)  # both are waiting; the batch is not taken yet
    gone.cancel()
    await stays
    assert counting.asked == [["VPN 连不上"]]
    assert gone.cancelled()


async def timed(embedder: Embedder) -> tuple[Counting, BatchingEmbedder, float]:
    """A BatchingEmbedder that has timed one forward: it knows its seconds a text."""
    counting = Counting(embedder)
    batching = BatchingEmbedder(counting, max_batch=8, window_s=0)
    await batching.embed("a forward to time")
    assert batching.seconds_per_text is not None and batching.seconds_per_text > 0
    return counting, batching, batching.seconds_per_text


async def test_a_lookup_the_queue_ahead_cannot_serve_in_time_is_refused_at_once(embedder: Embedder) -> None:
    counting, batching, per_text = await timed(embedder)
    texts = [f"How do I configure service number {i}?" for i in range(5)]
    # two texts fit in 2.5 texts' time; the third would end after its caller's deadline
    calls = [asyncio.create_task(batching.embed(text, within_s=2.5 * per_text)) for text in texts]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert [type(result).__name__ for result in results] == ["ndarray"] * 2 + ["EmbedderBusy"] * 3
    embedded = [text for forward in counting.asked for text in forward]
    assert not set(texts[2:]) & set(embedded)  # refused before any work was spent on them
    stored = await batching.embed(texts[4])  # a caller that waits for ever is never refused
    assert np.allclose(stored, embedder.encode([texts[4]])[0], atol=1e-5)


async def test_a_batch_stops_growing_where_it_would_end_after_a_deadline_in_it(embedder: Embedder) -> None:
    counting, batching, per_text = await timed(embedder)
    store = asyncio.create_task(batching.embed("a store waits for ever", urgent=False))
    soon = asyncio.create_task(batching.embed("a lookup that waits 1.5 texts' time", within_s=1.5 * per_text))
    later = asyncio.create_task(batching.embed("a lookup that waits 10 texts' time", within_s=10 * per_text))
    await asyncio.gather(store, soon, later)
    assert counting.asked[1:] == [
        ["a lookup that waits 1.5 texts' time"],  # with a second text it would end too late
        ["a lookup that waits 10 texts' time", "a store waits for ever"],
    ]
