from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from cache.embeddings import CachedEmbedder, Embedder
from cache.keys import EMBEDDED_CHARS, embedded_text, scope_key
from cache.levels import CacheLevel
from cache.response_cache import ResponseCache
from settings import CacheSettings
from storage import CacheRepository, Database
from tests.cache.test_embedders import Counting
from tests.support import Clock

pytestmark = pytest.mark.both_databases  # every test here runs on SQLite and on PostgreSQL


SHARED = scope_key("qwen3-0.6b", "You are a helpful assistant.")
# A generous lookup budget: these tests are about what a lookup finds, not how long it may take.
SETTINGS = CacheSettings(capacity=100, ttl_s=3600, evict_fraction=0.01, lookup_budget_ms=60_000)


def make_cache(embedder: Embedder, clock: Clock, db: Database | None = None, **overrides: object) -> ResponseCache:
    return ResponseCache(CacheSettings.model_validate(SETTINGS.model_dump() | overrides), embedder, db, clock=clock)


async def test_l1_hit_on_the_normalized_question(embedder: Embedder, clock: Clock) -> None:
    cache = make_cache(embedder, clock)
    assert await cache.store(SHARED, "北京明天天气怎么样？", "晴，25 度。")
    hit = await cache.lookup(SHARED, "  北京明天天气怎么样 ")
    assert hit is not None and hit.level is CacheLevel.EXACT and hit.answer == "晴，25 度。"
    assert cache.figures().hits_exact == 1


async def test_l2_hit_on_a_paraphrase(embedder: Embedder, clock: Clock) -> None:
    cache = make_cache(embedder, clock)
    await cache.store(SHARED, "如何重置密码", "在设置页点「忘记密码」。")
    hit = await cache.lookup(SHARED, "密码怎么重置？")
    assert hit is not None and hit.level is CacheLevel.SEMANTIC
    assert hit.similarity >= cache.threshold and hit.answer == "在设置页点「忘记密码」。"


async def test_hard_negative_above_the_threshold_is_rejected_by_verification(embedder: Embedder, clock: Clock) -> None:
    cache = make_cache(embedder, clock)
    await cache.store(SHARED, "北京明天会下雨吗", "北京明天：晴。")
    assert await cache.lookup(SHARED, "北京后天会下雨吗") is None  # similarity 0.97
    assert cache.figures().rejected_verify == 1


async def test_judge_has_the_last_word(embedder: Embedder, clock: Clock) -> None:
    asked: list[tuple[str, str]] = []

    async def judge(question_a: str, question_b: str) -> bool:
        asked.append((question_a, question_b))
        return False

    cache = make_cache(embedder, clock)
    cache.judge = judge
    await cache.store(SHARED, "如何重置密码", "在设置页点「忘记密码」。")
    assert await cache.lookup(SHARED, "密码怎么重置？") is None
    assert asked == [("密码怎么重置？", "如何重置密码")]


async def test_a_lookup_in_a_scope_that_holds_nothing_embeds_nothing(embedder: Embedder, clock: Clock) -> None:
    kept = CachedEmbedder(embedder)  # counts what is embedded through it
    cache = make_cache(kept, clock)
    assert await cache.lookup(SHARED, "如何重置密码") is None
    assert len(kept) == 0
    await cache.store(SHARED, "如何重置密码", "在设置页点「忘记密码」。")
    assert len(kept) == 1  # the store embeds what the lookup did not
    hit = await cache.lookup(SHARED, "密码怎么重置？")
    assert hit is not None and hit.level is CacheLevel.SEMANTIC and len(kept) == 2


async def test_follow_up_never_hits_across_contexts(embedder: Embedder, clock: Clock) -> None:
    cache = make_cache(embedder, clock)
    about_einstein = scope_key("qwen3-0.6b", "You are a helpful assistant.", [101, 102, 103])
    about_curie = scope_key("qwen3-0.6b", "You are a helpful assistant.", [101, 102, 104])
    assert not about_einstein.shared and SHARED.shared
    await cache.store(about_einstein, "How old is he?", "Einstein died at 76.")
    assert await cache.lookup(about_curie, "How old is he?") is None
    assert await cache.lookup(SHARED, "How old is he?") is None
    assert (
        await cache.lookup(scope_key("qwen3-8b", "You are a helpful assistant.", [101, 102, 103]), "How old is he?")
        is None
    )
    hit = await cache.lookup(about_einstein, "how old is he")
    assert hit is not None and hit.answer == "Einstein died at 76."


