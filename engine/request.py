"""What a caller hands in, checked and made into a Sequence plus the detokenizer for its text."""

import itertools
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from .detokenizer import IncrementalDetokenizer
from .outputs import RequestOutput, StreamDelta
from .sampling_params import SamplingParams
from .sequence import Sequence
from .token_ids import PromptIds, TokenArray, as_token_array

SEED_MASK = (1 << 63) - 1

OutputCallback = Callable[[StreamDelta, RequestOutput | None], None]


@dataclass(eq=False)
class Request:
    """A sequence and what its caller gets from it: text, and deltas through `callback`."""

    seq: Sequence
    detokenizer: IncrementalDetokenizer
    callback: OutputCallback | None


def checked_params(params: SamplingParams | None) -> SamplingParams:
    """`params` (the defaults for None), validated again: a caller may have changed a field."""
    params = SamplingParams() if params is None else params
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
    params.validate()
    return params


class InputProcessor:
    """Checks a request in the caller's thread (ValueError, before anything is queued), then
    numbers and seeds it. Safe to call from any thread."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self._arrivals = itertools.count()

    def process(
        self,
        prompt_token_ids: PromptIds,
        params: SamplingParams | None,
        request_id: str | None,
        priority: int | None,
        callback: OutputCallback | None,
    ) -> Request:
        params = checked_params(params)
        token_ids = self.validate_prompt(prompt_token_ids)
        if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        seq = Sequence(
            request_id=uuid.uuid4().hex if request_id is None else str(request_id),
            prompt_token_ids=token_ids,
            params=params,
            priority=params.priority if priority is None else priority,
            arrival=next(self._arrivals),
            seed=(random.getrandbits(63) if params.seed is None else params.seed) & SEED_MASK,
        )
        return Request(seq, IncrementalDetokenizer(self.tokenizer, params.stop), callback)

    def validate_prompt(self, prompt_token_ids: PromptIds) -> TokenArray:
        """The prompt as the int32 array the engine keeps: the caller's own when it is one, so it
        must not change while the request runs (a TokenHistory's prompt is a new array)."""
        token_ids = as_token_array(prompt_token_ids, self.vocab_size)
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens; this engine takes at most {self.max_model_len - 1} "
                f"(max_model_len {self.max_model_len}, leaving room for one generated token)"
            )
        return token_ids
