import time
from dataclasses import dataclass, field
from enum import Enum, auto

import numpy as np

from .outputs import FinishReason
from .sampling_params import SamplingParams
from .token_ids import TokenArray


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass(eq=False)
class Sequence:
    """One request: its tokens, where their KV lives, and how far the model has got.

    The prompt stays the int32 array the caller handed in, never copied into a list; the ids
    generated, a few hundred appended one at a time, go to a list.
    """

    request_id: str
    prompt_token_ids: TokenArray
    params: SamplingParams
    priority: int
    arrival: int
    seed: int
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    # tokens proposed for the positions after the last one, computed and verified in this step
    draft_token_ids: list[int] = field(default_factory=list)
    # how many of the last draft's tokens the sampler kept; None before any draft
    num_accepted_draft_tokens: int | None = None
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def token_ids(self, start: int, end: int) -> TokenArray:
        """Tokens [start, end): a view of the prompt, or a new array where generated ids come in
        (a preempted sequence computes them again)."""
        num_prompt_tokens = self.num_prompt_tokens
        if end <= num_prompt_tokens:
            return self.prompt_token_ids[start:end]
        generated = np.array(
            self.output_token_ids[max(start - num_prompt_tokens, 0) : end - num_prompt_tokens], np.int32
        )
        if start >= num_prompt_tokens:
            return generated
        return np.concatenate((self.prompt_token_ids[start:], generated))

    def token_id(self, position: int) -> int:
        num_prompt_tokens = self.num_prompt_tokens
        if position < num_prompt_tokens:
            return int(self.prompt_token_ids[position])
        return self.output_token_ids[position - num_prompt_tokens]

    @property
    def sort_key(self) -> tuple[int, int]:
        return self.priority, self.arrival

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self.output_token_ids.append(token_id)