async def test_a_follow_up_is_found_by_its_exact_words_only_and_never_embedded(
    embedder: Embedder, clock: Clock, db: Database
) -> None:
    kept = CachedEmbedder(embedder)  # counts what is embedded through it
    cache = make_cache(kept, clock, db)
    follow_up = scope_key("qwen3-0.6b", "You are a helpful assistant.", [101, 102, 103])
    await cache.store(follow_up, "How old was he?", "Einstein died at 76.")
    assert await cache.lookup(follow_up, "How old was he at his death?") is None  # no L2 in a follow-up's scope
    assert len(kept) == 0
    restarted = make_cache(kept, clock, db)
    assert await restarted.load() == 1
    hit = await restarted.lookup(follow_up, "how old was he")
    assert hit is not None and hit.level is CacheLevel.EXACT and hit.answer == "Einstein died at 76."
    assert await restarted.delete(hit.entry_id) and await restarted.lookup(follow_up, "How old was he?") is None


async def test_pii_request_is_neither_served_nor_cached(embedder: Embedder, clock: Clock) -> None:
    cache = make_cache(embedder, clock)
    question = "我的手机号13812345678为什么收不到验证码"
    assert await cache.lookup(SHARED, question) is None
    assert not await cache.store(SHARED, question, "请检查短信拦截。")
    assert cache.figures().skipped_pii == 1 and cache.figures().entries == 0


async def test_answers_are_scrubbed_before_they_are_stored(embedder: Embedder, clock: Clock) -> None:
    cache = make_cache(embedder, clock)
    await cache.store(SHARED, "客服怎么联系", "请拨打 13812345678 或写信到 help@example.com。")
    hit = await cache.lookup(SHARED, "客服怎么联系")
    assert hit is not None and hit.answer == "请拨打 [PHONE] 或写信到 [EMAIL]。"


async def test_eviction_keeps_the_used_entries(embedder: Embedder, clock: Clock) -> None:
    cache = make_cache(embedder, clock, capacity=3)
    for question in ("What is Docker?", "What is Kubernetes?", "What is Terraform?"):
        await cache.store(SHARED, question, f"answer: {question}")
        clock.advance(10)
    for question in ("What is Docker?", "What is Docker?", "What is Terraform?"):
        assert await cache.lookup(SHARED, question) is not None
    await cache.store(SHARED, "What is Ansible?", "answer: Ansible")
    assert {e.question for e in await cache.entries()} == {"What is Docker?", "What is Terraform?", "What is Ansible?"}
    await cache.store(SHARED, "What is Helm?", "answer: Helm")
    assert {e.question for e in await cache.entries()} == {"What is Docker?", "What is Terraform?", "What is Helm?"}
    assert cache.figures().evictions == 2


async def test_lru_policy_evicts_the_least_recently_used(embedder: Embedder, clock: Clock) -> None:
    cache = make_cache(embedder, clock, capacity=2, policy="lru")
    await cache.store(SHARED, "What is Docker?", "d")
    clock.advance(1)
    await cache.store(SHARED, "What is Kubernetes?", "k")
    clock.advance(1)
    await cache.lookup(SHARED, "What is Docker?")
    clock.advance(1)
    await cache.store(SHARED, "What is Helm?", "h")
    assert {e.question for e in await cache.entries()} == {"What is Docker?", "What is Helm?"}


async def test_ttl_expiry(embedder: Embedder, clock: Clock) -> None:
    cache = make_cache(embedder, clock, ttl_s=60)
    await cache.store(SHARED, "What is Docker?", "d")
    clock.advance(59)
    assert await cache.lookup(SHARED, "What is Docker?") is not None
    clock.advance(2)
    assert await cache.lookup(SHARED, "What is Docker?") is None
    assert await cache.purge_expired() == 1 and cache.figures().entries == 0


