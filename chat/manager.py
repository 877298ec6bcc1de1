"""ChatManager: the turn pipeline.

    session, under its lock -> response cache (L1, L2; while L2 embeds the question, the engine
    starts on it) -> compression if the prompt would not fit -> request merging -> Engine.stream
    -> reply streamed to the caller -> turn stored
    -> answer cached -> in the background: the model's summaries for the compression's
    stand-ins; compression ahead of the next turn, if due

Turns of one session run strictly in order (the session's lock); sessions run concurrently.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from cache.keys import Scope, l1_key, scope_key
from cache.levels import CacheLevel
from cache.response_cache import CacheHit, ResponseCache
from chat.compression import Compression, Compressor
from chat.figures import ChatFigures, TurnCounter
from chat.history import TokenHistory
from chat.merging import MergedStream, RequestMerger
from chat.reply import Reply
from chat.sessions import API_CHANNEL, Conversation, SessionState, SessionStore
from chat.summarizer import SUMMARY_PRIORITY
from chat.tool_calls import ToolUse
from chat.transcripts import Transcript
from chat.turns import InvalidMessage, Turn, TurnResult, require_unicode
from engine import ChatFormat, Engine, SamplingParams, StreamDelta, TokenArray
from settings import ContextSettings, GenerationSettings

log = logging.getLogger(__name__)

TurnObserver = Callable[[Conversation, TurnResult], None]


@dataclass(frozen=True)
class _Request:
    conversation: Conversation
    text: str
    user_ids: list[int]
    params: SamplingParams
    merge: bool
    seed: Transcript | None
    private: bool  # the prompt holds what only this user may see: the shared cache is neither read nor written
    prefill: str  # what the reply starts with before the model writes (a tool call's opening), and its ids
    prefill_ids: list[int]


class ChatManager:
    def __init__(
        self,
        engine: Engine,
        chat_format: ChatFormat,
        sessions: SessionStore,
        cache: ResponseCache,
        compressor: Compressor,
        merger: RequestMerger[StreamDelta],
        *,
        context: ContextSettings,
        generation: GenerationSettings,
        max_message_chars: int,
    ) -> None:
        self.engine = engine
        self.chat_format = chat_format
        self.sessions = sessions
        self.cache = cache
        self.compressor = compressor
        self.merger = merger
        self.model_name = engine.model_name
        self.sampling = SamplingParams(
            **generation.model_dump(
                exclude={"merge_requests", "merge_paraphrases", "merge_window_ms", "max_reply_tokens"}
            )
        )
        self.merge_requests = generation.merge_requests
        self.merge_paraphrases = generation.merge_paraphrases
        self.merge_window_s = generation.merge_window_ms / 1000
        self.max_message_chars = max_message_chars
        self.max_prompt_tokens = context.max_prompt_tokens
        self._think_end = chat_format.think_end if context.enable_thinking else None
        self._counter = TurnCounter()
        self._background: set[asyncio.Task[None]] = set()
        self._compressing_ahead: set[int] = set()  # ids of the sessions with a plan running
        # Called with every finished turn, whoever asked (Feishu, the API, the chat page).
        self.turn_observers: list[TurnObserver] = []

    # --- turns ----------------------------------------------------------------------------------

    def turn(
        self,
        conversation: Conversation,
        text: str,
        *,
        params: SamplingParams | None = None,
        merge: bool = True,
        seed: Transcript | None = None,
        notes: Sequence[str] = (),
        private: bool = False,
        prefill: str = "",
    ) -> Turn:
        """Validate now (InvalidMessage before anything is stored); the turn runs as it is iterated.

        `merge=False` when the caller asked for an independent random sample. `seed`: the earlier
        conversation a new session starts from (see `turn_for_transcript`). `notes`: what the
        model should know for this question alone (the user's recalled memories). They go inside
        the user's message, not the system prompt, so the history before it stays the prefix the
        engine has cached; the stored text stays the user's own words. `private`: as with notes,
        the shared cache is neither read nor written and no generation is shared. `prefill`: what
        the reply starts with, the model writing on from it (no think block then)."""
        require_unicode(text, "The message")
        text = text.strip()
        if not text:
            raise InvalidMessage("The message is empty: send some text.")
        if len(text) > self.max_message_chars:
            raise InvalidMessage(f"The message is too long ({len(text)} characters; at most {self.max_message_chars}).")
        user_ids = self.chat_format.message("user", with_notes(text, notes))
        # A question may take half the budget; the other half is the conversation it continues.
        limit = self.max_prompt_tokens // 2
        if len(user_ids) + len(self.chat_format.generation_prompt) > limit:
            raise InvalidMessage(f"The message is too long ({len(user_ids)} tokens; at most {limit}).")
        request = _Request(
            conversation,
            text,
            user_ids,
            params or self.sampling,
            merge,
            seed,
            private=private or bool(notes),
            prefill=prefill,
            prefill_ids=self.chat_format.encode(prefill),
        )
        return Turn(lambda turn: self._run(turn, request))

    def turn_for_transcript(
        self,
        transcript: Transcript,
        *,
        params: SamplingParams | None = None,
        merge: bool = True,
        tools: ToolUse | None = None,
    ) -> Turn:
        """The whole conversation arrives with every call: the session whose messages are exactly
        the earlier ones continues; without one, a new session starts from the transcript.

        `tools`: what the model may call. Such a turn is private: its answer depends on what the
        tools return now. Raises NoToolSupport when the chat template cannot frame them."""
        transcript.validate()
        framed = transcript.framed(self.chat_format, tools.offered if tools is not None else ())
        conversation = Conversation(channel=API_CHANNEL, chat_id=uuid.uuid4().hex)  # unless one continues
        content = framed.messages[-1].content
        prefill = tools.prefill(self.chat_format) if tools is not None else ""
        return self.turn(
            conversation,
            content,
            params=params,
            merge=merge,
            seed=framed.earlier,
            private=tools is not None,
            prefill=prefill,
        )

    async def _run(self, turn: Turn, request: _Request) -> TurnResult:
        started = time.perf_counter()
        # The generations begun on stored copies of the session while the database said whether
        # they were behind (a worker thread's query, 5 ms at p50 under load, the engine starting
        # meanwhile): the copy the turn gets keeps its own, any other's stops.
        early: list[tuple[SessionState, MergedStream[StreamDelta]]] = []

        def begin_early(state: SessionState) -> None:
            flight = self._early_flight(state, request)
            if flight is not None:
                early.append((state, flight))

        try:
            async with self.sessions.locked(request.conversation, request.seed, while_checking=begin_early) as session:
                begun = next((flight for state, flight in early if state is session), None)
                for _, flight in early:
                    if flight is not begun:
                        flight.leave()
                num_tokens, scope = session.history.num_tokens, self._scope(session)
                reply, level, compression = await self._answer(turn, request, session, scope, begun)
                turn.reply_complete()
                answer = (reply.text, self.chat_format.reply([*request.prefill_ids, *reply.generated_ids]))
                await self.sessions.save_turn(session, (request.text, request.user_ids), answer, compression)
                if level is CacheLevel.MISS and reply.finish_reason in ("stop", "length") and not request.private:
                    # An answer cut at max_tokens is cached as cut: it serves requests for no more.
                    cut_at = request.params.max_tokens if reply.finish_reason == "length" else None
                    self._in_background(self._cache(scope, request.text, reply.text, cut_at), "cache-store")
                if compression is not None:
                    self._compressed(session, num_tokens, compression)
                self._prepare_compression(session)
                self._compress_ahead(session)
        finally:
            for _, flight in early:
                flight.leave()
        ttft_s = (reply.first_text_at or time.perf_counter()) - started
        self._counter.count_turn(level, ttft_s)
        result = TurnResult(
            reply=reply.text,
            session_id=session.id,
            cache_level=level,
            finish_reason=reply.finish_reason,
            prompt_tokens=reply.prompt_tokens,
            cached_tokens=reply.cached_tokens,
            completion_tokens=len(reply.generated_ids),
            ttft_s=ttft_s,
            compressed=compression is not None,
        )
        for observe in self.turn_observers:
            observe(request.conversation, result)
        return result

    async def _answer(
        self,
        turn: Turn,
        request: _Request,
        session: SessionState,
        scope: Scope,
        early: MergedStream[StreamDelta] | None,
    ) -> tuple[Reply, CacheLevel, Compression | None]:
        """The reply, from the cache or the model, streamed to `turn` as it comes. `early`: the
        generation begun while the session was checked, which a hit stops."""
        reply = Reply()
        # A stream left, however this ends, stops its generation when no one else awaits it.
        with ExitStack() as streams:
            begun: list[MergedStream[StreamDelta]] = []

            def keep(flight: MergedStream[StreamDelta]) -> None:
                begun.append(flight)
                streams.callback(flight.leave)

            def begin() -> asyncio.Future[None]:
                # Embedding the question takes 30-90 ms on 2 cores, about what the engine takes to
                # start on a short prompt: it starts meanwhile, a hit stops it, and its first token
                # ends the lookup (cache.race_model). A question the cache embeds opens its
                # conversation, so there is nothing to compress first.
                if not begun:
                    keep(self._flight(scope, request, self._prompt(session.history, request)))
                return begun[0].began

            if early is not None:
                keep(early)

            hit = None
            # The paraphrase check after a miss waits for embeddings within what the lookup left of
            # its budget: it waited a whole budget more for the forward the lookup had given up on
            # (--compare, 2-core AMD EPYC: FAQ and paraphrase TTFT p95 up to 294 ms, budget 250).
            lookup_ends = time.perf_counter() + self.cache.settings.lookup_budget_ms / 1000
            if not request.private:
                hit = await self.cache.lookup(scope, request.text, request.params.max_tokens, while_embedding=begin)
            if hit is not None:
                turn.cache_level = hit.level
                self._served_from_cache(reply, hit, request.params)
                turn.emit(reply.text)
                return reply, hit.level, None
            stream, compression = await self._generation(
                session, request, scope, begun[0] if begun else None, lookup_ends
            )
            streams.callback(stream.leave)
            level = turn.cache_level = CacheLevel.MISS if stream.leader else CacheLevel.MERGED
            # The prefill is the reply's start; the caller gets it with the model's first text, once
            # the engine has taken the prompt (a refused prompt is then an error before any text).
            reply.text = unsent = request.prefill
            async for piece in reply.visible(aiter(stream), None if request.prefill else self._think_end):
                turn.emit(unsent + piece)
                unsent = ""
            if unsent:
                turn.emit(unsent)
            return reply, level, compression

    async def _generation(
        self,
        session: SessionState,
        request: _Request,
        scope: Scope,
        begun: MergedStream[StreamDelta] | None,
        lookup_ends: float,
    ) -> tuple[MergedStream[StreamDelta], Compression | None]:
        """What a question the cache missed is answered by: the generation of a recent first
        question it paraphrases, joined (embeddings under way are waited for until `lookup_ends`,
        on time.perf_counter's clock); or its own, `begun` during the lookup or started now, the
        history compressed first if the prompt would not fit."""
        joined = await self._paraphrase_flight(scope, request, begun, lookup_ends)
        if joined is not None:
            if begun is not None:
                begun.leave()
            return joined, None
        if begun is not None:
            return begun, None
        history, compression, pending = session.history, None, self._pending_tokens(request)
        if self.compressor.needed(history, pending):
            # The compression ahead of this turn (in the background) has not finished: this turn's
            # own judges relevance by words, not embeddings, which it would wait for.
            compression = await self._compress(session, request.text, pending, instant=True)
            history = compression.history if compression is not None else history
        return self._flight(scope, request, self._prompt(history, request)), compression

    async def _cache(self, scope: Scope, question: str, answer: str, cut_at: int | None) -> None:
        """Stores a turn's answer after the turn: a first question's embedding waits behind the
        lookups', and the reply's end waited with it (250 ms at p50 under the peer workload's 8
        clients, 6 ms for a follow-up's row alone). An identical question asked meanwhile misses."""
        try:
            await self.cache.store(scope, question, answer, cut_at)
        except Exception:
            # The turn is stored; its answer is only not cached.
            log.exception("caching the answer to a turn failed")

    def _served_from_cache(self, reply: Reply, hit: CacheHit, params: SamplingParams) -> None:
        """A cached answer, ended where the model would have ended it for this request: at its
        first stop token id or stop string, or at its max_tokens."""
        answer, ids = hit.answer, self.chat_format.encode(hit.answer)
        stop_at = next((i for i, token_id in enumerate(ids) if token_id in params.stop_token_ids), None)
        end = params.max_tokens if stop_at is None else min(stop_at, params.max_tokens)
        if end == params.max_tokens and (hit.cut or len(ids) > params.max_tokens):
            reply.finish_reason = "length"
        if end < len(ids):
            ids = ids[:end]
            # A cut inside a character's bytes decodes to U+FFFD: that character is not served.
            answer = self.chat_format.decode(ids).rstrip("\ufffd")
        found = min(((answer.find(stop), stop) for stop in params.stop if stop in answer), default=None)
        if found is not None:
            # as the engine ends a reply at a stop string: its text without it, its ids with it
            start, stop = found
            ids = self.chat_format.encode(answer[: start + len(stop)])
            answer, reply.finish_reason = answer[:start], "stop"
        reply.text, reply.generated_ids = answer, ids
        reply.first_text_at = time.perf_counter()

    def _early_flight(self, session: SessionState, request: _Request) -> MergedStream[StreamDelta] | None:
        """The generation a miss needs, begun on `session` as it is, before the turn knows that the
        copy is exact or that the cache misses. None for a shared cache's first question, which
        is often answered by the cache or by a paraphrase's generation (its lookup starts its own
        while it embeds it), and where the prompt must be compressed first."""
        scope = self._scope(session)
        if (scope.shared and not request.private) or self.compressor.needed(
            session.history, self._pending_tokens(request)
        ):
            return None
        return self._flight(scope, request, self._prompt(session.history, request))

    def _scope(self, session: SessionState) -> Scope:
        digest = bytes.fromhex(session.history.context_digest())
        return scope_key(self.model_name, session.system_prompt, digest)

    def _pending_tokens(self, request: _Request) -> int:
        """What the turn adds to the history's tokens in its prompt."""
        return len(request.user_ids) + len(self.chat_format.generation_prompt) + len(request.prefill_ids)

    def _prompt(self, history: TokenHistory, request: _Request) -> TokenArray:
        return history.prompt(request.user_ids, self.chat_format.generation_prompt, request.prefill_ids)

    def _flight(self, scope: Scope, request: _Request, prompt_ids: TokenArray) -> MergedStream[StreamDelta]:
        """The engine's generation for this prompt, which requests asking the identical question
        join while it runs; a request that may not share it gets one nobody joins."""
        params = request.params
        if self._mergeable(request):
            key, group = self._key(scope, request), self._group(scope, params)
        else:
            key, group = uuid.uuid4().hex, ""
        return self.merger.run(key, lambda: self.engine.stream(prompt_ids, params), group=group, label=request.text)

    async def _paraphrase_flight(
        self, scope: Scope, request: _Request, begun: MergedStream[StreamDelta] | None, lookup_ends: float
    ) -> MergedStream[StreamDelta] | None:
        """The flight of a recent first question that `request` paraphrases, started before the
        request's own generation if that has `begun`, joined; None if none. Like an L2 hit, only
        where no conversation comes before the question."""
        if not (self._mergeable(request) and self.merge_paraphrases and scope.shared):
            return None
        if begun is not None and not begun.leader:
            return None  # it joined the identical question's flight
        if begun is None and self._key(scope, request) in self.merger:
            return None  # the identical question's flight: joined as the request starts its own
        until = begun.started_at if begun is not None else time.monotonic()
        recent = self.merger.running(self._group(scope, request.params), until - self.merge_window_s, until)
        flights = {label: key for key, label in recent}
        if not flights:
            return None
        within_s = lookup_ends - time.perf_counter()
        same = await self.cache.paraphrase(
            scope, request.text, list(flights), within_s=within_s, answering=None if begun is None else begun.began
        )
        return None if same is None else self.merger.join(flights[same])

    @staticmethod
    def _key(scope: Scope, request: _Request) -> str:
        """What two requests must share to be the identical one."""
        return f"{l1_key(scope, request.text)}:{request.params!r}"

    def _mergeable(self, request: _Request) -> bool:
        return not request.private and request.merge and self.merge_requests

    @staticmethod
    def _group(scope: Scope, params: SamplingParams) -> str:
        """What two requests must share to be answered alike."""
        return f"{scope.key}:{params!r}"

    # --- compression ----------------------------------------------------------------------------

    async def _compress(
        self, session: SessionState, question: str, pending_tokens: int, *, instant: bool = False
    ) -> Compression | None:
        """A compressed copy of the session's history; the session keeps its own until it stores it."""
        return await self.compressor.compress(
            session.history, question, pending_tokens, session.next_turn, session.next_seq, instant=instant
        )

    def _compressed(self, session: SessionState, num_tokens: int, compression: Compression) -> None:
        """A compression is stored: counted, logged, its stand-ins summarized in the background."""
        self._counter.count_compression()
        log.info(
            "session %d compressed: %d -> %d tokens, %d spans summarized (%d by stand-ins for now)",
            session.id,
            num_tokens,
            compression.history.num_tokens,
            len(compression.summaries),
            len(compression.pending),
        )
        if compression.pending:
            self._in_background(self._summarize(session, compression), f"summarize-session-{session.id}")

    def _prepare_compression(self, session: SessionState) -> None:
        if self.compressor.worth_preparing(session.history):
            self._in_background(self.compressor.prepare(session.history), f"embed-session-{session.id}")

    def _compress_ahead(self, session: SessionState) -> None:
        """Past the high-water mark, compress now, in the background, so that the next turn finds
        the prompt within budget; relevance is then judged against the latest question."""
        if self.compressor.worth_doing_ahead(session.history) and session.id not in self._compressing_ahead:
            self._compressing_ahead.add(session.id)
            task = self._in_background(self._compress_in_background(session), f"compress-session-{session.id}")
            task.add_done_callback(lambda _: self._compressing_ahead.discard(session.id))

    async def _compress_in_background(self, session: SessionState) -> None:
        """Plans without the session's lock (scoring embeds every message: ~1.8 s for 30 on 2
        cores), so a turn that comes meanwhile never waits for it. Such a turn makes the plan
        stale: it is made again on the history the turn left, quickly, as the embeddings are cached."""
        while True:
            history = session.history
            if session.closed or not self.compressor.worth_doing_ahead(history):
                return  # a turn compressed it first, or the session closed
            num_tokens = history.num_tokens
            question = next(record.text for record in reversed(history.records) if record.role == "user")
            try:
                compression = await self._compress(session, question, len(self.chat_format.generation_prompt))
                if compression is None:
                    return
                async with self.sessions.holding(session) as current:
                    if not current:
                        return
                    if session.history is history and history.num_tokens == num_tokens:
                        await self.sessions.save_compression(session, compression)
                        break
            except Exception:
                # The session keeps its uncompressed history; the next turn compresses if it must.
                log.exception("session %d: compression ahead of the next turn failed", session.id)
                return
        self._compressed(session, num_tokens, compression)
        if not compression.pending:
            self._prefill_ahead(session)

    async def _summarize(self, session: SessionState, compression: Compression) -> None:
        """The model's summaries of a compression's spans, written without holding the session,
        then put in place of their stand-ins for the turns to come where they say more; the
        history, rewritten or not, prefilled (a compression ahead leaves that to its summaries)."""
        try:
            summaries = await self.compressor.write_summaries(compression.pending)
            async with self.sessions.holding(session) as current:
                if not current:
                    return
                rewritten = self.compressor.with_summaries(
                    session.history, compression.pending, summaries, session.next_seq
                )
                if rewritten is not None:
                    await self.sessions.save_summaries(session, rewritten)
                self._prefill_ahead(session)
        except Exception:
            # The stand-ins stay: they are what the messages said, only longer-winded.
            log.exception("session %d: writing the summaries of a compression failed", session.id)

    def _prefill_ahead(self, session: SessionState) -> None:
        """The history a compression or its summaries rewrote in the background, prefilled for the
        next turn behind every user's turn: its prefix changed, so that turn would compute all of
        it again before its first token (`bench/claims_bench.py`'s compressed conversation of
        pasted logs, 2 cores: SmolLM2 2.6 s against 0.11 s prefilled, the demo model 63 against
        9 ms)."""
        self._in_background(self._prefill(session.id, session.history), f"prefill-session-{session.id}")

    async def _prefill(self, session_id: int, history: TokenHistory) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=1, priority=SUMMARY_PRIORITY)
        try:
            # drained to its end: the blocks enter the prefix cache as they are computed
            deltas = [delta async for delta in self.engine.stream(history.prompt(), params)]
            log.debug("session %d: rewritten history prefilled (%s)", session_id, deltas[-1].finish_reason)
        except Exception:
            # The next turn prefills the history itself.
            log.exception("session %d: prefilling the rewritten history failed", session_id)

    def _in_background(self, work: Coroutine[None, None, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def settle(self) -> None:
        """Wait for the work running in the background, and the work it starts (what a user's
        typing time gives it)."""
        while self._background:
            await asyncio.gather(*self._background)

    async def close(self) -> None:
        """Stop the background work: an uncompressed session is compressed by its next turn, a
        stand-in summary stays."""
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self.compressor.close()
        await self.cache.close()

    # --- figures --------------------------------------------------------------------------------

    def figures(self) -> ChatFigures:
        return ChatFigures(
            turns=self._counter.figures(),
            engine=self.engine.figures(),
            cache=self.cache.figures(),
            merging=self.merger.figures(),
        )


def with_notes(text: str, notes: Sequence[str]) -> str:
    """The user's message as the model reads it, with what it should know for it first."""
    if not notes:
        return text
    remembered = "\n".join(f"- {note}" for note in notes)
    return f"(What you remember about me, in case it helps:\n{remembered})\n\n{text}"
