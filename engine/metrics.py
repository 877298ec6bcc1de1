import statistics
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass

from .kv_pool import KVPoolFigures


@dataclass(frozen=True)
class StepRecord:
    end_time: float
    duration_s: float
    num_seqs: int
    num_batched_tokens: int
    num_generated_tokens: int


@dataclass(frozen=True)
class TTFTFigures:
    count: int
    mean: float | None
    p50: float | None
    p95: float | None


@dataclass(frozen=True)
class BatchFigures:
    last: int
    mean: float
    max: int
    mean_tokens: float


@dataclass(frozen=True)
class DraftFigures:
    """Speculative decoding's draft tokens since start: proposed, and accepted by the sampler."""

    proposed: int
    accepted: int


@dataclass(frozen=True)
class ActivityFigures:
    """What the step loop did: totals since start, rates over the last `window_s`."""

    uptime_s: float
    steps: int
    prompt_tokens: int
    generated_tokens: int
    draft_tokens: DraftFigures
    finish_reasons: dict[str, int]
    ttft_s: TTFTFigures
    window_s: float
    generation_tokens_per_s: float
    busy_tokens_per_s: float
    batch_size: BatchFigures


@dataclass(frozen=True)
class RequestFigures:
    running: int
    waiting: int
    preemptions: int


@dataclass(frozen=True)
class EngineFigures:
    model: str
    num_parameters: int | None  # None: a model server's, not known here
    is_demo_model: bool
    device: str
    dtype: str
    max_model_len: int
    requests: RequestFigures
    kv_cache: KVPoolFigures
    activity: ActivityFigures


class EngineMetrics:
    """Written by the engine thread, read by anyone: `lock` guards every field."""

    def __init__(self, window_s: float = 60.0, history: int = 4096) -> None:
        self.window_s = window_s
        self.start_time = time.monotonic()
        self.lock = threading.Lock()
        self.steps: deque[StepRecord] = deque(maxlen=history)
        self.ttfts: deque[float] = deque(maxlen=history)
        self.finish_reasons: Counter[str] = Counter()
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.num_draft_tokens = 0
        self.num_accepted_draft_tokens = 0
        self.num_steps = 0

    def record_step(
        self,
        duration_s: float,
        num_seqs: int,
        num_batched_tokens: int,
        num_generated_tokens: int,
        num_draft_tokens: int = 0,
        num_accepted_draft_tokens: int = 0,
    ) -> None:
        with self.lock:
            self.steps.append(
                StepRecord(time.monotonic(), duration_s, num_seqs, num_batched_tokens, num_generated_tokens)
            )
            self.num_steps += 1
            self.num_generated_tokens += num_generated_tokens
            self.num_draft_tokens += num_draft_tokens
            self.num_accepted_draft_tokens += num_accepted_draft_tokens

    def record_finished(self, finish_reason: str, num_prompt_tokens: int, ttft_s: float | None) -> None:
        with self.lock:
            self.finish_reasons[finish_reason] += 1
            self.num_prompt_tokens += num_prompt_tokens
            if ttft_s is not None:
                self.ttfts.append(ttft_s)

    def figures(self) -> ActivityFigures:
        now = time.monotonic()
        with self.lock:
            recent = [s for s in self.steps if s.end_time >= now - self.window_s]
            ttfts = sorted(self.ttfts)
            finish_reasons = dict(self.finish_reasons)
            steps, prompt_tokens, generated_tokens = self.num_steps, self.num_prompt_tokens, self.num_generated_tokens
            draft_tokens = DraftFigures(self.num_draft_tokens, self.num_accepted_draft_tokens)
        busy_s = sum(s.duration_s for s in recent)
        generated = sum(s.num_generated_tokens for s in recent)
        return ActivityFigures(
            uptime_s=now - self.start_time,
            steps=steps,
            prompt_tokens=prompt_tokens,
            generated_tokens=generated_tokens,
            draft_tokens=draft_tokens,
            finish_reasons=finish_reasons,
            ttft_s=TTFTFigures(
                count=len(ttfts),
                mean=statistics.fmean(ttfts) if ttfts else None,
                p50=_percentile(ttfts, 0.50),
                p95=_percentile(ttfts, 0.95),
            ),
            window_s=self.window_s,
            generation_tokens_per_s=generated / min(self.window_s, now - self.start_time) if recent else 0.0,
            busy_tokens_per_s=generated / busy_s if busy_s else 0.0,
            batch_size=BatchFigures(
                last=recent[-1].num_seqs if recent else 0,
                mean=statistics.fmean(s.num_seqs for s in recent) if recent else 0.0,
                max=max((s.num_seqs for s in recent), default=0),
                mean_tokens=statistics.fmean(s.num_batched_tokens for s in recent) if recent else 0.0,
            ),
        )


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