async def test_restart_keeps_entries(embedder: Embedder, clock: Clock, db: Database) -> None:
    cache = make_cache(embedder, clock, db)
    await cache.store(SHARED, "如何重置密码", "在设置页点「忘记密码」。")
    await cache.store(SHARED, "What is Docker?", "A container runtime.")
    assert await cache.lookup(SHARED, "What is Docker?") is not None
    await cache.close()  # a hit is saved after its lookup returns, and at the latest at shutdown

    restarted = make_cache(embedder, clock, db)
    assert await restarted.load() == 2
    exact = await restarted.lookup(SHARED, "What is Docker?")
    semantic = await restarted.lookup(SHARED, "密码怎么重置？")
    assert exact is not None and exact.level is CacheLevel.EXACT
    assert semantic is not None and semantic.level is CacheLevel.SEMANTIC
    assert {e.question: e.hits for e in await restarted.entries()} == {"What is Docker?": 2, "如何重置密码": 1}


async def test_a_cut_answer_serves_requests_for_no_more_tokens_even_after_a_restart(
    embedder: Embedder, clock: Clock, db: Database
) -> None:
    cache = make_cache(embedder, clock, db)
    await cache.store(SHARED, "Tell me about Docker.", "Docker is a container", cut_at=5)
    assert await cache.lookup(SHARED, "Tell me about Docker.", max_tokens=5) is not None
    assert await cache.lookup(SHARED, "Tell me about Docker.", max_tokens=6) is None
    assert await cache.lookup(SHARED, "Tell me about Docker.") is None  # a complete answer asked

    restarted = make_cache(embedder, clock, db)
    await restarted.load()
    assert await restarted.lookup(SHARED, "Tell me about Docker.", max_tokens=4) is not None
    assert await restarted.lookup(SHARED, "Tell me about Docker.", max_tokens=64) is None
    await restarted.store(SHARED, "Tell me about Docker.", "Docker is a container runtime.")
    assert await restarted.lookup(SHARED, "Tell me about Docker.", max_tokens=64) is not None


async def test_entries_from_before_cut_answers_were_marked_serve_no_one(
    embedder: Embedder, clock: Clock, tmp_path: Path
) -> None:
    """Earlier versions cached answers cut at max_tokens as complete; which ones is not known."""
    database = Database(f"sqlite:///{tmp_path / 'old.db'}")
    database.upgrade("0005")
    with database.sql_engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO cache_entries (scope, key, question, answer, embedder, embedding, hits, created_at)"
                " VALUES (:scope, 'k', 'What is Docker?', 'A container', :embedder, x'', 0, :created)"
            ),
            {"scope": SHARED.key, "embedder": embedder.name, "created": datetime.fromtimestamp(clock.now, UTC)},
        )
    database.upgrade()
    cache = make_cache(embedder, clock, database)
    assert await cache.load() == 1
    assert await cache.lookup(SHARED, "What is Docker?", max_tokens=1) is None
    database.close()


async def test_load_drops_rows_of_another_embedder_and_expired_rows(
    embedder: Embedder, minilm: Embedder, clock: Clock, db: Database
) -> None:
    await make_cache(minilm, clock, db).store(SHARED, "What is Docker?", "A container runtime.")
    assert await make_cache(embedder, clock, db).load() == 0
    await make_cache(embedder, clock, db, ttl_s=10).store(SHARED, "What is Docker?", "A container runtime.")
    clock.advance(11)
    assert await make_cache(embedder, clock, db, ttl_s=10).load() == 0
    with db.session() as session:
        assert CacheRepository(session).all() == []


async def test_delete_flush_and_admin_listing(embedder: Embedder, clock: Clock, db: Database) -> None:
    cache = make_cache(embedder, clock, db)
    await cache.store(SHARED, "What is Docker?", "d")
    await cache.store(SHARED, "What is Helm?", "h")
    [docker] = await cache.entries("docker")
    assert await cache.delete(docker.id) and not await cache.delete(docker.id)
    assert await cache.lookup(SHARED, "What is Docker?") is None
    assert await cache.flush() == 1 and await cache.entries() == []
    assert await make_cache(embedder, clock, db).load() == 0


