"""What the model reads from a Feishu message: the words, who said them, and what they answer.

In a group several people talk to one model, so a group message starts with its sender's name
("Alice: ..."); a private one does not, nor one in a session of its own user
(`context.session_scope: user`). A reply carries the message it answers as a quote before the
words ("> Bob: ...", at most QUOTE_CHARS), fetched through the Open API, the bot's own answers
too. In a thread every message replies to the thread's root, so the root is quoted once per
session, not with every message. A merged forward reads as the messages it carries, each with its
sender. The result is what the session stores, so later turns reuse it as it was.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from bot.content import Said, clip, read, resolve_mentions
from bot.feishu_api import FeishuApi
from bot.names import SenderNames
from bot.policy import IncomingMessage
from bot.recent import Recent
from chat import Conversation, SessionStore

log = logging.getLogger(__name__)

QUOTE_CHARS = 500
# A forward carries up to 100 messages; their senders' names are looked up, and the whole must
# leave room under limits.max_message_chars (8,000 by default) for the words around it.
FORWARDED_MESSAGES = 100
FORWARD_CHARS = 4000
FORWARD_HEADER = "[forwarded messages]"
UNREADABLE = "[a message I cannot read]"
THREADS_KEPT = 10_000
CHATS_KEPT = 10_000
MEMORY_TTL_S = 86_400.0
TEXT_ONLY = {"en": "I can only read text for now.", "zh": "我目前只能读文字。"}
CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


class Reader:
    def __init__(self, api: FeishuApi, names: SenderNames, sessions: SessionStore) -> None:
        self._api = api
        self._names = names
        self._sessions = sessions
        self._quoted_roots: Recent[tuple[str, str], bool] = Recent(THREADS_KEPT, MEMORY_TTL_S)
        self._languages: Recent[str, str] = Recent(CHATS_KEPT, MEMORY_TTL_S)

    async def model_text(self, message: IncomingMessage, conversation: Conversation) -> str | None:
        """What the model is asked; None when the message has nothing but what it cannot read. An
        empty message stays empty, for the chat manager to refuse, unless it replies to one: then
        the quote is the question ("@bot" under a message: what about this?)."""
        words = await self._words(message)
        if words is None:
            return None
        quote = await self._quote(message, conversation)
        if not words and quote is None:
            return words
        self._remember_language(message.chat_id, words)
        return "\n\n".join(part for part in (quote, await self._spoken(message, words)) if part)

    def text_only_notice(self, chat_id: str) -> str:
        """The notice for a message without text, in the chat's language if it has shown one."""
        language = self._languages.get(chat_id)
        return TEXT_ONLY[language] if language else " ".join(TEXT_ONLY.values())

    async def _words(self, message: IncomingMessage) -> str | None:
        if message.message_type != "merge_forward":
            return message.text
        said = await self._read(await self._fetch(message.message_id))
        return said.text if said.readable else None

    def _remember_language(self, chat_id: str, words: str) -> None:
        if words:
            self._languages.put(chat_id, "zh" if CJK.search(words) else "en")

    async def _spoken(self, message: IncomingMessage, words: str) -> str:
        """The words as their sender said them: by name where several people share the session."""
        if message.chat_type != "group" or self._sessions.settings.session_scope == "user":
            return words
        return f"{await self._names.user(message.sender_open_id)}: {words}".rstrip()

    async def _quote(self, message: IncomingMessage, conversation: Conversation) -> str | None:
        if message.parent_id is None:
            return None
        if message.thread_id is not None and message.parent_id == message.root_id:
            root = (self._sessions.key(conversation), message.parent_id)
            if self._quoted_roots.get(root):
                return None
            self._quoted_roots.put(root, True)
        fetched = await self._fetch(message.parent_id)
        said = await self._read(fetched)
        if fetched:
            said = _signed(await self._sender(fetched[0]), said)
        return "\n".join(f"> {line}" for line in clip(said.text, QUOTE_CHARS).splitlines())

    async def _fetch(self, message_id: str) -> list[Any]:
        """The message and what it carries, as the Open API has them; [] when it cannot be read."""
        try:
            fetched = await self._api.messages(message_id)
        except Exception as exc:  # noqa: BLE001 - gone, not permitted, network or server: it reads as unreadable
            log.warning("feishu: message %s cannot be fetched to read it (%s)", message_id, exc)
            return []
        return [] if not fetched or fetched[0].deleted else fetched

    async def _read(self, fetched: list[Any]) -> Said:
        """What a fetched message says; a merged forward, the messages it carries."""
        if not fetched:
            return Said(UNREADABLE, "")
        message, *carried = fetched
        return await self._forward(carried) if message.msg_type == "merge_forward" else _said(message)

    async def _forward(self, carried: list[Any]) -> Said:
        carried = carried[:FORWARDED_MESSAGES]
        senders = list(dict.fromkeys(map(_sender_of, carried)))  # each looked up once, together
        names = dict(zip(senders, await asyncio.gather(*(self._names.sender(*s) for s in senders)), strict=True))
        lines = [_signed(names[_sender_of(message)], _said(message)) for message in carried]
        text = "\n".join([FORWARD_HEADER, *(line.text for line in lines)])
        return Said(clip(text, FORWARD_CHARS), "\n".join(line.words for line in lines))

    async def _sender(self, message: Any) -> str:
        return await self._names.sender(*_sender_of(message))


def _said(message: Any) -> Said:
    """What a message fetched through the Open API says, its mentions by name."""
    names = {mention.key: f"@{mention.name}" for mention in message.mentions or []}
    content = message.body.content if message.body is not None else None
    return read(message.msg_type, content).map(lambda text: resolve_mentions(text, names).strip())


def _signed(name: str, said: Said) -> Said:
    return Said(f"{name}: {said.text}", said.words)


def _sender_of(message: Any) -> tuple[str, str]:
    return message.sender.id, message.sender.sender_type
