"""Prompts as int32 arrays: 4 bytes a token, checked, hashed and handed to the model without a
Python loop over the tokens."""

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

TokenArray = NDArray[np.int32]
# What callers hand in: an array (a TokenHistory's prompt, ids read from the database), or the
# list they have.
PromptIds = NDArray[np.integer] | Sequence[int]


def as_token_array(prompt_token_ids: PromptIds, vocab_size: int) -> TokenArray:
    """The ids as a one-dimensional int32 array, the caller's own when it is one already; ValueError
    for anything but integer ids in [0, vocab_size)."""
    try:
        ids = np.asarray(prompt_token_ids)
    except (ValueError, TypeError, OverflowError):  # ragged nesting, ints past 64 bits
        ids = np.empty(())
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise ValueError("prompt_token_ids must be a list of integer token ids")
    if not ids.size:
        raise ValueError("prompt_token_ids is empty: a prompt needs at least one token")
    # checked before the cast to int32, which would wrap an id of 2**32 around to 0
    outside = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if outside.size:
        position = int(outside[0])
        raise ValueError(f"token id {ids[position]} at position {position} is outside the vocabulary [0, {vocab_size})")
    return np.ascontiguousarray(ids, dtype=np.int32)
