"""OpenAI semantics: a client sends the whole conversation with every call. The session whose
messages are exactly the earlier ones continues, from its stored ids, so the prefix cache hits.
Sessions are found by the digest of their transcript, stored on the session's row
(`SessionStore`), so a conversation resent after a restart continues its session too."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from chat.turns import InvalidMessage, require_unicode


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
        require_unicode(self.system_prompt, "The system prompt")
        for index, message in enumerate(self.messages):
            if message.role != ("user" if index % 2 == 0 else "assistant"):
                raise InvalidMessage(
                    "After an optional system message, messages must alternate user, assistant, user, ..."
                )
            require_unicode(message.content, f"Message {index}")

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
