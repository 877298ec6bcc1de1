"""FeishuBot: Feishu events in, answers out, one chat queue at a time.

transport (long connection | webhook) -> lark-oapi dispatcher -> chat lane
-> policy (answer? first delivery?) -> command | ChatManager turn -> reply card -> claim finished

At start, the messages a stopped process claimed but never finished answering are fetched and
queued again (`Delivery.resumed`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta

import lark_oapi as lark
from fastapi import APIRouter
from lark_oapi.api.im.v1 import P2ImMessageReceiveV1

from bot.commands import Commands, parse_command
from bot.feishu_api import FeishuApi
from bot.lanes import ChatLanes
from bot.policy import EventPolicy, IncomingMessage, Unanswered, fetched_event
from bot.replies import Replier
from bot.transport import LongConnection, webhook_router
from chat import ChatManager, Conversation, InvalidMessage
from settings import FeishuSettings
from storage import Database

log = logging.getLogger(__name__)

UNSUPPORTED = "Sorry, I can only read text and rich-text messages for now."
IDENTIFY_RETRY_MAX_S = 60.0


@dataclass(frozen=True)
class Delivery:
    """An event for a chat's lane; `resumed`: claimed before a restart and never answered."""

    event: P2ImMessageReceiveV1
    resumed: bool = False


class FeishuBot:
    def __init__(
        self, settings: FeishuSettings, chat_manager: ChatManager, db: Database, *, shutdown_grace_s: float = 5.0
    ) -> None:
        self._settings = settings
        self._chat_manager = chat_manager
        self._shutdown_grace_s = shutdown_grace_s
        self._api = FeishuApi.connect(settings.app_id, settings.app_secret, settings.domain)
        self._policy = EventPolicy(
            db,
            max_event_age=timedelta(seconds=settings.max_event_age_s),
            dedup_ttl=timedelta(seconds=settings.dedup_ttl_s),
            answer_at_all=settings.answer_at_all,
        )
        self._commands = Commands(chat_manager)
        self._replier = Replier(self._api, interval_s=settings.stream_interval_ms / 1000)
        self._lanes: ChatLanes[Delivery] = ChatLanes(self._handle)
        dispatcher = (
            lark.EventDispatcherHandler.builder(settings.encrypt_key, settings.verification_token)
            .register_p2_im_message_receive_v1(self._on_message)
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

    async def _answer_again(self, unanswered: list[Unanswered]) -> None:
        """Queue the messages whose reply a stopped process never finished, as Feishu has them now."""
        for claim in unanswered:
            try:
                message = await self._api.message(claim.message_id)
                event = fetched_event(message, claim.chat_type)
            except Exception as exc:  # noqa: BLE001 - network, auth, server or odd data: it stays unanswered
                log.warning("feishu: message %s cannot be fetched to answer it again (%s)", claim.message_id, exc)
                continue
            if message.deleted:
                continue
            log.info("feishu: answering message %s again after a restart", claim.message_id)
            self._lanes.submit(message.chat_id, Delivery(event, resumed=True))

    def _on_message(self, event: P2ImMessageReceiveV1) -> None:
        # Called by lark-oapi, on its long-connection thread or inside the webhook request: hand
        # the event to the chat's lane and return at once; never raise into the SDK.
        try:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._lanes.submit, event.event.message.chat_id, Delivery(event))
        except Exception:
            log.exception("feishu: an event could not be queued and is dropped")

    async def _handle(self, delivery: Delivery) -> None:
        await self._identified.wait()
        message = self._policy.admit(delivery.event)
        if message is None:
            return
        if not delivery.resumed and not await self._policy.first_delivery(message):
            return
        await self._answer(message, resumed=delivery.resumed)
        await self._policy.finished(message)

    async def _answer(self, message: IncomingMessage, *, resumed: bool) -> None:
        in_thread = message.thread_id is not None
        if message.text is None:
            await self._replier.text(message.message_id, UNSUPPORTED, in_thread=in_thread)
            return
        conversation = Conversation(
            channel="feishu",
            chat_id=message.chat_id,
            chat_type=message.chat_type,
            user_id=message.sender_open_id,
            thread_id=message.thread_id,
        )
        command = parse_command(message.text)
        if command is not None:
            reply = await self._commands.run(command, conversation)
            await self._replier.text(message.message_id, reply, in_thread=in_thread)
            return
        try:
            turn = self._chat_manager.turn(conversation, message.text)
        except InvalidMessage as exc:
            await self._replier.text(message.message_id, str(exc), in_thread=in_thread)
            return
        await self._replier.stream(message.message_id, turn, in_thread=in_thread, resumed=resumed)