async def test_figures_and_the_event_loop_stays_free(embedder: Embedder, clock: Clock) -> None:
    cache = make_cache(embedder, clock)
    await cache.store(SHARED, "What is Docker?", "d")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.gather(*(cache.lookup(SHARED, q) for q in ("What is Docker?", "What is Rust?", "Explain Docker")))
    task.cancel()
    figures = cache.figures()
    assert figures.hits_exact == 1 and figures.hits_exact + figures.hits_semantic + figures.misses == 3
    assert 0 < figures.lookup_ms_p50 <= figures.lookup_ms_p99
    assert ticks > 5  # embedding ran in a thread while the loop kept ticking


async def test_concurrent_lookups_share_a_handful_of_forwards(embedder: Embedder, clock: Clock) -> None:
    cache = make_cache(embedder, clock)
    await cache.store(SHARED, "What is Docker?", "d")
    stored = cache.figures()
    questions = [f"How do I renew the TLS certificate of service {i}?" for i in range(64)]
    hits = await asyncio.gather(*(cache.lookup(SHARED, question) for question in questions))
    figures = cache.figures()
    assert hits == [None] * 64 and figures.misses == 64
    assert figures.embedded_texts - stored.embedded_texts == 64
    # The first lookup's forward starts alone or nearly; the others are embedded together after it.
    assert figures.embed_forwards - stored.embed_forwards <= 4


async def test_lookups_do_not_queue_behind_the_default_thread_pool(
    embedder: Embedder, clock: Clock, db: Database
) -> None:
    cache = make_cache(embedder, clock, db)
    await cache.store(SHARED, "What is Docker?", "d")
    release = threading.Event()
    loop = asyncio.get_running_loop()
    # More blocked units of work than the default pool has threads (at most 32): all of them busy.
    blocked = [loop.run_in_executor(None, release.wait) for _ in range(40)]
    try:
        exact = await asyncio.wait_for(cache.lookup(SHARED, "What is Docker?"), timeout=60)
        semantic = await asyncio.wait_for(cache.lookup(SHARED, "What's Docker?"), timeout=60)
    finally:
        release.set()
        await asyncio.gather(*blocked)
    assert exact is not None and exact.level is CacheLevel.EXACT
    assert semantic is not None and semantic.level is CacheLevel.SEMANTIC
    await cache.close()
    with db.session() as session:
        assert [row.hits for row in CacheRepository(session).all()] == [2]  # saved once the pool was free


async def held_cache(
    embedder: Embedder, clock: Clock, **overrides: object
) -> tuple[threading.Event, Counting, ResponseCache]:
    """A cache that holds "What is Docker?", so that a lookup embeds, and whose next forwards wait
    at the gate until it is set again."""
    gate = threading.Event()
    gate.set()
    held = Counting(embedder, gate)
    cache = make_cache(held, clock, None, **overrides)
    await cache.store(SHARED, "What is Docker?", "d")
    gate.clear()
    held.entered.clear()
    return gate, held, cache


async def test_a_lookup_past_its_budget_misses_and_leaves_the_embedder_s_queue(
    embedder: Embedder, clock: Clock
) -> None:
    gate, held, cache = await held_cache(embedder, clock, lookup_budget_ms=50)
    busy = asyncio.create_task(cache.store(SHARED, "What is Rust?", "r"))  # a forward the gate holds
    assert await asyncio.to_thread(held.entered.wait, 30)
    started = asyncio.get_running_loop().time()
    assert await cache.lookup(SHARED, "What's Docker?") is None
    assert asyncio.get_running_loop().time() - started < 5
    gate.set()
    await busy
    figures = cache.figures()
    assert (figures.over_budget, figures.misses) == (1, 1)
    # It left the queue before a forward took it.
    assert embedded_text("What's Docker?") not in {text for texts in held.asked for text in texts}
    # The embedder is free again: a lookup with time enough hits. This one is not the one timed,
    # and 50 ms is less than an embedding takes on 2 cores busy with other tests' engines.
    cache._budget_s = 30.0
    assert await cache.lookup(SHARED, "What's Docker?") is not None


