"""What a Feishu message says, as text the model can read.

`bot.policy` decides whether the bot answers a message; this module says what was said in it.
Words are kept: text, a post's title and paragraphs (links, code, mentions), a card's markdown.
What the model cannot read is marked where it was ("[image]", "[file: report.pdf]", "[video]"), so
that the words around it keep their sense. A message of markers only has nothing to read.

Mentions stay Feishu's placeholders ("@_user_1"): who they name is in the message's `mentions`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

PLACEHOLDER = re.compile(r"@_user_\d+")
ELLIPSIS = "…"

# Message types that are nothing but a marker; any other unknown type reads "[its type]".
TYPE_MARKERS = {
    "merge_forward": "[forwarded messages]",
    "share_chat": "[shared chat]",
    "share_user": "[shared contact]",
}
ELEMENT_MARKERS = {"img": "[image]", "media": "[video]", "hr": "---"}
CARD_TEXT_TAGS = ("markdown", "plain_text", "lark_md")
# A card's buttons are controls, not what it says.
CARD_SKIPPED_TAGS = ("button",)


@dataclass(frozen=True)
class Said:
    """A message's text with its markers in place, and its words: the same text without them."""

    text: str
    words: str

    @property
    def readable(self) -> bool:
        return bool(self.words.strip())

    def map(self, change: Callable[[str], str]) -> Said:
        return Said(change(self.text), change(self.words))


NOTHING = Said("", "")


def read(message_type: str, content: str | None) -> Said:
    """What a message of `message_type` says, from its JSON `content` (an event's or the Open API's)."""
    try:
        body = json.loads(content or "{}")
    except json.JSONDecodeError:
        return NOTHING
    if not isinstance(body, dict):
        return NOTHING
    reader = READERS.get(message_type)
    if reader is None:
        return _marker(TYPE_MARKERS.get(message_type, f"[{message_type}]"))
    return reader(body)


def resolve_mentions(text: str, names: Mapping[str, str]) -> str:
    """Each "@_user_N" placeholder as `names` says, or gone if it does not say."""
    return PLACEHOLDER.sub(lambda match: names.get(match.group(), ""), text)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(ELLIPSIS)] + ELLIPSIS


def _text(body: dict[str, Any]) -> Said:
    return _words(str(body.get("text", "")))


def _post(body: dict[str, Any]) -> Said:
    # Events carry the post itself; the Open API may wrap it in a locale ({"zh_cn": {...}}).
    post = body if "content" in body else next(iter(body.values()), {})
    title = [_words(post["title"])] if post.get("title") else []
    paragraphs = [_joined(map(_element, paragraph), "") for paragraph in post.get("content") or []]
    return _joined([*title, *paragraphs], "\n")


def _element(element: dict[str, Any]) -> Said:
    tag = element.get("tag", "")
    if tag in ELEMENT_MARKERS:
        return _marker(ELEMENT_MARKERS[tag])
    if tag == "emotion":
        return _emotion(element)
    if tag == "at":
        return _words(str(element.get("user_id", "")))
    # text, a, code_block, md, and any tag to come that has text.
    return _words(str(element.get("text", "")))


def _emotion(element: dict[str, Any]) -> Said:
    emoji = element.get("emoji_type")
    return _words(f":{emoji}:") if emoji else _marker("[emoji]")


def _named(kind: str) -> Callable[[dict[str, Any]], Said]:
    def marker(body: dict[str, Any]) -> Said:
        name = body.get("file_name")
        return _marker(f"[{kind}: {name}]" if name else f"[{kind}]")

    return marker


def _card(card: dict[str, Any]) -> Said:
    return _words("\n".join(text for text in _card_texts(card) if text))


def _card_texts(node: Any) -> Iterator[str]:
    """The text of a card's markdown and text elements, in order, at any depth."""
    if isinstance(node, list):
        for item in node:
            yield from _card_texts(item)
        return
    if not isinstance(node, dict) or node.get("tag") in CARD_SKIPPED_TAGS:
        return
    if node.get("tag") in CARD_TEXT_TAGS and isinstance(node.get("content"), str):
        yield node["content"]
        return
    for key, value in node.items():
        yield from _card_texts(_json_card(value) if key == "json_card" else value)


def _json_card(value: Any) -> Any:
    # Read with card_msg_content_type=raw_card_content, an app's card comes as its JSON in a string.
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return None


def _words(text: str) -> Said:
    return Said(text, text)


def _marker(marker: str) -> Said:
    return Said(marker, "")


def _joined(parts: Iterable[Said], separator: str) -> Said:
    parts = list(parts)
    return Said(separator.join(p.text for p in parts), separator.join(p.words for p in parts))


READERS: dict[str, Callable[[dict[str, Any]], Said]] = {
    "text": _text,
    "post": _post,
    "interactive": _card,
    "file": _named("file"),
    "folder": _named("folder"),
    "media": _named("video"),
}
