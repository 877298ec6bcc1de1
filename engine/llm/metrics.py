import statistics
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass

from .outputs import RequestOutput


@dataclass
class StepRecord:
    end_time: float
    duration_s: float
    num_seqs: int
    num_batched_tokens: int
    num_generated_tokens: int


class EngineMetrics:
    """The engine's figures for the admin console. Written by the engine thread, read by anyone."""

    def __init__(self, window_s: float = 60.0, history: int = 4096) -> None:
        self.window_s = window_s
        self.start_time = time.monotonic()
        self.lock = threading.Lock()
        self.steps: deque[StepRecord] = deque(maxlen=history)
        self.ttfts: deque[float] = deque(maxlen=history)
        self.finish_reasons: Counter[str] = Counter()
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.num_steps = 0

    def record_step(self, duration_s: float, num_seqs: int, num_batched_tokens: int, num_generated_tokens: int) -> None:
        with self.lock:
            self.steps.append(
                StepRecord(time.monotonic(), duration_s, num_seqs, num_batched_tokens, num_generated_tokens)
            )
            self.num_steps += 1
            self.num_generated_tokens += num_generated_tokens

    def record_finished(self, output: RequestOutput) -> None:
        with self.lock:
            self.finish_reasons[output.finish_reason] += 1
            self.num_prompt_tokens += output.num_prompt_tokens
            if output.ttft_s is not None:
                self.ttfts.append(output.ttft_s)

    def as_dict(self) -> dict:
        now = time.monotonic()
        with self.lock:
            recent = [s for s in self.steps if s.end_time >= now - self.window_s]
            ttfts = sorted(self.ttfts)
            finish_reasons = dict(self.finish_reasons)
            totals = {
                "steps": self.num_steps,
                "prompt_tokens": self.num_prompt_tokens,
                "generated_tokens": self.num_generated_tokens,
            }
        busy_s = sum(s.duration_s for s in recent)
        generated = sum(s.num_generated_tokens for s in recent)
        return {
            "uptime_s": now - self.start_time,
            "totals": totals,
            "finish_reasons": finish_reasons,
            "ttft_s": {
                "count": len(ttfts),
                "mean": statistics.fmean(ttfts) if ttfts else None,
                "p50": _percentile(ttfts, 0.50),
                "p95": _percentile(ttfts, 0.95),
            },
            "window_s": self.window_s,
            "generation_tokens_per_s": generated / min(self.window_s, now - self.start_time) if recent else 0.0,
            "busy_tokens_per_s": generated / busy_s if busy_s else 0.0,
            "batch_size": {
                "last": recent[-1].num_seqs if recent else 0,
                "mean": statistics.fmean(s.num_seqs for s in recent) if recent else 0.0,
                "max": max((s.num_seqs for s in recent), default=0),
                "mean_tokens": statistics.fmean(s.num_batched_tokens for s in recent) if recent else 0.0,
            },
        }


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