@pytest.mark.parametrize("race_model", [True, False])
async def test_a_lookup_racing_the_model_misses_once_the_answer_has_begun(
    embedder: Embedder, clock: Clock, race_model: bool
) -> None:
    gate, held, cache = await held_cache(embedder, clock, lookup_budget_ms=60_000, race_model=race_model)
    answering = asyncio.get_running_loop().create_future()  # the generation begun during the lookup
    lookup = asyncio.create_task(cache.lookup(SHARED, "What's Docker?", while_embedding=lambda: answering))
    try:
        assert await asyncio.to_thread(held.entered.wait, 30)  # the question's forward, held
        answering.set_result(None)  # the model's first token
        if race_model:
            assert await asyncio.wait_for(lookup, 10) is None
            assert (cache.figures().outrun, cache.figures().over_budget) == (1, 0)
            return
        await asyncio.sleep(0.1)
        assert not lookup.done()
    finally:
        gate.set()
    hit = await lookup
    assert hit is not None and hit.level is CacheLevel.SEMANTIC
    assert cache.figures().outrun == 0


async def test_a_question_outrun_in_its_forward_is_embedded_once_for_its_lookup_check_and_store(
    embedder: Embedder, clock: Clock
) -> None:
    gate, held, cache = await held_cache(embedder, clock)
    before = num_embedded(held)
    answering = asyncio.get_running_loop().create_future()
    lookup = asyncio.create_task(cache.lookup(SHARED, ASKED, while_embedding=lambda: answering))
    try:
        assert await asyncio.to_thread(held.entered.wait, 30)  # the question's forward, held
        answering.set_result(None)
        assert await asyncio.wait_for(lookup, 10) is None
        assert cache.figures().outrun == 1
    finally:
        gate.set()
    # a paraphrase's check compares with it as it comes, and its store keeps it
    assert await asyncio.wait_for(cache.lookup(SHARED, REWORDED), timeout=30) is None
    assert await cache.paraphrase(SHARED, REWORDED, [ASKED]) == ASKED
    await cache.store(SHARED, ASKED, "晴。")
    assert num_embedded(held) == before + 2
    hit = await cache.lookup(SHARED, ASKED)
    assert hit is not None and hit.level is CacheLevel.EXACT


async def test_the_budget_is_the_whole_lookup_s_so_one_whose_exact_pass_took_it_is_not_embedded(
    embedder: Embedder, clock: Clock
) -> None:
    held = Counting(embedder)
    cache = make_cache(held, clock, lookup_budget_ms=50)
    await cache.store(SHARED, "What is Docker?", "d")
    forwards = len(held.asked)
    with cache._lock:  # a writer holds the entries (a FAISS retrain takes seconds): the exact pass waits
        lookup = asyncio.create_task(cache.lookup(SHARED, "What's Docker?"))
        await asyncio.sleep(0.2)
    assert await lookup is None
    figures = cache.figures()
    assert (figures.over_budget, figures.misses) == (1, 1)
    assert len(held.asked) == forwards


async def test_disabled_cache_does_nothing(embedder: Embedder, clock: Clock) -> None:
    cache = make_cache(embedder, clock, enabled=False)
    assert not await cache.store(SHARED, "What is Docker?", "d")
    assert await cache.lookup(SHARED, "What is Docker?") is None


def test_unknown_embedder_needs_a_calibrated_threshold(embedder: Embedder) -> None:
    with pytest.raises(ValueError, match="calibrate"):
        ResponseCache(CacheSettings(thresholds={}), embedder)


async def test_a_long_message_is_found_by_its_exact_words_and_never_embedded(embedder: Embedder, clock: Clock) -> None:
    cache = make_cache(embedder, clock)
    await cache.store(SHARED, "What is Docker?", "d")  # the scope holds vectors: a lookup would embed
    before = cache.figures()
    log = "\n".join(f"09:00:{second:02d} ERROR [pay-gateway] upstream timeout after 3000 ms" for second in range(3))
    question = f"What went wrong here?\n{log}"
    assert len(question) > EMBEDDED_CHARS and embedded_text(question) is None
    assert await cache.lookup(SHARED, question) is None
    await cache.store(SHARED, question, "The gateway times out.")
    hit = await cache.lookup(SHARED, f"WHAT went wrong here?\n{log}  ")
    assert hit is not None and hit.level is CacheLevel.EXACT
    assert await cache.lookup(SHARED, question.replace("pay-gateway", "order-svc")) is None
    assert await cache.paraphrase(SHARED, question.replace("3000", "9000"), [question]) is None
    assert cache.figures().embedded_texts == before.embedded_texts


ASKED, REWORDED = "北京明天天气怎么样", "明天北京的天气怎么样？"


