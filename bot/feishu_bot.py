"""FeishuBot: Feishu events in, answers out, one queue per chat stream or thread.

transport (long connection | webhook) -> lark-oapi dispatcher -> lane (a chat's stream or thread)
-> policy (answer? a thread follow-up? first delivery?) -> gate (access, quota)
-> command (or a plain request to remember or be reminded) | reader (what the model reads:
names, quotes, forwards) + the person's recalled memories -> ChatManager turn -> reply card
-> claim finished

Reminders and scheduled prompts come back through `deliver`, posted in the chat (and thread)
they were set in.

At start, the messages a stopped process claimed but never finished answering are fetched and
queued again (`Delivery.resumed`); a card it left streaming becomes a line saying so. A
click on an answer card's buttons (`card.action.trigger`) joins its chat's lane too: a new session,
or the question answered again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import lark_oapi as lark
from fastapi import APIRouter
from lark_oapi.api.im.v1 import P2ImMessageReceiveV1
from lark_oapi.event.callback.model.p2_card_action_trigger import P2CardActionTrigger, P2CardActionTriggerResponse

from assistant.memory import MemoryStore, fact_to_remember, owner_of
from assistant.reminders import Reminder, Reminders
from assistant.tools import BuiltinTools
from assistant.when import looks_like_reminder
from bot.access import Asking, Gate
from bot.card_actions import NEW_SESSION, CardClick, card_buttons, read_click, toast
from bot.commands import Commands, parse_command
from bot.feishu_api import FeishuApi
from bot.lanes import ChatLanes, Lane
from bot.names import SenderNames
from bot.policy import EventPolicy, IncomingMessage, Unanswered, fetched_event
from bot.progress import TypingReaction
from bot.reading import Reader
from bot.replies import CardOpened, Replier
from bot.status import FeishuStatus, TransportState
from bot.threads import Threads
from bot.tool_loop import ToolLoop
from bot.transport import LongConnection, webhook_router
from chat import ChatManager, Conversation, InvalidMessage
from settings import AssistantSettings, FeishuSettings
from storage import Database, utcnow

log = logging.getLogger(__name__)

IDENTIFY_RETRY_MAX_S = 60.0
RESUMED = "resumed"
CLICK_DROPPED = "Sorry, that did not work; please try again."


@dataclass(frozen=True)
class Delivery:
    """An event for a chat's lane; `resumed`: claimed before a restart and never answered, its
    reply maybe left streaming into `stuck_card`."""

    event: P2ImMessageReceiveV1
    resumed: bool = False
    stuck_card: str | None = None


class FeishuBot:
    def __init__(
        self,
        settings: FeishuSettings,
        chat_manager: ChatManager,
        db: Database,
        commands: Commands,
        memory: MemoryStore | None,
        reminders: Reminders,
        assistant: AssistantSettings,
        *,
        shutdown_grace_s: float = 5.0,
    ) -> None:
        self._settings = settings
        self._chat_manager = chat_manager
        self._commands = commands
        self._memory = memory
        self._shutdown_grace_s = shutdown_grace_s
        self._api = FeishuApi.connect(settings.app_id, settings.app_secret, settings.domain)
        self._policy = EventPolicy(
            db,
            max_event_age=timedelta(seconds=settings.max_event_age_s),
            dedup_ttl=timedelta(seconds=settings.dedup_ttl_s),
            claim_lease=timedelta(seconds=settings.claim_lease_s),
            answer_at_all=settings.answer_at_all,
        )
        self._replier = Replier(self._api, interval_s=settings.stream_interval_ms / 1000)
        self._names = SenderNames(self._api, app_id=settings.app_id)
        tools = BuiltinTools(memory, reminders, assistant, self._api.document_text, time_zone_of=self.time_zone)
        self._tool_loop = ToolLoop.offered(chat_manager, tools, assistant)
        self._reader = Reader(self._api, self._names, chat_manager.sessions)
        self._typing = TypingReaction(self._api, enabled=settings.typing_reaction)
        self._lanes: ChatLanes[Delivery | CardClick] = ChatLanes(
            self._handle_item, max_per_chat=settings.max_concurrent_per_chat
        )
        self._gate = Gate.from_settings(settings)
        self._threads = Threads(
            db,
            ttl=timedelta(seconds=settings.dedup_ttl_s),
            reply_in_thread=settings.reply_in_thread,
            follow_up=settings.thread_follow_up,
        )
        dispatcher = (
            lark.EventDispatcherHandler.builder(settings.encrypt_key, settings.verification_token)
            .register_p2_im_message_receive_v1(self._on_message)
            .register_p2_card_action_trigger(self._on_card_action)
            .build()
        )
        webhook = settings.enabled and settings.mode == "webhook"
        longconn = settings.enabled and settings.mode == "longconn"
        self.router = (
            webhook_router(dispatcher, encrypt_key=settings.encrypt_key, verification_token=settings.verification_token)
            if webhook
            else APIRouter()
        )
        self._long_connection = (
            LongConnection(settings.app_id, settings.app_secret, settings.domain, dispatcher) if longconn else None
        )
        self._identified = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Task[None] | None = None
        self._last_event_at: datetime | None = None

    async def start(self) -> None:
        if not self._settings.enabled:
            log.info("feishu bot off: feishu.app_id and feishu.app_secret are not set")
            return
        self._loop = asyncio.get_running_loop()
        # Taken before the app serves, so that replicas starting together split them.
        unanswered = await self._policy.take_unanswered()
        self._starting = asyncio.create_task(self._identify_and_listen(unanswered), name="feishu-start")

    async def stop(self) -> None:
        if self._starting is not None:
            self._starting.cancel()
            await asyncio.gather(self._starting, return_exceptions=True)
        if self._long_connection is not None:
            await asyncio.to_thread(self._long_connection.stop)
        await self._lanes.close(self._shutdown_grace_s)

    async def _identify_and_listen(self, unanswered: list[Unanswered]) -> None:
        # Group messages are answered only on an @mention of this bot's open_id, so nothing is
        # handled before it is known; events that arrive meanwhile wait in their chat's lane.
        delay_s = 1.0
        while self._policy.bot_open_id is None:
            try:
                self._policy.bot_open_id = await self._api.bot_open_id()
            except Exception as exc:  # noqa: BLE001 - network, auth or server: all are retried the same way
                log.warning("feishu: cannot get the bot's identity (%s); retrying in %.0f s", exc, delay_s)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, IDENTIFY_RETRY_MAX_S)
        self._identified.set()
        log.info("feishu bot %s on %s, %s mode", self._policy.bot_open_id, self._settings.domain, self._settings.mode)
        await self._answer_again(unanswered)
        if self._long_connection is not None:
            self._long_connection.start()
        # A reply that failed gave its claim up, and a replica that stopped while answering left
        # its claims to run out: each lease later, any running replica takes them.
        while True:
            await asyncio.sleep(self._policy.claim_lease.total_seconds())
            try:
                await self._answer_again(await self._policy.take_unanswered())
            except Exception:
                log.exception("feishu: unfinished messages could not be taken; trying again in a lease")

    async def _answer_again(self, unanswered: list[Unanswered]) -> None:
        """Queue the messages whose reply was never finished (a failure, a stopped replica), as
        Feishu has them now."""
        for claim in unanswered:
            event = await self._fetched(claim.message_id, claim.chat_type)
            if event is None:
                continue
            log.info("feishu: answering message %s again: its reply was never finished", claim.message_id)
            self._lanes.submit(_lane(event), Delivery(event, resumed=True, stuck_card=claim.reply_card))

    def _on_message(self, event: P2ImMessageReceiveV1) -> None:
        # Called by lark-oapi, on its long-connection thread or inside the webhook request: hand
        # the event to the chat's lane and return at once; never raise into the SDK.
        self._last_event_at = utcnow()
        try:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._lanes.submit, _lane(event), Delivery(event))
        except Exception:
            log.exception("feishu: an event could not be queued and is dropped")

    async def _handle(self, delivery: Delivery) -> None:
        await self._identified.wait()
        message = self._policy.admit(delivery.event)
        if message is None or not (message.addressed or await self._threads.is_follow_up(message)):
            return
        if not delivery.resumed and not await self._policy.first_delivery(message):
            return
        async with self._policy.answering(message):
            if delivery.stuck_card is not None:
                await self._close_stuck(delivery.stuck_card)
            await self._respond(message, attempt=RESUMED if delivery.resumed else "")

    async def _close_stuck(self, card: str) -> None:
        try:
            await self._replier.close_interrupted(card)
        except Exception as exc:  # noqa: BLE001 - the card stays as it was; the answer comes all the same
            log.warning("feishu: a card left streaming cannot be closed (%s)", exc)

    async def _respond(self, message: IncomingMessage, *, attempt: str) -> None:
        """The answer, or one reply that refuses the message (access, quota)."""
        in_thread = self._threads.of_answer(message) is not None
        if await self._refused(Asking.of(message), message.message_id, in_thread=in_thread):
            return
        await self._threads.answering(message)
        # the claim records each card its answer streams into
        await self._answer(message, attempt=attempt, opened=functools.partial(self._policy.showing, message))

    async def _refused(self, asking: Asking, reply_to: str, *, in_thread: bool) -> bool:
        """Whether the gate refuses `asking`; if so, the refusal is the reply to `reply_to`."""
        refusal = self._gate.refusal(asking)
        if refusal is None:
            return False
        log.info("feishu: message %s refused: %s", reply_to, refusal.reason)
        await self._replier.text(reply_to, refusal.text, in_thread=in_thread)
        return True

    async def _answer(self, message: IncomingMessage, *, attempt: str, opened: CardOpened | None = None) -> None:
        thread = self._threads.of_answer(message)
        in_thread = thread is not None
        conversation = Conversation(
            channel="feishu",
            chat_id=message.chat_id,
            chat_type=message.chat_type,
            user_id=message.sender_open_id,
            thread_id=thread,
        )
        reply = await self._without_model(message.text or "", conversation)
        if reply is not None:
            await self._replier.text(message.message_id, reply, in_thread=in_thread)
            return
        text = await self._reader.model_text(message, conversation)
        if text is None:
            notice = self._reader.text_only_notice(message.chat_id)
            await self._replier.text(message.message_id, notice, in_thread=in_thread)
            return
        try:
            notes = await self._memory.recall(owner_of(conversation), message.text or text) if self._memory else []
            turn = self._chat_manager.turn(conversation, text, notes=notes)
        except InvalidMessage as exc:
            await self._replier.text(message.message_id, str(exc), in_thread=in_thread)
            return
        answer = turn if self._tool_loop is None else self._tool_loop.answer(conversation, turn)
        async with self._typing.shown_on(message.message_id):
            await self._replier.stream(
                message.message_id,
                answer,
                in_thread=in_thread,
                attempt=attempt,
                actions=card_buttons(message, thread),
                opened=opened,
            )

    async def _without_model(self, words: str, conversation: Conversation) -> str | None:
        """The reply to a command, or to a plain request to remember a fact or to be reminded;
        None for a message the model answers."""
        command = parse_command(words)
        if command is not None:
            return await self._commands.run(command, conversation)
        if self._memory is not None and (fact := fact_to_remember(words)) is not None:
            return await self._commands.remember(conversation, fact)
        if looks_like_reminder(words):
            return await self._commands.remind(conversation, words)
        return None

    async def time_zone(self, open_id: str) -> str | None:
        """The time zone a user set in Feishu (their reminders' times are read in it), if readable."""
        return await self._names.time_zone(open_id)

    async def deliver(self, reminder: Reminder, fired_at: datetime) -> None:
        """A reminder, or a scheduled prompt's answer, posted where it was set; a reminder mentions its person."""
        target = reminder.target
        if reminder.kind == "remind":
            text = f'<at user_id="{target.user_id}"></at> ⏰ {reminder.text}'
        else:
            conversation = Conversation("feishu", target.chat_id, target.chat_type, target.user_id, target.thread)
            turn = self._chat_manager.turn(conversation, reminder.text)
            pieces = turn if self._tool_loop is None else self._tool_loop.answer(conversation, turn)
            text = f"🗓 {reminder.text}\n\n" + "".join([piece async for piece in pieces])
        attempt = f"reminder:{reminder.id}:{fired_at.isoformat()}"
        await self._replier.post(target.chat_id, target.thread, text, attempt=attempt)

    def status(self) -> FeishuStatus:
        """How events reach the bot now, and when the last one came; read from any thread."""
        return FeishuStatus(self._transport_state(), self._last_event_at)

    def _transport_state(self) -> TransportState:
        if not self._settings.enabled:
            return TransportState.OFF
        if self._long_connection is None:
            return TransportState.WEBHOOK
        return self._long_connection.state

    async def _fetched(self, message_id: str, chat_type: str) -> P2ImMessageReceiveV1 | None:
        """The receive event of a message as Feishu has it now; None if it is recalled or cannot be fetched."""
        try:
            message = await self._api.message(message_id)
            event = fetched_event(message, chat_type)
        except Exception as exc:  # noqa: BLE001 - network, auth, server or odd data: it is not answered
            log.warning("feishu: message %s cannot be fetched to answer it again (%s)", message_id, exc)
            return None
        return None if message.deleted else event

    async def _handle_item(self, item: Delivery | CardClick) -> None:
        if isinstance(item, CardClick):
            await self._clicked(item)
            return
        await self._handle(item)

    def _on_card_action(self, event: P2CardActionTrigger) -> P2CardActionTriggerResponse:
        # As _on_message; what this returns is the toast the user sees, which Feishu waits 3 s for.
        self._last_event_at = utcnow()
        click = read_click(event)
        if click is None:
            log.warning("feishu: a card callback that is not one of the bot's buttons is ignored")
            return P2CardActionTriggerResponse()
        try:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._lanes.submit, Lane(click.chat_id, click.thread_id), click)
        except Exception:
            log.exception("feishu: a card click could not be queued and is dropped")
            return toast(CLICK_DROPPED, "error")
        return toast(click.button.toast)

    async def _clicked(self, click: CardClick) -> None:
        await self._identified.wait()
        if not await self._policy.first_click(click.event_id, click.chat_type):
            return
        in_thread = click.conversation_thread is not None
        if await self._refused(Asking.of_click(click), click.question_id, in_thread=in_thread):
            return
        log.info("feishu: %s clicked on the answer to message %s", click.button.label, click.question_id)
        if click.button.action == NEW_SESSION:
            await self._chat_manager.sessions.reset(click.conversation())
            return
        await self._regenerate(click)

    async def _regenerate(self, click: CardClick) -> None:
        """Answer the question the clicked card answers again, in a reply of its own."""
        event = await self._fetched(click.question_id, click.chat_type)
        if event is None:
            return
        # The question may be of any age: it is asked again now, so its age is not held against it.
        asked_s = int(event.event.message.create_time) / 1000
        message = self._policy.admit(event, now=asked_s)
        if message is None:
            return
        await self._answer(message, attempt=f"regenerate-{click.event_id}")


def _lane(event: P2ImMessageReceiveV1) -> Lane:
    message = event.event.message
    return Lane(message.chat_id, message.thread_id or None)
