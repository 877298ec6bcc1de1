"""Tensorized conversation history: one growing buffer of token ids plus an index of messages.

A message is tokenized once, when it is appended, together with its chat framing
(`<|im_start|>role\\n ... <|im_end|>\\n`, engine.ChatFormat). The prompt for the next turn is a
slice of the buffer plus the generation prompt, so turn k+1's prompt starts with exactly the ids
of turn k's prompt and reply, and the engine's prefix cache hits on all of it.
"""

from __future__ import annotations

import hashlib
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

# A summary is context the model reads, not a turn: it is framed as a system message.
Role = Literal["system", "user", "assistant", "summary"]


@dataclass
class MessageRecord:
    role: Role
    token_start: int
    token_length: int
    text: str
    turn_index: int
    seq: int
    created_at: float = field(default_factory=time.time)

    @property
    def token_end(self) -> int:
        return self.token_start + self.token_length


class TokenHistory:
    """Append-only token ids of one session's context, with the message index over them.

    The buffer is a Python list: appending is amortized O(1) and never copies earlier tokens,
    and a prompt (the list the engine consumes) is one list copy, about 10 µs for 6k tokens,
    where converting a numpy or array buffer to a list costs 15 times that."""

    def __init__(self) -> None:
        self._ids: list[int] = []
        self.records: list[MessageRecord] = []
        self._digest = b""

    def append(self, role: Role, token_ids: Sequence[int], *, text: str, turn_index: int, seq: int) -> MessageRecord:
        record = MessageRecord(role, len(self._ids), len(token_ids), text, turn_index, seq)
        self._ids.extend(token_ids)
        self.records.append(record)
        if role != "system":
            chained = hashlib.blake2b(self._digest, digest_size=16)
            chained.update(array("i", token_ids).tobytes())
            self._digest = chained.digest()
        return record

    @property
    def num_tokens(self) -> int:
        return len(self._ids)

    @property
    def token_ids(self) -> list[int]:
        """A copy of the whole context."""
        return list(self._ids)

    def ids_of(self, record: MessageRecord) -> list[int]:
        return self._ids[record.token_start : record.token_end]

    def prompt(self, *pending: Sequence[int]) -> list[int]:
        """The whole context followed by `pending` pieces (the new user message, the generation prompt)."""
        ids = self._ids.copy()
        for piece in pending:
            ids.extend(piece)
        return ids

    def context_digest(self) -> str:
        """Identifies the conversation so far, system prompt excluded; '' before the first turn.
        Chained over the messages as they are appended, so it costs nothing per turn."""
        return self._digest.hex()
