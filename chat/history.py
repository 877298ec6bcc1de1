"""Tensorized conversation history: one growing int32 buffer of token ids plus an index of messages.

A message is tokenized once, when it is appended, together with its chat framing
(`<|im_start|>role\\n ... <|im_end|>\\n`, engine.ChatFormat). The prompt for the next turn is a
slice of the buffer plus the generation prompt, so turn k+1's prompt starts with exactly the ids
of turn k's prompt and reply, and the engine's prefix cache hits on all of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from engine import PromptIds, TokenArray

# A summary is context the model reads, not a turn: it is framed as a system message.
Role = Literal["system", "user", "assistant", "summary"]

# Doubling would leave up to half the buffer unused: 8 bytes a token at worst, 6 on average.
# Growing by an eighth keeps it under 4.5 and is still amortized O(1): each token is copied about
# 8 times over the buffer's life, a memcpy of 24 KB at 6,000 tokens, about 2 µs.
GROWTH = 1 / 8
MIN_CAPACITY = 256


@dataclass(slots=True)
class MessageRecord:
    role: Role
    token_start: int
    token_length: int
    text: str
    turn_index: int
    seq: int

    @property
    def token_end(self) -> int:
        return self.token_start + self.token_length


class TokenHistory:
    """Append-only token ids of one session's context, with the message index over them.

    The ids live in an int32 buffer, 4 bytes a token where a list of Python ints takes 36. What it
    hands out are views or new arrays, never lists: the buffer is append-only, so a view's tokens
    never change, and when the buffer grows the views keep the old one alive.
    """

    def __init__(self) -> None:
        self._buffer: TokenArray = np.empty(0, np.int32)
        self._num_tokens = 0
        self.records: list[MessageRecord] = []
        self._digest = b""

    def append(self, role: Role, token_ids: PromptIds, *, text: str, turn_index: int, seq: int) -> MessageRecord:
        start, end = self._num_tokens, self._num_tokens + len(token_ids)
        if end > len(self._buffer):
            self._grow(end)
        self._buffer[start:end] = token_ids
        self._num_tokens = end
        record = MessageRecord(role, start, end - start, text, turn_index, seq)
        self.records.append(record)
        if role != "system":
            chained = hashlib.blake2b(self._digest, digest_size=16)
            chained.update(self._buffer[start:end].data)
            self._digest = chained.digest()
        return record

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def nbytes(self) -> int:
        """Memory the ids hold, the buffer's unused end included."""
        return self._buffer.nbytes

    @property
    def token_ids(self) -> TokenArray:
        """The whole context, read-only."""
        return self._view(0, self._num_tokens)

    def ids_of(self, record: MessageRecord) -> TokenArray:
        """One message's ids, read-only."""
        return self._view(record.token_start, record.token_end)

    def prompt(self, *pending: Sequence[int]) -> TokenArray:
        """A new array: the whole context followed by `pending` pieces (the new user message, the
        generation prompt). One copy in C, about 3 µs for 6,000 tokens."""
        ids = np.empty(self._num_tokens + sum(map(len, pending)), np.int32)
        ids[: self._num_tokens] = self._buffer[: self._num_tokens]
        start = self._num_tokens
        for piece in pending:
            ids[start : start + len(piece)] = piece
            start += len(piece)
        return ids

    def context_digest(self) -> str:
        """Identifies the conversation so far, system prompt excluded; '' before the first turn.
        Chained over the messages' int32 bytes as they are appended, so it costs nothing per turn."""
        return self._digest.hex()

    def _view(self, start: int, end: int) -> TokenArray:
        view = self._buffer[start:end]
        view.flags.writeable = False
        return view

    def _grow(self, num_tokens: int) -> None:
        capacity = max(num_tokens, MIN_CAPACITY, len(self._buffer) + int(len(self._buffer) * GROWTH))
        buffer = np.empty(capacity, np.int32)
        buffer[: self._num_tokens] = self._buffer[: self._num_tokens]
        self._buffer = buffer
