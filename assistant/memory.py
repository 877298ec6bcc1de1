"""Long-term memory: the facts a person asked the bot to keep, or that the model distilled from a
closed session, recalled by meaning with their next questions.

A memory belongs to one owner: a private chat, or one person in one group. Nothing crosses
owners: recall searches the owner's own FAISS index, and a turn that carries memories is never
served from nor stored in the shared response cache (`ChatManager.turn(notes=...)`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import numpy as np
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from cache.embeddings import Embedder
from cache.index import VectorIndex
from chat import Conversation
from settings import AssistantSettings
from storage import Database, Memory

log = logging.getLogger(__name__)

T = TypeVar("T")

# Owners whose index stays in memory; one of 200 facts is 200 x 384 floats (300 KB).
MAX_INDEXES_IN_MEMORY = 1000

# "remember that my desk is 4F-12", "please remember: ...", 「记住我的工位是4F-12」, 「帮我记一下…」.
# Anchored at the start, so "do you remember when we met?" is a question, not a request; and in
# English "that" or a colon must follow, so "remember the number 7" stays a word to the model.
_REMEMBER = re.compile(
    r"^\s*(?:(?:please|pls)\s+)?remember(?:\s+that\s|\s*:)\s*(?P<en>.+)$"
    r"|^\s*(?:请|麻烦)?(?:你)?(?:帮我)?(?:记住|记一下|记下)(?:一下)?\s*[:：,，]?\s*(?P<zh>.+)$",
    re.IGNORECASE | re.DOTALL,
)


class MemoryRefused(ValueError):
    """A fact the store will not keep; the text is meant for the user."""


@dataclass(frozen=True)
class MemoryRecord:
    number: int  # 1.. in the order they were saved: what /memory shows and /forget takes
    id: int
    text: str
    source: str
    created_at: datetime


@dataclass(frozen=True)
class MemoryCounts:
    memories: int
    owners: int


def owner_of(conversation: Conversation) -> str:
    """A private chat is its one person's; in a group, each person has their own memories."""
    owner = f"{conversation.channel}:{conversation.chat_id}"
    if conversation.chat_type == "p2p" or not conversation.user_id:
        return owner
    return f"{owner}:user:{conversation.user_id}"


def fact_to_remember(text: str) -> str | None:
    """The fact in a plain request to remember one, or None for anything else."""
    match = _REMEMBER.match(text)
    if match is None:
        return None
    fact = (match["en"] or match["zh"]).strip()
    if not fact or fact.endswith(("?", "？")):
        return None  # "remember what I said?" asks, it does not tell
    return fact


@dataclass
class _OwnerIndex:
    version: tuple[int, int]  # (count, largest id) of the owner's rows it was built from
    index: VectorIndex
    texts: dict[int, str]