def num_embedded(embedder: Counting) -> int:
    return sum(len(texts) for texts in embedder.asked)


async def test_a_merge_check_compares_the_vectors_of_the_lookups_and_embeds_none(
    embedder: Embedder, clock: Clock
) -> None:
    counting = Counting(embedder)
    cache = make_cache(counting, clock)
    await cache.store(SHARED, "What is Docker?", "d")  # the scope holds vectors: a lookup embeds
    before = num_embedded(counting)
    # a question its lookup did not embed (its budget ran out) is not compared
    assert await cache.paraphrase(SHARED, REWORDED, [ASKED]) is None
    assert await cache.lookup(SHARED, ASKED) is None
    assert await cache.paraphrase(SHARED, REWORDED, [ASKED]) is None
    assert num_embedded(counting) == before + 1
    assert await cache.lookup(SHARED, REWORDED) is None
    assert await cache.paraphrase(SHARED, REWORDED, [ASKED]) == ASKED
    assert num_embedded(counting) == before + 2  # each question once, by its lookup


async def test_a_first_question_with_nothing_to_compare_is_embedded_ahead_of_its_store(
    embedder: Embedder, clock: Clock
) -> None:
    gate = threading.Event()
    counting = Counting(embedder, gate)
    cache = make_cache(counting, clock)
    # a new scope: the lookup misses without waiting for its question's forward, held at the gate
    assert await asyncio.wait_for(cache.lookup(SHARED, ASKED), timeout=10) is None
    assert await asyncio.to_thread(counting.entered.wait, 10)
    assert await asyncio.wait_for(cache.lookup(SHARED, REWORDED), timeout=10) is None
    # with nothing left of the lookup's budget, a check compares only what is embedded already
    assert await asyncio.wait_for(cache.paraphrase(SHARED, REWORDED, [ASKED], within_s=0), timeout=10) is None
    checking = asyncio.create_task(cache.paraphrase(SHARED, REWORDED, [ASKED]))
    gate.set()
    assert await checking == ASKED  # it joined the embeddings under way
    await cache.store(SHARED, ASKED, "晴。")
    assert num_embedded(counting) == 2


async def test_replicas_follow_what_the_others_store_replace_and_delete(
    embedder: Embedder, clock: Clock, db: Database
) -> None:
    first, second = make_cache(embedder, clock, db), make_cache(embedder, clock, db)
    await first.load()
    await second.load()
    await first.store(SHARED, "如何重置密码", "在设置页点「忘记密码」。")
    await first.store(SHARED, "How do I book a meeting room?", "In the calendar, pick Rooms.")
    assert await second.lookup(SHARED, "如何重置密码") is None  # not followed yet

    assert await second.sync() == 2
    exact = await second.lookup(SHARED, "如何重置密码")
    semantic = await second.lookup(SHARED, "密码怎么重置？")
    assert exact is not None and exact.level is CacheLevel.EXACT
    assert semantic is not None and semantic.level is CacheLevel.SEMANTIC and semantic.answer == exact.answer

    await first.store(SHARED, "如何重置密码", "Use the self-service portal.")  # the same key, replaced
    [room] = await first.entries("book a meeting room")
    assert await first.delete(room.id)
    await second.store(SHARED, "Where is the canteen?", "On the ground floor.")  # stored meanwhile: kept
    assert await second.sync() == 3  # the replaced entry out and its successor in, the deleted one out
    replaced = await second.lookup(SHARED, "如何重置密码")
    assert replaced is not None and replaced.answer == "Use the self-service portal."
    assert await second.lookup(SHARED, "How do I book a meeting room?") is None
    assert await second.lookup(SHARED, "Where is the canteen?") is not None
    assert await second.sync() == 0
    assert await first.sync() == 1  # the canteen


async def test_an_entrys_id_is_never_reused(embedder: Embedder, clock: Clock, db: Database) -> None:
    """Replicas follow the table by the highest id they have read: a new row always goes past it."""
    cache = make_cache(embedder, clock, db)
    await cache.store(SHARED, "first question", "first answer")
    [entry] = await cache.entries()
    assert await cache.delete(entry.id)
    await cache.store(SHARED, "second question", "second answer")
    [successor] = await cache.entries()
    assert successor.id > entry.id
