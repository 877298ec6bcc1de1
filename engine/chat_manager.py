"""ChatManager: one turn of one conversation, end to end.

    history -> response cache (L1, L2) -> request merging -> compression if needed
    -> LLMEngine.stream -> reply streamed to the caller -> persisted -> history append

Turns of one session run strictly in order (a lock per session); sessions run concurrently.
Everything a turn writes is written in one unit of work after the reply is complete; only then
does the in-memory history change, so a failure leaves neither a half-written turn in the
database nor a history that disagrees with it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
import time
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from engine.cache import ResponseCache, Scope, l1_key, scope_key
from engine.compression import (
    CompressionConfig,
    needs_compression,
    plan_compression,
    summarize_spans,
)
from engine.embeddings import Embedder
from engine.history import ChatFormat, MessageRecord, TokenHistory
from engine.llm import LLMEngine, SamplingParams, StreamDelta
from engine.merging import RequestMerger
from engine.pii import scrub
from sqlalchemy.orm import Session

from storage import ChatRepository, Database, MessageRepository, SessionRepository, utcnow

log = logging.getLogger(__name__)

CacheLevel = Literal["exact", "semantic", "merged"]

MAX_REMEMBERED_TRANSCRIPTS = 10_000

JUDGE_PROMPT = (
    "You decide whether two questions ask for the same answer. They do not if they differ in a "
    "place, a person, a number, a date, a negation or a direction. Reply with yes or no only."
)

SUMMARIZER_PROMPT = (
    "You condense conversations. Summarize the conversation below in a few sentences. "
    "Keep names, numbers, facts, decisions and open questions; drop greetings and filler."
)


Speaker = Literal["system", "user", "assistant"]


class InvalidMessage(ValueError):
    """A message the bot will not take; the text is meant for the user."""


@dataclass(frozen=True)
class Conversation:
    """Who is talking, where: enough to find the session."""

    channel: str
    chat_id: str
    chat_type: str = "p2p"
    user_id: str | None = None
    thread_id: str | None = None


@dataclass(frozen=True)
class ChatMessage:
    role: Speaker
    content: str


@dataclass(frozen=True)
class Transcript:
    """A conversation as a client sends it (OpenAI semantics): a system prompt and the messages."""

    system_prompt: str
    messages: tuple[ChatMessage, ...]

    def digest(self) -> str:
        return transcript_digest(self.system_prompt, [(m.role, m.content) for m in self.messages])


def transcript_digest(system_prompt: str, messages: list[tuple[str, str]]) -> str:
    digest = hashlib.blake2b(system_prompt.encode(), digest_size=16)
    for role, content in messages:
        digest.update(f"\x00{role}\x00{content.strip()}".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class ChatConfig:
    model_name: str
    system_prompt: str = ""
    session_scope: Literal["chat", "thread", "user"] = "chat"
    max_message_chars: int = 8000
    enable_thinking: bool = False
    merge_requests: bool = True
    sampling: SamplingParams = field(default_factory=SamplingParams)
    compression: CompressionConfig = field(default_factory=CompressionConfig)


@dataclass
class TurnResult:
    reply: str
    session_id: int
    cache_level: CacheLevel | None
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    compressed: bool


@dataclass
class SessionState:
    id: int
    key: str
    system_prompt: str
    history: TokenHistory
    next_seq: int
    next_turn: int
    compressions: int
    transcript: list[tuple[str, str]]  # (role, text) of every user and assistant message, for API matching
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False


@dataclass
class _Reply:
    """The reply as it is built: visible text, the ids the model produced, and the engine's facts."""

    text: str = ""
    generated_ids: list[int] = field(default_factory=list)
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    cached_tokens: int = 0
    first_text_at: float | None = None


class Turn:
    """An async iterator of the reply's visible text increments; `result` is set at the end.
    `cache_level` is known before the first increment (for headers sent ahead of the text)."""

    def __init__(self, run: Callable[[Turn], AsyncIterator[str]]) -> None:
        self.result: TurnResult | None = None
        self.cache_level: CacheLevel | None = None
        self._deltas = run(self)

    def __aiter__(self) -> AsyncIterator[str]:
        return self._deltas

    async def collect(self) -> TurnResult:
        async for _ in self._deltas:
            pass
        assert self.result is not None
        return self.result


