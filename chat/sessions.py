"""Sessions: which one a message belongs to, its history in memory, its rows in the database.

SessionStore is the one owner of session rows: the turn pipeline, the bot's commands, the chat
page and the console all go through it. What it writes for a turn it writes in one unit of work,
and only then changes the history in memory, so a failure leaves neither a half-written turn in
the database nor a history that disagrees with it.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import cast

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from cache.pii import scrub
from chat import session_rows
from chat.compression import Compression
from chat.history import MessageRecord, Role, TokenHistory
from chat.session_rows import SessionDetail, SessionPage
from chat.transcripts import Transcript, transcript_digest
from engine import ChatFormat
from settings import ContextSettings
from storage import (
    Chat,
    ChatRepository,
    ChatSession,
    Database,
    Message,
    MessageRepository,
    NewMessage,
    SessionQuery,
    SessionRepository,
)

# Conversations that arrive as whole transcripts (the OpenAI-compatible API): their sessions are
# found by the transcript's digest.
API_CHANNEL = "api"
# Sessions kept in memory; the least recently used idle ones are reloaded from the database when
# needed. A session with a full 6k-token context takes about 250 KB (a Python int a token).
MAX_SESSIONS_IN_MEMORY = 1000
# The namespace of the sessions' locks among replicas (`ProcessLocks`), and how often a turn
# checks whether another replica's turn of the same session has ended.
SESSION_LOCKS = 1
LOCK_POLL_S = 0.05
# A new API conversation's first question needs only its system prompt framed: the default's 75
# characters take 0.1 ms to tokenize (0.3 us a character), where the hop to a worker thread and back
# took 7 ms at p50 under the peer workload (8 clients). Up to this many characters it is framed on
# the event loop.
OPENING_ON_LOOP_CHARS = 1000


@dataclass(frozen=True)
class Conversation:
    """Who is talking, where: enough to find the session."""

    channel: str
    chat_id: str
    chat_type: str = "p2p"
    user_id: str | None = None
    thread_id: str | None = None


@dataclass
class SessionState:
    """A session in memory. Everything but `lock`, `closed` and `holders` changes only under `lock`
    (`SessionStore.holding`). `closed`: this is no longer the session's live copy (a reset, the
    idle job, evicted from memory, or another replica moved the stored session on). `stored_id`:
    its row; None until its first turn writes it (a new API conversation's, see `SessionStore.open`)."""

    stored_id: int | None
    key: str
    conversation: Conversation
    system_prompt: str
    history: TokenHistory
    next_seq: int
    next_turn: int
    compressions: int
    transcript: list[tuple[str, str]]  # (role, text) of every user and assistant message, for API matching
    by_transcript: bool  # an API session: its transcript's digest is stored, to match the next request
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False
    holders: int = 0  # callers of SessionStore.locked() waiting for the lock or holding it

    @property
    def id(self) -> int:
        assert self.stored_id is not None, "a session's id is read once its first turn is stored"
        return self.stored_id

    def transcript_digest(self) -> str:
        return transcript_digest(self.system_prompt, self.transcript)


@dataclass(frozen=True)
class Persona:
    """Who the bot is in a chat: a name and a manner, set with /persona."""

    name: str
    manner: str

    @classmethod
    def of(cls, chat: Chat) -> Persona | None:
        return None if chat.persona_name is None else cls(chat.persona_name, chat.persona_manner or "")


def with_persona(persona: Persona | None, instructions: str) -> str:
    """The system prompt of a chat's new session: who the bot is first, then the chat's instructions."""
    if persona is None:
        return instructions
    manner = f" {persona.manner}" if persona.manner else ""
    return f"Your name is {persona.name}.{manner}\n\n{instructions}".strip()


@dataclass(frozen=True)
class SessionOverview:
    """One session as the /stats command shows it."""

    session_id: int
    turns: int
    context_tokens: int
    messages_in_context: int
    summaries_in_context: int
    compressions: int
    system_prompt: str


@dataclass(frozen=True)
class SessionCounts:
    in_memory: int
    stored: int
    active: int
    by_channel: dict[str, int]  # stored sessions, by the channel of their chat


class SessionStore:
    def __init__(
        self, db: Database, chat_format: ChatFormat, settings: ContextSettings, capacity: int = MAX_SESSIONS_IN_MEMORY
    ) -> None:
        self.db = db
        self.chat_format = chat_format
        self.settings = settings
        self.capacity = capacity
        self._sessions: OrderedDict[str, SessionState] = OrderedDict()  # least recently used first
        # API conversations by the digest of their transcript so far, newest last: the next request
        # of a conversation in memory finds its session without a query (the table is the fallback).
        self._by_transcript: OrderedDict[str, list[Conversation]] = OrderedDict()
        # Sessions being loaded or created, by key: one load a session, any number of sessions at once.
        self._loading: dict[str, asyncio.Future[SessionState]] = {}
        # A channel whose new sessions offer the model tools: the system prompt with them written in
        # (the Feishu bot's, when the template writes tools).
        self.tools_prompt: dict[str, Callable[[str], str]] = {}

    def key(self, conversation: Conversation) -> str:
        key = f"{conversation.channel}:{conversation.chat_id}"
        if self.settings.session_scope == "user" and conversation.user_id:
            return f"{key}:user:{conversation.user_id}"
        if self.settings.session_scope == "thread" and conversation.thread_id:
            return f"{key}:thread:{conversation.thread_id}"
        return key

    def loaded(self, conversation: Conversation) -> SessionState | None:
        """The conversation's session if it is in memory, without touching the database."""
        return self._sessions.get(self.key(conversation))

    async def open(
        self, conversation: Conversation, seed: Transcript | None = None, *, new: bool = False
    ) -> SessionState:
        """The conversation's active session, loaded or created. `seed`: the earlier conversation
        a new session starts from (an API client's transcript). `new`: nothing is stored for the
        conversation (an API request's own, named by a fresh uuid): its session starts in memory and
        its first turn writes it, with no unit of work before the turn (under load a first turn
        waited 20 ms for one) and none at all if the turn fails."""
        key = self.key(conversation)
        state = self._sessions.get(key)
        if state is not None and not state.closed:
            self._sessions.move_to_end(key)
            return state
        if new and seed is not None and not seed.messages and len(seed.system_prompt) <= OPENING_ON_LOOP_CHARS:
            return self._keep(self._new_state(key, conversation, seed))
        loading = self._loading.get(key)
        if loading is None:
            loading = self._loading[key] = asyncio.ensure_future(self._load(key, conversation, seed, new))
        # Shielded: a caller that gives up (a client gone) does not cancel the others' load.
        return await asyncio.shield(loading)

    async def _load(self, key: str, conversation: Conversation, seed: Transcript | None, new: bool) -> SessionState:
        try:
            if new:
                assert seed is not None, "only an API conversation starts unstored"
                state = await asyncio.to_thread(self._new_state, key, conversation, seed)
            else:
                state = await asyncio.to_thread(self._load_or_create, key, conversation, seed)
            return self._keep(state)
        finally:
            del self._loading[key]

    def _keep(self, state: SessionState) -> SessionState:
        self._sessions[state.key] = state
        self._evict()
        return state

    @asynccontextmanager
    async def locked(
        self,
        conversation: Conversation,
        seed: Transcript | None = None,
        *,
        while_checking: Callable[[SessionState], None] | None = None,
    ) -> AsyncIterator[SessionState]:
        """The active session, under its lock; if it closed while this waited (a reset, an
        eviction), the live one. With `seed` (an API client's conversation before its question):
        the API session whose messages are exactly those if there is one, else a new session for
        `conversation`, seeded from them. `while_checking` is called with each stored copy this
        locks, as the database is asked whether it is behind (see `holding`); a copy it was called
        with and that is not the one yielded was behind, or another request had continued it."""
        new = seed is not None  # an API request's conversation is its own, unless it continues one
        if seed is not None and seed.messages:  # a first question continues nothing
            continued = await self._continued(seed.digest())
            if continued is not None:
                conversation, new = continued, False
        while True:
            state = await self.open(conversation, seed, new=new)
            state.holders += 1
            try:
                checking = None if while_checking is None else functools.partial(while_checking, state)
                async with self.holding(state, while_checking=checking) as current:
                    if not current:
                        continue
                    if seed is not None and state.transcript_digest() != seed.digest():
                        # A request with the same transcript continued the session first: this one
                        # is another branch of the conversation.
                        conversation, new = Conversation(API_CHANNEL, uuid.uuid4().hex), True
                        continue
                    yield state
                    if state.by_transcript:
                        self._remember_transcript(state.transcript_digest(), conversation)
                    return
            finally:
                state.holders -= 1

    @asynccontextmanager
    async def holding(
        self, state: SessionState, *, while_checking: Callable[[], None] | None = None
    ) -> AsyncIterator[bool]:
        """`state`'s lock, and its turn among the replicas on the database (`ProcessLocks`: on
        PostgreSQL, an advisory lock); yields whether `state` is still the session's live and exact copy. A copy
        that another replica moved past (a turn, a compression, a reset, the idle job) is dropped
        from memory, and its next user loads the stored session. `while_checking` is called once
        the locks are held, before the database is asked: one indexed query, 5 ms at p50 through a
        worker thread under load, that the caller may overlap with work it undoes if the copy was
        behind."""
        async with state.lock:
            if state.closed:
                yield False
                return
            if state.stored_id is None:
                # Nothing stored to be behind, and no other replica knows the conversation yet.
                yield True
                return
            # On SQLite every lock is free: no thread hop to learn it (the default pool may be busy).
            shared = self.db.locks.shared
            # Another replica is in this session's turn: no event of this process can say it ended.
            while shared and not await asyncio.to_thread(self.db.locks.try_take, SESSION_LOCKS, state.id):  # noqa: ASYNC110
                await asyncio.sleep(LOCK_POLL_S)
            try:
                if while_checking is not None:
                    while_checking()
                behind = await asyncio.to_thread(self._behind_the_database, state)
                if behind:
                    self._drop(state)
                yield not behind
            finally:
                if shared:
                    await asyncio.to_thread(self.db.locks.release, SESSION_LOCKS, state.id)

    def _drop(self, state: SessionState) -> None:
        state.closed = True
        if self._sessions.get(state.key) is state:
            del self._sessions[state.key]

    async def _continued(self, digest: str) -> Conversation | None:
        """The conversation this transcript continues, if it is not busy. Several clients may hold
        the same transcript (the same questions, answered from the cache): each takes a session of
        its own from memory. A busy one (found in the database after another client took it) is
        not waited for, which would cost that client's whole turn only to learn that this request
        branches off: it starts a session of its own at once."""
        known = self._by_transcript.get(digest)
        if known:
            conversation = known.pop()
            if not known:
                del self._by_transcript[digest]
            return conversation
        chat_id = await asyncio.to_thread(session_rows.chat_with_transcript, self.db, digest)
        if chat_id is None:
            return None
        conversation = Conversation(API_CHANNEL, chat_id)
        state = self._sessions.get(self.key(conversation))
        return None if state is not None and (state.holders or state.lock.locked()) else conversation

    def _remember_transcript(self, digest: str, conversation: Conversation) -> None:
        self._by_transcript.setdefault(digest, []).append(conversation)
        self._by_transcript.move_to_end(digest)
        if len(self._by_transcript) > self.capacity:
            self._by_transcript.popitem(last=False)

    def _evict(self) -> None:
        """Past capacity, the least recently used sessions that no turn, reset or background
        work holds leave memory; their next turn loads them again."""
        excess = len(self._sessions) - self.capacity
        for key, state in list(self._sessions.items()):
            if excess <= 0:
                return
            if state.holders or state.lock.locked():
                continue
            del self._sessions[key]
            state.closed = True  # background work holding it stops; its next turn loads it anew
            excess -= 1

    async def save_turn(
        self,
        state: SessionState,
        question: tuple[str, list[int]],
        answer: tuple[str, list[int]],
        compression: Compression | None,
    ) -> None:
        """The turn's two messages, after the compression it needed if any. Call under the lock."""
        summaries = compression.summaries if compression is not None else []
        user_seq = state.next_seq + len(summaries)
        (question_text, question_ids), (answer_text, answer_ids) = question, answer
        transcript = [*state.transcript, ("user", question_text), ("assistant", answer_text)]
        digest = transcript_digest(state.system_prompt, transcript) if state.by_transcript else None
        await asyncio.to_thread(self._write_turn, state, compression, user_seq, question, answer, digest)
        if compression is not None:
            self._apply(state, compression, compressed=True)
        state.history.append("user", question_ids, text=question_text, turn_index=state.next_turn, seq=user_seq)
        state.history.append("assistant", answer_ids, text=answer_text, turn_index=state.next_turn, seq=user_seq + 1)
        state.transcript = transcript
        state.next_seq = user_seq + 2
        state.next_turn += 1

    async def save_compression(self, state: SessionState, compression: Compression) -> None:
        """A compression made between turns. Call under the lock."""
        await asyncio.to_thread(self._write_context_alone, state, compression, True)
        self._apply(state, compression, compressed=True)

    async def save_summaries(self, state: SessionState, rewritten: Compression) -> None:
        """The model's summaries in place of their stand-ins: the same compression, finished.
        Call under the lock."""
        await asyncio.to_thread(self._write_context_alone, state, rewritten, False)
        self._apply(state, rewritten, compressed=False)

    def _apply(self, state: SessionState, compression: Compression, *, compressed: bool) -> None:
        state.history = compression.history
        state.next_seq += len(compression.summaries)
        state.compressions += compressed

    async def reset(self, conversation: Conversation) -> None:
        """Close the current session (its history stays in the database); the next turn starts anew."""
        async with self.locked(conversation) as state:
            if state.stored_id is not None:
                await asyncio.to_thread(self._close, state.stored_id)
            state.closed = True

    async def set_system_prompt(self, conversation: Conversation, system_prompt: str | None) -> None:
        """Per chat and persisted. The system prompt heads the token history, so a new one starts a
        new session."""
        await asyncio.to_thread(
            self._save_chat, conversation, lambda chats: chats.set_system_prompt(conversation.chat_id, system_prompt)
        )
        await self.reset(conversation)

    async def set_persona(self, conversation: Conversation, persona: Persona | None) -> None:
        """Per chat and persisted; it heads the system prompt, so it too starts a new session."""
        name, manner = (persona.name, persona.manner) if persona else (None, None)
        await asyncio.to_thread(
            self._save_chat, conversation, lambda chats: chats.set_persona(conversation.chat_id, name, manner)
        )
        await self.reset(conversation)

    async def persona(self, conversation: Conversation) -> Persona | None:
        return await asyncio.to_thread(self._persona, conversation)

    def forget(self, session_keys: list[str]) -> None:
        """Drop sessions closed behind the store's back (the idle-session job) from memory."""
        for key in session_keys:
            state = self._sessions.pop(key, None)
            if state is not None:
                state.closed = True

    async def overview(self, conversation: Conversation) -> SessionOverview:
        state = await self.open(conversation)
        records = state.history.records
        return SessionOverview(
            session_id=state.id,
            turns=state.next_turn,
            context_tokens=state.history.num_tokens,
            messages_in_context=sum(1 for record in records if record.role in ("user", "assistant")),
            summaries_in_context=sum(1 for record in records if record.role == "summary"),
            compressions=state.compressions,
            system_prompt=scrub(state.system_prompt),
        )

    # --- reads for the chat page and the console ------------------------------------------------

    async def visible_messages(self, conversation: Conversation) -> list[tuple[str, str]]:
        """(role, text) of the active session's user and assistant messages; none before the first."""
        return await asyncio.to_thread(session_rows.visible_messages, self.db, self.key(conversation))

    async def page(
        self, limit: int, offset: int, *, text: str = "", channel: str | None = None, state: str | None = None
    ) -> SessionPage:
        """The sessions with `text` in their key, chat or messages, of `channel`, in `state` (each
        left out: any), most recently active first."""
        query = SessionQuery(text=text, channel=channel, state=state)
        return await asyncio.to_thread(session_rows.page, self.db, limit, offset, query)

    async def detail(self, session_id: int) -> SessionDetail | None:
        return await asyncio.to_thread(session_rows.detail, self.db, session_id)

    async def counts(self) -> SessionCounts:
        stored, active, by_channel = await asyncio.to_thread(session_rows.counts, self.db)
        return SessionCounts(in_memory=len(self._sessions), stored=stored, active=active, by_channel=by_channel)

    # --- the database (worker threads) -----------------------------------------------------------

    def _load_or_create(self, key: str, conversation: Conversation, seed: Transcript | None) -> SessionState:
        try:
            return self._load_or_create_once(key, conversation, seed)
        except IntegrityError:
            # Another replica created the chat or its active session at the same moment (the
            # unique keys let one win): it is there to load now.
            return self._load_or_create_once(key, conversation, seed)

    def _load_or_create_once(self, key: str, conversation: Conversation, seed: Transcript | None) -> SessionState:
        with self.db.session() as session:
            row = SessionRepository(session).active(key)
            if row is not None:
                return self._loaded(row, conversation, MessageRepository(session).of_session(row.id))
            if seed is None:
                chat = ChatRepository(session).get_or_create(
                    conversation.chat_id, channel=conversation.channel, chat_type=conversation.chat_type
                )
                instructions = self.settings.system_prompt if chat.system_prompt is None else chat.system_prompt
                system_prompt = with_persona(Persona.of(chat), instructions)
                if (with_tools := self.tools_prompt.get(conversation.channel)) is not None:
                    system_prompt = with_tools(system_prompt)
                seed = Transcript(system_prompt, ())
            state = self._new_state(key, conversation, seed)
            state.stored_id = self._insert(session, state)
            return state

    def _loaded(self, row: ChatSession, conversation: Conversation, messages: Sequence[Message]) -> SessionState:
        history = self._opening(row.system_prompt or "")
        for message in session_rows.context_of(row, messages):
            history.append(
                cast(Role, message.role),  # what was stored is what a history held
                message.token_ids,
                text=message.text,
                turn_index=message.turn_index,
                seq=message.seq,
            )
        return SessionState(
            stored_id=row.id,
            key=row.key,
            conversation=conversation,
            system_prompt=row.system_prompt or "",
            history=history,
            next_seq=max((message.seq for message in messages), default=-1) + 1,
            next_turn=max((message.turn_index for message in messages), default=-1) + 1,
            compressions=row.compressions,
            transcript=[(m.role, m.text) for m in messages if m.role in ("user", "assistant")],
            by_transcript=conversation.channel == API_CHANNEL,
        )

    def _new_state(self, key: str, conversation: Conversation, seed: Transcript) -> SessionState:
        """A new session, not yet stored: the seed's messages framed as if it had lived them."""
        history = self._opening(seed.system_prompt)
        transcript: list[tuple[str, str]] = []
        for seq, message in enumerate(seed.messages):
            role, text = cast(Role, message.role), message.content.strip()  # framed: user or assistant
            if role == "user":
                ids = self.chat_format.message("user", text)
            else:
                ids = self.chat_format.reply(self.chat_format.encode(text))
            history.append(role, ids, text=text, turn_index=seq // 2, seq=seq)
            transcript.append((role, text))
        return SessionState(
            stored_id=None,
            key=key,
            conversation=conversation,
            system_prompt=seed.system_prompt,
            history=history,
            next_seq=len(seed.messages),
            next_turn=(len(seed.messages) + 1) // 2,
            compressions=0,
            transcript=transcript,
            by_transcript=conversation.channel == API_CHANNEL,
        )

    def _opening(self, system_prompt: str) -> TokenHistory:
        history = TokenHistory()
        opening = self.chat_format.system(system_prompt)
        if opening:
            history.append("system", opening, text=system_prompt, turn_index=-1, seq=-1)
        return history

    def _insert(self, session: Session, state: SessionState) -> int:
        """Write a session that lived in memory so far: its chat, its row, its messages."""
        conversation = state.conversation
        chat = ChatRepository(session).get_or_create(
            conversation.chat_id, channel=conversation.channel, chat_type=conversation.chat_type
        )
        row = SessionRepository(session).create(state.key, chat_id=chat.id, system_prompt=state.system_prompt)
        if state.by_transcript:
            row.transcript_digest = state.transcript_digest()
        history = state.history
        MessageRepository(session).add(
            row.id, [_new_message(history, record) for record in history.records if record.role != "system"]
        )
        return row.id

    def _behind_the_database(self, state: SessionState) -> bool:
        """Whether the stored session moved on without this copy: closed (a reset, the idle job),
        or messages this copy does not hold (another replica's turn or compression). One indexed
        query a turn; every write of a session goes through its copy under the lock, so a copy
        that is not behind is exact."""
        with self.db.session() as session:
            return SessionRepository(session).progress(state.id) != ("active", state.next_seq, state.compressions)

    def _write_turn(
        self,
        state: SessionState,
        compression: Compression | None,
        user_seq: int,
        question: tuple[str, list[int]],
        answer: tuple[str, list[int]],
        transcript_digest: str | None,
    ) -> None:
        with self.db.session() as session:
            session_id = state.stored_id if state.stored_id is not None else self._insert(session, state)
            if compression is not None:
                _write_context(session, session_id, compression, compressed=True)
            MessageRepository(session).add(
                session_id,
                [
                    NewMessage(user_seq + offset, state.next_turn, role, text, ids)
                    for offset, (role, (text, ids)) in enumerate((("user", question), ("assistant", answer)))
                ],
            )
            SessionRepository(session).touch(session_id, transcript_digest=transcript_digest)
        state.stored_id = session_id  # committed

    def _write_context_alone(self, state: SessionState, compression: Compression, compressed: bool) -> None:
        with self.db.session() as session:
            _write_context(session, state.id, compression, compressed=compressed)

    def _close(self, session_id: int) -> None:
        with self.db.session() as session:
            SessionRepository(session).close(session_id)

    def _save_chat(self, conversation: Conversation, change: Callable[[ChatRepository], None]) -> None:
        with self.db.session() as session:
            chats = ChatRepository(session)
            chats.get_or_create(conversation.chat_id, channel=conversation.channel, chat_type=conversation.chat_type)
            change(chats)

    def _persona(self, conversation: Conversation) -> Persona | None:
        with self.db.session() as session:
            chat = session.get(Chat, conversation.chat_id)
            return None if chat is None else Persona.of(chat)


def _new_message(history: TokenHistory, record: MessageRecord) -> NewMessage:
    return NewMessage(record.seq, record.turn_index, record.role, record.text, history.ids_of(record))


def _write_context(session: Session, session_id: int, compression: Compression, *, compressed: bool) -> None:
    """The new summaries and the context's new layout; `compressed`: count it as a compression."""
    history = compression.history
    MessageRepository(session).add(session_id, [_new_message(history, record) for record in compression.summaries])
    row = SessionRepository(session).get(session_id)
    assert row is not None
    row.context_seqs = [record.seq for record in history.records if record.role != "system"]
    # Everything up to the summaries is decided; later messages follow them.
    row.compacted_through_seq = max(record.seq for record in compression.summaries)
    row.compressions += compressed
