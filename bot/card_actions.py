"""The buttons on an answer's last card, "New session" and "Regenerate", and the clicks on them.

A click comes back as a `card.action.trigger` callback, over the long connection or the webhook
like any event. Feishu waits at most 3 s for its answer, so the bot only queues the click in the
question's lane and answers with a toast at once. A button's value carries what its click needs:
the question the card answers, the kind of chat and the thread it was asked in, and the thread of
the conversation the answer belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lark_oapi.event.callback.model.p2_card_action_trigger import P2CardActionTrigger, P2CardActionTriggerResponse

from bot.policy import IncomingMessage
from chat import Conversation

NEW_SESSION = "new_session"
REGENERATE = "regenerate"


@dataclass(frozen=True)
class Button:
    action: str
    label: str
    toast: str
    """What the clicking user is told at once, while the click waits its turn in the chat's lane."""


BUTTONS = {
    button.action: button
    for button in (
        Button(NEW_SESSION, "New session", "Starting a new conversation."),
        Button(REGENERATE, "Regenerate", "Answering the question again."),
    )
}


@dataclass(frozen=True)
class CardClick:
    event_id: str
    """The callback's event_id: a redelivered click carries the same."""
    button: Button
    chat_id: str
    chat_type: str
    operator_open_id: str
    question_id: str
    thread_id: str | None
    """The question's thread in Feishu: the click joins that lane."""
    conversation_thread: str | None
    """The thread of the conversation the card answers in (`Conversation.thread_id`)."""

    def conversation(self) -> Conversation:
        """The clicking user's conversation, where the card's answer was given."""
        return Conversation(
            channel="feishu",
            chat_id=self.chat_id,
            chat_type=self.chat_type,
            user_id=self.operator_open_id,
            thread_id=self.conversation_thread,
        )


def card_buttons(question: IncomingMessage, conversation_thread: str | None) -> list[dict[str, Any]]:
    """Card JSON 2.0 elements: the buttons, in one row, for the card that answers `question`."""
    about = {
        "question_id": question.message_id,
        "chat_type": question.chat_type,
        "thread_id": question.thread_id,
        "conversation_thread": conversation_thread,
    }
    columns = [_column(_button(button, about)) for button in BUTTONS.values()]
    return [{"tag": "column_set", "horizontal_spacing": "small", "columns": columns}]


def read_click(event: P2CardActionTrigger) -> CardClick | None:
    """The click `event` reports, or None for a callback that is not a click on these buttons."""
    data = event.event
    if event.header is None or data is None or data.action is None or data.context is None or data.operator is None:
        return None
    value = data.action.value if isinstance(data.action.value, dict) else {}
    button = BUTTONS.get(_text(value.get("action")))
    event_id = _text(event.header.event_id)
    chat_id = _text(data.context.open_chat_id)
    operator = _text(data.operator.open_id)
    question_id = _text(value.get("question_id"))
    if button is None or not (event_id and chat_id and operator and question_id):
        return None
    return CardClick(
        event_id=event_id,
        button=button,
        chat_id=chat_id,
        chat_type="p2p" if value.get("chat_type") == "p2p" else "group",
        operator_open_id=operator,
        question_id=question_id,
        thread_id=_text(value.get("thread_id")) or None,
        conversation_thread=_text(value.get("conversation_thread")) or None,
    )


def toast(text: str, kind: str = "info") -> P2CardActionTriggerResponse:
    """The callback's answer: a toast over the card, for the clicking user only."""
    return P2CardActionTriggerResponse({"toast": {"type": kind, "content": text}})


def _button(button: Button, about: dict[str, Any]) -> dict[str, Any]:
    return {
        "tag": "button",
        "text": {"tag": "plain_text", "content": button.label},
        "type": "default",
        "size": "small",
        "behaviors": [{"type": "callback", "value": {"action": button.action, **about}}],
    }


def _column(element: dict[str, Any]) -> dict[str, Any]:
    return {"tag": "column", "width": "auto", "elements": [element]}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