class ChatManager:
    def __init__(
        self,
        config: ChatConfig,
        engine: LLMEngine,
        db: Database,
        cache: ResponseCache,
        merger: RequestMerger[StreamDelta],
        embedder: Embedder,
    ) -> None:
        self.config = config
        self.engine = engine
        self.db = db
        self.cache = cache
        self.merger = merger
        self.embedder = embedder
        self.tokenizer = engine.tokenizer
        self.format = ChatFormat.for_tokenizer(self.tokenizer, enable_thinking=config.enable_thinking)
        self._think_end = self.tokenizer.convert_tokens_to_ids("</think>")
        self._sessions: dict[str, SessionState] = {}
        self._loading = asyncio.Lock()
        self._summaries: dict[str, str] = {}
        self._counts: Counter[str] = Counter()
        self._ttfts: deque[float] = deque(maxlen=1000)
        self._background: set[asyncio.Task[None]] = set()
        # Called with every finished turn, whoever asked (Feishu, the API, the chat page).
        self.turn_observers: list[Callable[[Conversation, TurnResult], None]] = []
        # API conversations: digest of the transcript a session has reached -> its chat id.
        self._transcripts: OrderedDict[str, str] = OrderedDict()

    # --- turns --------------------------------------------------------------------------------

    def turn(
        self,
        conversation: Conversation,
        text: str,
        *,
        params: SamplingParams | None = None,
        merge: bool = True,
        seed: Transcript | None = None,
    ) -> Turn:
        """Validate now (InvalidMessage before anything is stored); the turn runs as it is iterated.

        `merge=False` when the caller asked for an independent random sample. `seed`: the earlier
        conversation a new session starts from (see `turn_for_transcript`)."""
        text = text.strip()
        if not text:
            raise InvalidMessage("The message is empty: send some text.")
        if len(text) > self.config.max_message_chars:
            raise InvalidMessage(
                f"The message is too long ({len(text)} characters; at most {self.config.max_message_chars})."
            )
        params = params or self.config.sampling
        user_ids = self.format.message(self.tokenizer, "user", text)
        budget = self.config.compression.max_prompt_tokens
        if len(user_ids) + len(self.format.generation_prompt) > budget // 2:
            raise InvalidMessage(f"The message is too long ({len(user_ids)} tokens; at most {budget // 2}).")
        return Turn(lambda turn: self._run(turn, conversation, text, user_ids, params, merge, seed))

    def turn_for_transcript(
        self, transcript: Transcript, *, params: SamplingParams | None = None, merge: bool = True
    ) -> Turn:
        """OpenAI semantics: the whole conversation arrives with every call. The session whose
        messages are exactly the earlier ones continues, from its stored ids, so the prefix cache
        hits; without one, a new session starts from the transcript."""
        messages = transcript.messages
        if not messages or messages[-1].role != "user":
            raise InvalidMessage("The last message must be the user's.")
        for index, message in enumerate(messages):
            if message.role != ("user" if index % 2 == 0 else "assistant"):
                raise InvalidMessage("After an optional system message, messages must alternate user, assistant, user, ...")
        earlier = Transcript(transcript.system_prompt, messages[:-1])
        chat_id = self._transcripts.pop(earlier.digest(), None)
        conversation = Conversation(channel="api", chat_id=chat_id or uuid.uuid4().hex)
        return self.turn(
            conversation, messages[-1].content, params=params, merge=merge, seed=None if chat_id else earlier
        )

    async def _run(
        self,
        turn: Turn,
        conversation: Conversation,
        text: str,
        user_ids: list[int],
        params: SamplingParams,
        merge: bool,
        seed: Transcript | None,
    ) -> AsyncIterator[str]:
        started = time.perf_counter()
        state = await self._session(conversation, seed)
        async with state.lock:
            if state.closed:  # reset while this turn waited for the lock
                state = await self._session(conversation, seed)
            history = state.history
            scope = scope_key(self.config.model_name, state.system_prompt, bytes.fromhex(history.context_digest()))
            reply = _Reply()
            level: CacheLevel | None = None
            new_summaries: list[MessageRecord] = []

            hit = await self.cache.lookup(scope, text)
            if hit is not None:
                level = turn.cache_level = hit.level
                reply.text = hit.answer
                reply.generated_ids = self.tokenizer.encode(hit.answer, add_special_tokens=False)
                reply.first_text_at = time.perf_counter()
                yield hit.answer
            else:
                pending = len(user_ids) + len(self.format.generation_prompt)
                if needs_compression(history, pending, self.config.compression):
                    history, new_summaries = await self._compress(state, text, pending)
                prompt_ids = history.prompt(user_ids, self.format.generation_prompt)
                deltas, merged = self._generate(scope, text, prompt_ids, params, merge)
                level = turn.cache_level = "merged" if merged else None
                async for visible in self._visible(deltas, reply):
                    yield visible

            reply_ids = self.format.reply(reply.generated_ids)
            user_seq = state.next_seq + len(new_summaries)
            await asyncio.to_thread(
                self._persist, state, history, new_summaries, user_seq, (text, user_ids), (reply.text, reply_ids)
            )
            state.history = history
            history.append("user", user_ids, text=text, turn_index=state.next_turn, seq=user_seq)
            history.append("assistant", reply_ids, text=reply.text, turn_index=state.next_turn, seq=user_seq + 1)
            state.next_seq = user_seq + 2
            state.next_turn += 1
            state.transcript += [("user", text), ("assistant", reply.text)]
            if conversation.channel == "api":
                self._remember_transcript(state, conversation.chat_id)
            if new_summaries:
                state.compressions += 1

            # A reply cut at max_tokens is cached too: it is what this request gets from the model.
            if level is None and reply.finish_reason in ("stop", "length"):
                await self.cache.store(scope, text, reply.text)
            ttft = (reply.first_text_at or time.perf_counter()) - started
            self._count(level, ttft, bool(new_summaries))
            self._compress_ahead(state)
            turn.result = TurnResult(
                reply=reply.text,
                session_id=state.id,
                cache_level=level,
                finish_reason=reply.finish_reason,
                prompt_tokens=reply.prompt_tokens,
                cached_tokens=reply.cached_tokens,
                completion_tokens=len(reply.generated_ids),
                ttft_s=ttft,
                compressed=bool(new_summaries),
            )
            for observe in self.turn_observers:
                observe(conversation, turn.result)

    def _generate(
        self, scope: Scope, text: str, prompt_ids: list[int], params: SamplingParams, merge: bool
    ) -> tuple[AsyncIterator[StreamDelta], bool]:
        """Engine deltas for this prompt, shared with an identical request already running if any."""
        if not (merge and self.config.merge_requests):
            return self.engine.stream(prompt_ids, params), False
        key = f"{l1_key(scope, text)}:{params!r}"
        stream = self.merger.run(key, lambda: self.engine.stream(prompt_ids, params))

        async def deltas() -> AsyncIterator[StreamDelta]:
            async with stream:
                async for delta in stream:
                    yield delta

        return deltas(), not stream.leader

    async def _visible(self, deltas: AsyncIterator[StreamDelta], reply: _Reply) -> AsyncIterator[str]:
        """The text a user may see: with thinking on, nothing before the end of the think block."""
        thinking = self.config.enable_thinking
        async for delta in deltas:
            reply.generated_ids += delta.token_ids
            if delta.finished:
                reply.finish_reason = delta.finish_reason or "stop"
                reply.prompt_tokens = delta.num_prompt_tokens or 0
                reply.cached_tokens = delta.num_cached_tokens or 0
            if thinking:
                thinking = self._think_end not in delta.token_ids
                continue
            piece = delta.text if reply.text else delta.text.lstrip()
            if not piece:
                continue
            if reply.first_text_at is None:
                reply.first_text_at = time.perf_counter()
            reply.text += piece
            yield piece
        if reply.finish_reason == "error":
            raise RuntimeError("the engine failed while generating this reply")

    # --- compression --------------------------------------------------------------------------

    async def _compress(self, state: SessionState, question: str, pending: int) -> tuple[TokenHistory, list[MessageRecord]]:
        """A compressed copy of the session's history; the original stays until the turn persists."""
        old = state.history
        plan = await asyncio.to_thread(
            plan_compression, old, question, pending, state.next_turn, self.embedder, self.config.compression
        )
        summaries = await summarize_spans(plan, old, self._summarize, self._summaries)
        new = TokenHistory()
        added: list[MessageRecord] = []
        seq = state.next_seq
        for item in plan.layout:
            if isinstance(item, MessageRecord):
                new.append(item.role, old.ids_of(item), text=item.text, turn_index=item.turn_index, seq=item.seq)
                continue
            text = summaries[item]
            ids = self.format.message(self.tokenizer, "summary", text)
            added.append(new.append("summary", ids, text=text, turn_index=item.records[-1].turn_index, seq=seq))
            seq += 1
        log.info(
            "session %d compressed: %d -> %d tokens, %d spans summarized",
            state.id, old.num_tokens, new.num_tokens, len(added),
        )
        return new, added

    def _compress_ahead(self, state: SessionState) -> None:
        """Past the high-water mark, compress now, in the background, so the next turn does not
        wait for the summaries; relevance is then judged against the latest question."""
        config = self.config.compression
        if state.history.num_tokens < config.max_prompt_tokens * config.compress_ahead_ratio:
            return
        task = asyncio.create_task(self._compress_in_background(state), name=f"compress-session-{state.id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _compress_in_background(self, state: SessionState) -> None:
        config = self.config.compression
        async with state.lock:
            if state.closed or state.history.num_tokens < config.max_prompt_tokens * config.compress_ahead_ratio:
                return  # a turn compressed it first, or the session closed
            question = next(record.text for record in reversed(state.history.records) if record.role == "user")
            try:
                history, new_summaries = await self._compress(state, question, len(self.format.generation_prompt))
                if new_summaries:
                    await asyncio.to_thread(self._persist_compression, state, history, new_summaries)
            except Exception:  # noqa: BLE001 - the session keeps its uncompressed history; the next turn retries
                log.exception("session %d: compression ahead of the next turn failed", state.id)
                return
            if new_summaries:
                state.history = history
                state.next_seq += len(new_summaries)
                state.compressions += 1
                self._counts["compressions"] += 1

    def _persist_compression(self, state: SessionState, history: TokenHistory, new_summaries: list[MessageRecord]) -> None:
        with self.db.session() as session:
            self._write_compression(session, state, history, new_summaries)

    async def same_question(self, first: str, second: str) -> bool:
        """The model's yes/no on whether two questions share an answer: the response cache's last
        check of a semantic candidate (wired by the app when a real model is loaded)."""
        prompt = [
            *self.format.message(self.tokenizer, "system", JUDGE_PROMPT),
            *self.format.message(self.tokenizer, "user", f"Question A: {first}\nQuestion B: {second}\nSame answer?"),
            *self.format.generation_prompt,
        ]
        params = SamplingParams(temperature=0.0, max_tokens=3)
        answer = "".join([delta.text async for delta in self.engine.stream(prompt, params)])
        return answer.strip().lower().startswith("yes")

    async def _summarize(self, transcript: str) -> str:
        limit = self.engine.max_model_len - self.config.compression.summary_max_tokens - 64
        body = self.tokenizer.encode(transcript, add_special_tokens=False)[: max(limit // 2, 64)]
        prompt = [
            *self.format.message(self.tokenizer, "system", SUMMARIZER_PROMPT),
            *self.format.message(self.tokenizer, "user", self.tokenizer.decode(body)),
            *self.format.generation_prompt,
        ]
        params = SamplingParams(temperature=0.0, max_tokens=self.config.compression.summary_max_tokens)
        deltas = [delta async for delta in self.engine.stream(prompt, params)]
        if deltas[-1].finish_reason not in ("stop", "length"):
            raise RuntimeError(f"the summary was not written ({deltas[-1].finish_reason})")
        return "".join(delta.text for delta in deltas)

    # --- sessions -----------------------------------------------------------------------------

    def session_key(self, conversation: Conversation) -> str:
        key = f"{conversation.channel}:{conversation.chat_id}"
        if self.config.session_scope == "user" and conversation.user_id:
            return f"{key}:user:{conversation.user_id}"
        if self.config.session_scope == "thread" and conversation.thread_id:
            return f"{key}:thread:{conversation.thread_id}"
        return key

    async def _session(self, conversation: Conversation, seed: Transcript | None = None) -> SessionState:
        key = self.session_key(conversation)
        async with self._loading:
            state = self._sessions.get(key)
            if state is None or state.closed:
                state = await asyncio.to_thread(self._load_or_create, key, conversation, seed)
                self._sessions[key] = state
            return state

    def _load_or_create(self, key: str, conversation: Conversation, seed: Transcript | None) -> SessionState:
        with self.db.session() as session:
            chat = ChatRepository(session).get_or_create(
                conversation.chat_id, channel=conversation.channel, chat_type=conversation.chat_type
            )
            sessions = SessionRepository(session)
            row = sessions.active(key)
            if row is None:
                if seed is not None:
                    system_prompt = seed.system_prompt
                elif chat.system_prompt is not None:
                    system_prompt = chat.system_prompt
                else:
                    system_prompt = self.config.system_prompt
                row = sessions.create(key, chat_id=chat.id, system_prompt=system_prompt)
                if seed is not None:
                    self._write_seed(MessageRepository(session), row.id, seed)
            messages = MessageRepository(session).of_session(row.id)
            history = self._new_history(row.system_prompt or "")
            if row.context_seqs is None:
                context = list(messages)
            else:
                by_seq = {message.seq: message for message in messages}
                context = [by_seq[seq] for seq in row.context_seqs]
                context += [message for message in messages if message.seq > row.compacted_through_seq]
            for message in context:
                history.append(message.role, message.token_ids, text=message.text, turn_index=message.turn_index, seq=message.seq)
            return SessionState(
                id=row.id,
                key=key,
                system_prompt=row.system_prompt or "",
                history=history,
                next_seq=max((message.seq for message in messages), default=-1) + 1,
                next_turn=max((message.turn_index for message in messages), default=-1) + 1,
                compressions=row.compressions,
                transcript=[(m.role, m.text) for m in messages if m.role in ("user", "assistant")],
            )

    def _write_seed(self, messages: MessageRepository, session_id: int, seed: Transcript) -> None:
        """The earlier messages of a transcript, framed as if this session had lived them."""
        for seq, message in enumerate(seed.messages):
            if message.role == "user":
                ids = self.format.message(self.tokenizer, "user", message.content.strip())
            else:
                ids = self.format.reply(self.tokenizer.encode(message.content.strip(), add_special_tokens=False))
            messages.add(session_id, seq=seq, turn_index=seq // 2, role=message.role, text=message.content.strip(), token_ids=ids)

    def _remember_transcript(self, state: SessionState, chat_id: str) -> None:
        self._transcripts[transcript_digest(state.system_prompt, state.transcript)] = chat_id
        while len(self._transcripts) > MAX_REMEMBERED_TRANSCRIPTS:
            self._transcripts.popitem(last=False)

    def _new_history(self, system_prompt: str) -> TokenHistory:
        history = TokenHistory()
        if system_prompt:
            history.append("system", self.format.message(self.tokenizer, "system", system_prompt), text=system_prompt, turn_index=-1, seq=-1)
        return history

    def _persist(
        self,
        state: SessionState,
        history: TokenHistory,
        new_summaries: list[MessageRecord],
        user_seq: int,
        question: tuple[str, list[int]],
        answer: tuple[str, list[int]],
    ) -> None:
        """The turn's messages (and a compression, if one happened) in one unit of work."""
        with self.db.session() as session:
            if new_summaries:
                self._write_compression(session, state, history, new_summaries)
            messages = MessageRepository(session)
            for offset, (role, (text, ids)) in enumerate((("user", question), ("assistant", answer))):
                messages.add(state.id, seq=user_seq + offset, turn_index=state.next_turn, role=role, text=text, token_ids=ids)
            row = SessionRepository(session).get(state.id)
            assert row is not None
            row.last_active_at = utcnow()

    def _write_compression(
        self, session: Session, state: SessionState, history: TokenHistory, new_summaries: list[MessageRecord]
    ) -> None:
        messages = MessageRepository(session)
        for record in new_summaries:
            messages.add(
                state.id, seq=record.seq, turn_index=record.turn_index, role="summary",
                text=record.text, token_ids=history.ids_of(record),
            )
        row = SessionRepository(session).get(state.id)
        assert row is not None
        row.context_seqs = [record.seq for record in history.records if record.role != "system"]
        # Everything up to the summaries is decided; later messages follow them.
        row.compacted_through_seq = max(record.seq for record in new_summaries)
        row.compressions += 1

    # --- commands -----------------------------------------------------------------------------

    async def reset(self, conversation: Conversation) -> None:
        """Close the current session (its history stays in the database); the next turn starts anew."""
        state = await self._session(conversation)
        async with state.lock:
            await asyncio.to_thread(self._close, state.id)
            state.closed = True

    async def set_system_prompt(self, conversation: Conversation, system_prompt: str | None) -> None:
        """Per chat and persisted. The system prompt heads the token history, so a new one starts a
        new session."""
        def save() -> None:
            with self.db.session() as session:
                chats = ChatRepository(session)
                chats.get_or_create(conversation.chat_id, channel=conversation.channel, chat_type=conversation.chat_type)
                chats.set_system_prompt(conversation.chat_id, system_prompt)

        await asyncio.to_thread(save)
        await self.reset(conversation)

    def _close(self, session_id: int) -> None:
        with self.db.session() as session:
            SessionRepository(session).close(session_id)

    def forget(self, session_keys: list[str]) -> None:
        """Drop sessions another process step closed (the idle-session job) from memory."""
        for key in session_keys:
            state = self._sessions.pop(key, None)
            if state is not None:
                state.closed = True

    async def session_stats(self, conversation: Conversation) -> dict[str, object]:
        state = await self._session(conversation)
        history = state.history
        return {
            "session_id": state.id,
            "turns": state.next_turn,
            "context_tokens": history.num_tokens,
            "messages_in_context": sum(1 for record in history.records if record.role in ("user", "assistant")),
            "summaries_in_context": sum(1 for record in history.records if record.role == "summary"),
            "compressions": state.compressions,
            "system_prompt": scrub(state.system_prompt),
        }

    # --- figures ------------------------------------------------------------------------------

    def _count(self, level: CacheLevel | None, ttft_s: float, compressed: bool) -> None:
        self._counts["turns"] += 1
        self._counts[level or "generated"] += 1
        self._counts["compressions"] += compressed
        self._ttfts.append(ttft_s)

    def stats(self) -> dict[str, object]:
        ttfts = np.array(self._ttfts) if self._ttfts else np.zeros(1)
        return {
            "turns": {
                "total": self._counts["turns"],
                "generated": self._counts["generated"],
                "exact": self._counts["exact"],
                "semantic": self._counts["semantic"],
                "merged": self._counts["merged"],
                "compressions": self._counts["compressions"],
                "ttft_p50_ms": float(np.percentile(ttfts, 50) * 1000),
                "ttft_p99_ms": float(np.percentile(ttfts, 99) * 1000),
            },
            "sessions": {"in_memory": len(self._sessions)},
            "engine": self.engine.stats(),
            "cache": self.cache.stats(),
            "merging": self.merger.stats(),
        }
