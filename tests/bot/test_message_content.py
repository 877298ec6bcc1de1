"""What a Feishu message says (`bot.content`), and the bot's small expiring memory (`bot.recent`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bot.content import NOTHING, Said, clip, read, resolve_mentions
from bot.recent import Recent


def post(*paragraphs: list[dict[str, Any]], title: str = "") -> str:
    return json.dumps({"title": title, "content": list(paragraphs)})


@pytest.mark.parametrize(
    ("element", "said"),
    [
        pytest.param({"tag": "text", "text": "plain "}, Said("plain ", "plain "), id="text"),
        pytest.param({"tag": "a", "text": "docs", "href": "https://example.com"}, Said("docs", "docs"), id="a"),
        pytest.param({"tag": "at", "user_id": "@_user_1", "user_name": "Bob"}, Said("@_user_1", "@_user_1"), id="at"),
        pytest.param({"tag": "code_block", "language": "GO", "text": "go test"}, Said("go test", "go test"), id="code"),
        pytest.param({"tag": "md", "text": "**bold**"}, Said("**bold**", "**bold**"), id="md"),
        pytest.param({"tag": "img", "image_key": "img_1"}, Said("[image]", ""), id="img"),
        pytest.param({"tag": "media", "file_key": "f_1", "image_key": "img_1"}, Said("[video]", ""), id="media"),
        pytest.param({"tag": "emotion", "emoji_type": "SMILE"}, Said(":SMILE:", ":SMILE:"), id="emotion"),
        pytest.param({"tag": "emotion"}, Said("[emoji]", ""), id="emotion without a type"),
        pytest.param({"tag": "hr"}, Said("---", ""), id="hr"),
        pytest.param({"tag": "sparkle", "text": "new"}, Said("new", "new"), id="a tag to come, with text"),
        pytest.param({"tag": "sparkle"}, NOTHING, id="a tag to come, without text"),
    ],
)
def test_every_post_element_reads_as_its_text_or_a_marker(element: dict[str, Any], said: Said) -> None:
    assert read("post", post([element])) == said


def test_a_post_keeps_its_title_and_its_paragraphs_in_order() -> None:
    content = post(
        [{"tag": "text", "text": "look "}, {"tag": "img", "image_key": "img_1"}, {"tag": "text", "text": " here"}],
        [{"tag": "img", "image_key": "img_2"}],
        title="Bug",
    )

    said = read("post", content)

    assert said == Said("Bug\nlook [image] here\n[image]", "Bug\nlook  here\n")
    assert said.readable


def test_a_post_of_images_has_nothing_to_read() -> None:
    assert not read("post", post([{"tag": "img", "image_key": "img_1"}], [{"tag": "hr"}])).readable


def test_a_post_fetched_through_the_api_may_come_in_a_locale() -> None:
    content = json.dumps({"zh_cn": {"title": "", "content": [[{"tag": "text", "text": "你好"}]]}})

    assert read("post", content) == Said("你好", "你好")


@pytest.mark.parametrize(
    ("message_type", "content", "marker"),
    [
        ("image", {"image_key": "img_1"}, "[image]"),
        ("file", {"file_key": "f_1", "file_name": "report.pdf"}, "[file: report.pdf]"),
        ("file", {"file_key": "f_1"}, "[file]"),
        ("folder", {"file_key": "f_1", "file_name": "specs"}, "[folder: specs]"),
        ("media", {"file_key": "f_1", "image_key": "img_1", "file_name": "demo.mp4"}, "[video: demo.mp4]"),
        ("sticker", {"file_key": "f_1"}, "[sticker]"),
        ("audio", {"file_key": "f_1", "duration": 2000}, "[audio]"),
        ("merge_forward", {"content": "Merged and Forwarded Message"}, "[forwarded messages]"),
        ("share_chat", {"chat_id": "oc_1"}, "[shared chat]"),
        ("share_user", {"user_id": "ou_1"}, "[shared contact]"),
        ("location", {"name": "Hangzhou"}, "[location]"),
    ],
)
def test_messages_without_text_are_a_marker(message_type: str, content: dict[str, Any], marker: str) -> None:
    assert read(message_type, json.dumps(content)) == Said(marker, "")


def test_a_text_message_is_its_text_with_mentions_as_placeholders() -> None:
    assert read("text", json.dumps({"text": "@_user_1 ask @_user_2"})) == Said(
        "@_user_1 ask @_user_2", "@_user_1 ask @_user_2"
    )


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", None])
def test_content_that_is_not_a_json_object_says_nothing(content: str | None) -> None:
    assert read("text", content) == Said("", "")


def test_a_card_reads_as_its_texts_in_order_without_its_buttons() -> None:
    card = {
        "header": {"title": {"tag": "plain_text", "content": "Deploy"}},
        "elements": [
            {"tag": "div", "text": {"tag": "lark_md", "content": "**Done** in 3 min"}},
            {"tag": "action", "actions": [{"tag": "button", "text": {"tag": "plain_text", "content": "Undo"}}]},
            {"tag": "img", "img_key": "img_1", "alt": {"tag": "plain_text", "content": ""}},
        ],
    }

    assert read("interactive", json.dumps(card)) == Said("Deploy\n**Done** in 3 min", "Deploy\n**Done** in 3 min")


def test_a_card_read_as_raw_card_content_is_its_json_in_a_string() -> None:
    card = {"schema": "2.0", "body": {"elements": [{"tag": "markdown", "element_id": "answer", "content": "42"}]}}

    assert read("interactive", json.dumps({"json_card": json.dumps(card)})) == Said("42", "42")


def test_mentions_are_resolved_by_name_or_dropped() -> None:
    assert resolve_mentions("@_user_1 ask @_user_2 @_user_3", {"@_user_2": "@Bob", "@_user_3": ""}) == " ask @Bob "


def test_clip_keeps_short_text_and_ends_long_text_with_an_ellipsis() -> None:
    assert (clip("short", 5), clip("a longer text", 8)) == ("short", "a longe…")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_recent_entries_expire() -> None:
    clock = Clock()
    recent: Recent[str, str] = Recent(10, ttl_s=60, clock=clock)
    recent.put("a", "Alice")
    recent.put("b", "Bob", ttl_s=5)

    clock.now = 30
    assert (recent.get("a"), recent.get("b")) == ("Alice", None)
    clock.now = 60
    assert recent.get("a") is None


def test_recent_drops_the_least_recently_used_beyond_its_capacity() -> None:
    recent: Recent[str, int] = Recent(2, ttl_s=60)
    recent.put("a", 1)
    recent.put("b", 2)
    recent.get("a")
    recent.put("c", 3)

    assert (recent.get("a"), recent.get("b"), recent.get("c")) == (1, None, 3)
