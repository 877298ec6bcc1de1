"""Facts worth keeping, written by the model from a private session once it has closed (/reset,
or idle past `sessions.idle_ttl_s`).

A periodic job takes the closed sessions nobody went over yet in one UPDATE ... RETURNING, so of
several replicas one takes each, and a restart in between loses none: the marks are in the rows.
Group sessions are skipped: their facts belong to several people, and a wrong owner would leak one
person's facts to another.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass

from sqlalchemy import select, update

from assistant.memory import MemoryRefused, MemoryStore, owner_of
from chat import Conversation
from engine import ChatFormat, Engine, SamplingParams
from settings import AssistantSettings
from storage import Chat, ChatSession, Database, MessageRepository, utcnow

log = logging.getLogger(__name__)

DISTILL_PROMPT = (
    "You keep notes about a user for later conversations. From the conversation below, write the "
    "facts about the user that will still matter next week: their name, role, team, projects, "
    "preferences, places, dates. One short fact per line, each starting with '- '. "
    "If there is nothing worth keeping, write NONE."
)
# The model's notes for one session: a handful of one-line facts.
DISTILL_MAX_TOKENS = 128
# Behind every user's turn in the engine, like the summaries.
DISTILL_PRIORITY = 1
# `distill_on_close: auto` distills with models this large. SmolLM2-135M-Instruct does not list
# facts: on 3 sample sessions it continued the transcript or repeated one line 13 times, and such
# "facts" would be recalled into every later question.
DISTILL_MIN_PARAMETERS = 400_000_000
# Sessions gone over in one run; more wait for the next run (a backlog never floods the engine).
SESSIONS_PER_RUN = 8
# A session's transcript is cut to its last characters: the notes need the gist, and the prompt must fit.
MAX_TRANSCRIPT_CHARS = 6000
_FACT = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s*(?P<fact>.+?)\s*$")


@dataclass(frozen=True)
class ClosedSession:
    session_id: int
    owner: str
    transcript: list[tuple[str, str]]  # (role, text) of its user and assistant messages


class Distiller:
    def __init__(
        self, engine: Engine, chat_format: ChatFormat, memory: MemoryStore, db: Database, settings: AssistantSettings
    ) -> None:
        self.engine = engine
        self.chat_format = chat_format
        self.memory = memory
        self.db = db
        self.max_facts = settings.distill_max_facts
        # The demo model's random text is no fact. A model server's size is not known here: a
        # server is run for a real model.
        wanted, size = settings.distill_on_close, engine.num_parameters
        able = not engine.is_demo_model and (wanted is True or size is None or size >= DISTILL_MIN_PARAMETERS)
        self.enabled = settings.memory and wanted is not False and able

    async def run(self) -> int:
        """Go over the private sessions closed since the last run; returns the facts kept."""
        if not self.enabled:
            return 0
        kept = 0
        for closed in await asyncio.to_thread(self._take_closed):
            try:
                kept += await self._distill(closed)
            except Exception:
                # The session is marked: its facts are lost, never written twice.
                log.exception("session %d: distilling its facts failed", closed.session_id)
        return kept

    async def _distill(self, closed: ClosedSession) -> int:
        if not any(role == "user" for role, _ in closed.transcript):
            return 0
        transcript = "\n".join(f"{role}: {text}" for role, text in closed.transcript)[-MAX_TRANSCRIPT_CHARS:]
        prompt = self.chat_format.prompt(DISTILL_PROMPT, transcript)
        params = SamplingParams(temperature=0.0, max_tokens=DISTILL_MAX_TOKENS, priority=DISTILL_PRIORITY)
        notes = "".join([delta.text async for delta in self.engine.stream(prompt, params)])
        kept = 0
        for fact in parse_facts(notes)[: self.max_facts]:
            try:
                await self.memory.save(closed.owner, fact, source="distilled")
            except MemoryRefused:
                break  # the owner's memory is full: what they asked to keep goes first
            kept += 1
        log.info("session %d: %d facts distilled", closed.session_id, kept)
        return kept

    def _take_closed(self) -> list[ClosedSession]:
        with self.db.session() as session:
            private = select(Chat.id).where(Chat.chat_type == "p2p")
            oldest = (
                select(ChatSession.id)
                .where(
                    ChatSession.state == "closed", ChatSession.distilled_at.is_(None), ChatSession.chat_id.in_(private)
                )
                .order_by(ChatSession.closed_at)
                .limit(SESSIONS_PER_RUN)
            )
            taken = session.execute(
                update(ChatSession)
                .where(ChatSession.id.in_(oldest), ChatSession.distilled_at.is_(None))
                .values(distilled_at=utcnow())
                .returning(ChatSession.id, ChatSession.chat_id)
                .execution_options(synchronize_session=False)
            ).all()
            messages = MessageRepository(session)
            closed = []
            for session_id, chat_id in taken:
                chat = session.get(Chat, chat_id)
                assert chat is not None, "taken from private chats only"
                owner = owner_of(Conversation(channel=chat.channel, chat_id=chat.id, chat_type=chat.chat_type))
                transcript = [
                    (m.role, m.text) for m in messages.of_session(session_id) if m.role in ("user", "assistant")
                ]
                closed.append(ClosedSession(session_id, owner, transcript))
            return closed


def parse_facts(notes: str) -> list[str]:
    """The model's bulleted lines; "NONE" and anything not a bullet are not facts."""
    facts = []
    for line in notes.splitlines():
        match = _FACT.match(line)
        if match is not None and match["fact"].upper().rstrip(".") != "NONE":
            facts.append(match["fact"])
    return list(dict.fromkeys(facts))
