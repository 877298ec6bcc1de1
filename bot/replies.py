"""Replies in Feishu: plain text for short notices, a streamed card for answers.

An answer streams into a CardKit card (card JSON 2.0 in streaming mode, sent by card_id as a
reply, its markdown element updated with a strictly increasing sequence, streaming mode closed at
the end), at most one update per `interval_s`. When CardKit is refused (the app lacks the
cardkit:card:write scope, or the tenant does not have CardKit) the card is sent whole and patched
instead. An answer too long for one card continues in the next, and the last card ends with the
buttons it is given; if generating or showing the answer fails, the card says so in a footer. A
card a stopped process left streaming is closed by the attempt that answers its message again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterable, Awaitable, Callable, Sequence
from typing import Any, Protocol

from bot.feishu_api import FeishuApi, FeishuApiError
from chat import EngineUnavailable

log = logging.getLogger(__name__)

ANSWER_ELEMENT = "answer"
PLACEHOLDER = "…"
FOOTER_RULE = "\n\n---\n"
ERROR_FOOTER = FOOTER_RULE + "⚠️ Something went wrong while I was answering; please try again."
UNAVAILABLE_FOOTER = FOOTER_RULE + "⚠️ Sorry, the model server cannot be reached now; please try again in a minute."
INTERRUPTED = "⚠️ This answer was cut off; it is answered again in a new reply."
# A reply of nothing visible (SmolLM2 sometimes answers only line breaks) would leave the card's
# "…" looking as if the answer were still coming.
EMPTY_ANSWER = "⚠️ The model gave an empty answer; please rephrase or ask again."
# How a card is named to whoever closes it later: a CardKit card by card_id, a patched one by message_id.
CARDKIT_CARD = "cardkit:"
PATCHED_CARD = "message:"
# A card's updates are numbered from 1, one per update; whoever closes it after its writer stopped
# cannot know the last number, so it starts above any a writer reaches (an update per stream interval).
CLOSING_SEQUENCE = 1 << 30
# A card's JSON may be at most 30 KB; 6,000 characters of CJK text take 18 KB of it.
CARD_TEXT_LIMIT = 6000
SUMMARY_CHARS = 60

CardElements = Sequence[dict[str, Any]]
CardOpened = Callable[[str], Awaitable[None]]


class CardWriter(Protocol):
    async def update(self, text: str) -> None: ...

    async def finish(self, text: str, actions: CardElements = ()) -> None: ...


class Replier:
    def __init__(self, api: FeishuApi, *, interval_s: float, card_text_limit: int = CARD_TEXT_LIMIT) -> None:
        self._api = api
        self._interval_s = interval_s
        self._card_text_limit = card_text_limit

    async def text(self, message_id: str, text: str, *, in_thread: bool) -> None:
        await self._api.reply(message_id, "text", {"text": text}, uuid=_uuid(message_id, "text"), in_thread=in_thread)

    async def post(self, chat_id: str, thread: str | None, text: str, *, attempt: str) -> None:
        """A message the bot starts itself (a reminder): in the thread if there is one, else in the chat."""
        content, uuid = {"text": text}, _uuid(chat_id, attempt)
        if thread is None:
            await self._api.send(chat_id, "text", content, uuid=uuid)
            return
        await self._api.reply(thread, "text", content, uuid=uuid, in_thread=True)

    async def stream(
        self,
        message_id: str,
        deltas: AsyncIterable[str],
        *,
        in_thread: bool,
        attempt: str = "",
        actions: CardElements = (),
        opened: CardOpened | None = None,
    ) -> None:
        """Stream the answer `deltas` make up into card(s) replying to `message_id`; `actions`
        (card JSON 2.0 elements: its buttons) end the last card. `opened` is told each card, by
        the name `close_interrupted` takes, before the answer streams into it.

        A card is never left streaming: if generating or showing the answer fails, or the reply
        is cancelled, the card is finished with what it has and an error line. This raises only
        when even that cannot be shown. A later `attempt` at answering the message ("resumed"
        after a restart, a click's for a regenerate) sends cards of its own: Feishu would answer a
        repeated uuid with the card it sent before."""
        part = 0
        card = await self._open_card(message_id, part, in_thread, attempt, opened)
        text = ""
        try:
            next_update = time.monotonic() + self._interval_s
            async for delta in deltas:
                text += delta
                while len(text) > self._card_text_limit:
                    cut = _split_point(text, self._card_text_limit)
                    await card.finish(text[:cut])
                    text, part = text[cut:], part + 1
                    card = await self._open_card(message_id, part, in_thread, attempt, opened)
                if time.monotonic() >= next_update:
                    await card.update(text)
                    next_update = time.monotonic() + self._interval_s
            await card.finish(text or EMPTY_ANSWER, actions)
        except asyncio.CancelledError:
            log.warning("feishu: the answer to %s was cancelled", message_id)
            await card.finish(_ended(text, ERROR_FOOTER), actions)
            raise
        except EngineUnavailable as exc:
            log.warning("feishu: answering %s failed: %s", message_id, exc)
            await card.finish(_ended(text, UNAVAILABLE_FOOTER), actions)
        except Exception:
            log.exception("feishu: answering %s failed", message_id)
            await card.finish(_ended(text, ERROR_FOOTER), actions)

    async def close_interrupted(self, card: str) -> None:
        """Replace a card whose answer was cut off (named as `stream` told `opened`) with the
        INTERRUPTED line, streaming stopped: whether its writer stopped mid-answer or finished it
        with an error line, the answer now follows in a new reply."""
        closed = _card(INTERRUPTED, streaming=False)
        if card.startswith(PATCHED_CARD):
            await self._api.patch_card(card.removeprefix(PATCHED_CARD), closed)
            return
        assert card.startswith(CARDKIT_CARD), f"not a card reference: {card!r}"
        card_id = card.removeprefix(CARDKIT_CARD)
        await self._api.update_card(card_id, closed, sequence=CLOSING_SEQUENCE, uuid=_uuid(card_id, CLOSING_SEQUENCE))

    async def _open_card(
        self, message_id: str, part: int, in_thread: bool, attempt: str, opened: CardOpened | None
    ) -> CardWriter:
        reply_uuid = _uuid(message_id, f"card-{part}-{attempt}" if attempt else f"card-{part}")
        try:
            card_id = await self._api.create_card(_card(PLACEHOLDER, streaming=True))
        except FeishuApiError as exc:
            log.warning("feishu: CardKit refused (%s); patching the card instead", exc)
            sent = await self._api.reply(
                message_id, "interactive", _card(PLACEHOLDER, streaming=False), uuid=reply_uuid, in_thread=in_thread
            )
            if opened is not None:
                await opened(PATCHED_CARD + sent)
            return PatchedCard(self._api, sent)
        if opened is not None:
            await opened(CARDKIT_CARD + card_id)  # before it is shown: no card is ever shown unrecorded
        await self._api.reply(
            message_id,
            "interactive",
            {"type": "card", "data": {"card_id": card_id}},
            uuid=reply_uuid,
            in_thread=in_thread,
        )
        return StreamingCard(self._api, card_id)


class StreamingCard:
    """A CardKit card in streaming mode; Feishu types out what each update adds."""

    def __init__(self, api: FeishuApi, card_id: str) -> None:
        self._api = api
        self._card_id = card_id
        self._sequence = 0
        self._shown = PLACEHOLDER

    async def update(self, text: str) -> None:
        if not text or text == self._shown:
            return
        sequence = self._next_sequence()
        await self._api.set_element_content(
            self._card_id, ANSWER_ELEMENT, text, sequence=sequence, uuid=_uuid(self._card_id, sequence)
        )
        self._shown = text

    async def finish(self, text: str, actions: CardElements = ()) -> None:
        await self.update(text)
        if actions:
            await self._append(actions)
        sequence = self._next_sequence()
        settings = {"config": {"streaming_mode": False, "summary": {"content": _summary(self._shown)}}}
        await self._api.set_card_settings(
            self._card_id, settings, sequence=sequence, uuid=_uuid(self._card_id, sequence)
        )

    async def _append(self, elements: CardElements) -> None:
        # The answer is whole without its buttons: a card that cannot take them is still finished.
        sequence = self._next_sequence()
        try:
            await self._api.append_card_elements(
                self._card_id, list(elements), sequence=sequence, uuid=_uuid(self._card_id, sequence)
            )
        except FeishuApiError as exc:
            log.warning("feishu: card %s is finished without its buttons (%s)", self._card_id, exc)

    def _next_sequence(self) -> int:
        self._sequence += 1
        return self._sequence


class PatchedCard:
    """A card sent whole and replaced by a patch on each update."""

    def __init__(self, api: FeishuApi, message_id: str) -> None:
        self._api = api
        self._message_id = message_id
        self._shown = PLACEHOLDER

    async def update(self, text: str) -> None:
        if not text or text == self._shown:
            return
        await self._patch(text)

    async def finish(self, text: str, actions: CardElements = ()) -> None:
        if not actions:
            await self.update(text)
            return
        await self._patch(text or self._shown, actions)

    async def _patch(self, text: str, actions: CardElements = ()) -> None:
        await self._api.patch_card(self._message_id, _card(text, streaming=False, actions=actions))
        self._shown = text


def _card(text: str, *, streaming: bool, actions: CardElements = ()) -> dict[str, Any]:
    config: dict[str, Any] = {"update_multi": True, "summary": {"content": _summary(text)}}
    if streaming:
        config |= {
            "streaming_mode": True,
            "summary": {"content": "[Answering…]"},
            "streaming_config": {
                "print_frequency_ms": {"default": 30},
                "print_step": {"default": 2},
                "print_strategy": "fast",
            },
        }
    return {
        "schema": "2.0",
        "config": config,
        "body": {"elements": [{"tag": "markdown", "element_id": ANSWER_ELEMENT, "content": text}, *actions]},
    }


def _summary(text: str) -> str:
    """The preview a chat list shows for the card."""
    line = " ".join(text.split())
    return line if len(line) <= SUMMARY_CHARS else line[: SUMMARY_CHARS - 1] + "…"


def _split_point(text: str, limit: int) -> int:
    """Where to end a card: at a paragraph, line or word break in the second half of `limit`."""
    for separator in ("\n\n", "\n", " "):
        cut = text.rfind(separator, limit // 2, limit)
        if cut != -1:
            return cut + len(separator)
    return limit


def _uuid(scope: str, item: object) -> str:
    # Deterministic, so a retried send carries the same uuid and Feishu drops the repeat.
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"feishu:{scope}:{item}"))


def _ended(text: str, footer: str) -> str:
    """A failed answer's last text: what was shown and the footer under a rule; the footer's line
    alone when nothing was shown."""
    return text + footer if text else footer.removeprefix(FOOTER_RULE)