class MemoryStore:
    """The memories' rows are the truth: an owner's index is rebuilt when the rows changed (another
    replica, or this one), checked with one indexed count per recall."""

    def __init__(
        self,
        db: Database,
        embedder: Embedder,
        settings: AssistantSettings,
        claim_cpu: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        """`claim_cpu`: the engine's, held while a recall embeds its question, which the turn
        waits for as it waits for a cache lookup's (engine/cpu_claim.py)."""
        self.db = db
        self.embedder = embedder
        self.settings = settings
        self.claim_cpu = claim_cpu
        self._indexes: OrderedDict[str, _OwnerIndex] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()  # the indexes, touched from worker threads
        # Saves and recalls embed, and the embedder takes one call at a time (15-50 ms each on 2
        # cores). In the default thread pool, the calls waiting for it held its workers, which
        # every turn's database units of work need: a burst of messages from people with
        # memories would queue the turns behind the embedder.
        self._embedding = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memory")

    def close(self) -> None:
        """Stops the embedding thread; a call on it still running finishes, unawaited."""
        self._embedding.shutdown(wait=False, cancel_futures=True)

    async def save(self, owner: str, text: str, source: str = "asked") -> MemoryRecord:
        text = " ".join(text.split())
        if not text:
            raise MemoryRefused("There is nothing to remember: say what, e.g. `/remember my desk is 4F-12`.")
        if len(text) > self.settings.max_memory_chars:
            raise MemoryRefused(
                f"That is too long to remember ({len(text)} characters; at most {self.settings.max_memory_chars})."
            )
        return await self._embedding_thread(self._save, owner, text, source)

    async def memories(self, owner: str) -> list[MemoryRecord]:
        return await asyncio.to_thread(self._list, owner)

    async def forget(self, owner: str, number: int) -> MemoryRecord | None:
        """The memory numbered `number` in the owner's list, deleted; None if there is none."""
        return await asyncio.to_thread(self._forget, owner, number)

    async def forget_all(self, owner: str) -> int:
        return await asyncio.to_thread(self._forget_all, owner)

    async def recall(self, owner: str, question: str) -> list[str]:
        """The owner's memories closest in meaning to `question`, closest first."""
        if self.settings.recall_memories == 0:
            return []
        return await self._embedding_thread(self._recall, owner, question)

    async def counts(self) -> MemoryCounts:
        return await asyncio.to_thread(self._counts)

    async def _embedding_thread(self, work: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._embedding, work, *args)

    # --- worker threads ---------------------------------------------------------------------------

    def _save(self, owner: str, text: str, source: str) -> MemoryRecord:
        embedding = self.embedder.encode([text])[0]
        with self.db.session() as session:
            rows = _rows(session, owner)
            for number, row in enumerate(rows, 1):
                if row.text == text:
                    return _record(number, row)
            if len(rows) >= self.settings.max_memories:
                raise MemoryRefused(
                    f"I keep at most {self.settings.max_memories} memories for you: `/forget N` one first."
                )
            row = Memory(
                owner=owner, text=text, source=source, embedder=self.embedder.name, embedding=embedding.tobytes()
            )
            session.add(row)
            session.flush()
            return _record(len(rows) + 1, row)

    def _list(self, owner: str) -> list[MemoryRecord]:
        with self.db.session() as session:
            return [_record(number, row) for number, row in enumerate(_rows(session, owner), 1)]

    def _forget(self, owner: str, number: int) -> MemoryRecord | None:
        with self.db.session() as session:
            rows = _rows(session, owner)
            if not 1 <= number <= len(rows):
                return None
            row = rows[number - 1]
            session.delete(row)
            return _record(number, row)

    def _forget_all(self, owner: str) -> int:
        with self.db.session() as session:
            return len(session.execute(delete(Memory).where(Memory.owner == owner).returning(Memory.id)).all())

    def _recall(self, owner: str, question: str) -> list[str]:
        owner_index = self._index(owner)
        if owner_index is None:
            return []
        with self.claim_cpu():
            vector = self.embedder.encode([question])[0]
        with self._lock:
            found = owner_index.index.search(vector, self.settings.recall_memories)
        minimum = self.settings.recall_min_similarity
        return [owner_index.texts[memory_id] for memory_id, similarity in found if similarity >= minimum]

    def _index(self, owner: str) -> _OwnerIndex | None:
        with self.db.session() as session:
            count, largest = session.execute(
                select(func.count(Memory.id), func.coalesce(func.max(Memory.id), 0)).where(Memory.owner == owner)
            ).one()
            if count == 0:
                return None
            with self._lock:
                known = self._indexes.get(owner)
                if known is not None and known.version == (count, largest):
                    self._indexes.move_to_end(owner)
                    return known
            rows = _rows(session, owner)
        owner_index = self._build(rows, (count, largest))
        with self._lock:
            self._indexes[owner] = owner_index
            while len(self._indexes) > MAX_INDEXES_IN_MEMORY:
                self._indexes.popitem(last=False)
        return owner_index

    def _build(self, rows: list[Memory], version: tuple[int, int]) -> _OwnerIndex:
        # A fact embedded by another embedder (the setting changed) is embedded again, in memory.
        stale = [row for row in rows if row.embedder != self.embedder.name]
        fresh = dict(zip((row.id for row in stale), self.embedder.encode([row.text for row in stale]), strict=True))
        vectors = np.stack([fresh.get(row.id, np.frombuffer(row.embedding, dtype=np.float32)) for row in rows])
        # Flat: an owner's few hundred facts never reach an approximate index's size.
        index = VectorIndex(self.embedder.dim, approx_min_entries=1_000_000, nprobe=1)
        index.add([row.id for row in rows], vectors.astype(np.float32))
        return _OwnerIndex(version, index, {row.id: row.text for row in rows})

    def _counts(self) -> MemoryCounts:
        with self.db.session() as session:
            memories, owners = session.execute(
                select(func.count(Memory.id), func.count(func.distinct(Memory.owner)))
            ).one()
        return MemoryCounts(memories=memories, owners=owners)


def _rows(session: Session, owner: str) -> list[Memory]:
    return list(session.scalars(select(Memory).where(Memory.owner == owner).order_by(Memory.id)))


def _record(number: int, row: Memory) -> MemoryRecord:
    return MemoryRecord(number=number, id=row.id, text=row.text, source=row.source, created_at=row.created_at)
