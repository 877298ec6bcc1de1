"""OpenAI semantics: a client sends the whole conversation with every call. The session whose
messages are exactly the earlier ones continues, from its stored ids, so the prefix cache hits."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from chat.turns import InvalidMessage

# Digests of API conversations kept to find their session again: 10,000 take about 1.5 MB.
MAX_REMEMBERED_TRANSCRIPTS = 10_000


@dataclass(frozen=True)
class ChatMessage:
    role: Literal["user", "assistant"]
    content: str


@dataclass(frozen=True)
class Transcript:
    """A conversation as a client sends it: a system prompt and the messages, the last one the
    question."""

    system_prompt: str
    messages: tuple[ChatMessage, ...]

    def validate(self) -> None:
        if not self.messages or self.messages[-1].role != "user":
            raise InvalidMessage("The last message must be the user's.")
        for index, message in enumerate(self.messages):
            if message.role != ("user" if index % 2 == 0 else "assistant"):
                raise InvalidMessage(
                    "After an optional system message, messages must alternate user, assistant, user, ..."
                )

    @property
    def earlier(self) -> Transcript:
        """The conversation before the question."""
        return Transcript(self.system_prompt, self.messages[:-1])

    def digest(self) -> str:
        return transcript_digest(self.system_prompt, [(m.role, m.content) for m in self.messages])


def transcript_digest(system_prompt: str, messages: Sequence[tuple[str, str]]) -> str:
    digest = hashlib.blake2b(system_prompt.encode(), digest_size=16)
    for role, content in messages:
        digest.update(f"\x00{role}\x00{content.strip()}".encode())
    return digest.hexdigest()


class TranscriptIndex:
    """Which chat an API conversation continues: the digest of the transcript a session has
    reached -> that session's chat id. Bounded: the oldest conversations are forgotten first."""

    def __init__(self, capacity: int = MAX_REMEMBERED_TRANSCRIPTS) -> None:
        self.capacity = capacity
        self._chats: OrderedDict[str, str] = OrderedDict()

    def take(self, transcript: Transcript) -> str | None:
        """The chat whose session has exactly these messages; it leaves the index (the turn that
        continues it remembers where it got to)."""
        return self._chats.pop(transcript.digest(), None)

    def remember(self, system_prompt: str, messages: Sequence[tuple[str, str]], chat_id: str) -> None:
        self._chats[transcript_digest(system_prompt, messages)] = chat_id
        while len(self._chats) > self.capacity:
            self._chats.popitem(last=False)
