"""Access and quotas on Feishu: the private-chat allowlist, the allowed groups, /system and /reset
for admins only in groups, a token bucket per user. Each refusal is one reply, costs no engine
request, and a redelivered refused message is not answered again."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.access import ADMINS_ONLY, NOT_OPEN, TOO_FAST, AccessRules, Asking, Gate, Refusal
from bot.card_actions import BUTTONS, NEW_SESSION, REGENERATE, CardClick
from chat.rate_limits import TokenBuckets
from settings import ConfigError, load_settings
from tests.bot.bot_support import (
    AppServer,
    app_settings,
    engine_requests,
    final_text,
    posted,
    pushed,
    start_connected,
    webhook_app_settings,
)
from tests.fakes.events import mentioning_bot, message_event
from tests.fakes.feishu import FakeFeishu
from tests.support import Clock

ALICE, ADMIN, BOB, STRANGER = "ou_alice", "ou_admin", "ou_bob", "ou_stranger"
TEAM, ELSEWHERE = "oc_team", "oc_elsewhere"
TOO_FAST_REPLY = re.compile(re.escape(TOO_FAST).replace(re.escape("{wait_s}"), r"(\d+)"))


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, fake: FakeFeishu) -> Iterator[AppServer]:
    settings = app_settings(
        tmp_path_factory.mktemp("access"),
        fake,
        dm_policy="allowlist",
        allowed_users=[ALICE],
        allowed_chats=[TEAM],
        admins=[ADMIN],
        requests_per_minute=0,
    )
    server = start_connected(settings, fake)
    yield server
    server.stop()


def dm(sender: str, text: str) -> dict[str, Any]:
    return message_event(chat_id=f"oc_with_{sender}", sender_open_id=sender, text=text)


def in_group(chat_id: str, sender: str, text: str) -> dict[str, Any]:
    return message_event(chat_id=chat_id, chat_type="group", sender_open_id=sender, **mentioning_bot(text))


def test_a_private_chat_off_the_allowlist_gets_one_refusal_and_no_engine_request(
    app: AppServer, fake: FakeFeishu
) -> None:
    before = engine_requests(app)
    asked = dm(STRANGER, "Can I ask you something?")
    refused = pushed(fake, asked)
    assert final_text(fake, refused) == NOT_OPEN

    pushed(fake, asked)  # Feishu delivers it again
    assert final_text(fake, pushed(fake, dm(STRANGER, "Hello?"))) == NOT_OPEN
    assert len(fake.replies_to(refused)) == 1
    assert engine_requests(app) == before

    for allowed in (ALICE, ADMIN):
        answered = pushed(fake, dm(allowed, "What is a KV cache?"))
        final_text(fake, answered)
        assert [m.msg_type for m in fake.replies_to(answered)] == ["interactive"]  # an answer card


def test_a_group_that_is_not_allowed_gets_one_refusal_and_no_engine_request(app: AppServer, fake: FakeFeishu) -> None:
    before = engine_requests(app)
    refused = pushed(fake, in_group(ELSEWHERE, ALICE, "Are you here too?"))

    assert final_text(fake, refused) == NOT_OPEN
    assert len(fake.replies_to(refused)) == 1
    assert engine_requests(app) == before
    assert final_text(fake, pushed(fake, in_group(TEAM, BOB, "And in the team?"))) != NOT_OPEN


def test_in_a_group_only_admins_change_the_conversation(app: AppServer, fake: FakeFeishu) -> None:
    system = pushed(fake, in_group(TEAM, BOB, "/system Talk like a pirate."))
    reset = pushed(fake, in_group(TEAM, BOB, "/reset"))
    assert final_text(fake, system) == ADMINS_ONLY.format(command="system")
    assert final_text(fake, reset) == ADMINS_ONLY.format(command="reset")
    assert "pirate" not in final_text(fake, pushed(fake, in_group(TEAM, BOB, "/stats")))

    assert "set" in final_text(fake, pushed(fake, in_group(TEAM, ADMIN, "/system Talk like a pirate.")))
    assert "Talk like a pirate." in final_text(fake, pushed(fake, in_group(TEAM, BOB, "/stats")))
    # In a private chat the user owns the conversation.
    assert final_text(fake, pushed(fake, dm(ALICE, "/reset"))) == "Started a new conversation."


def test_a_user_over_the_quota_is_told_when_to_try_again(tmp_path: Path, fake: FakeFeishu) -> None:
    quota = AppServer(webhook_app_settings(tmp_path, fake, requests_per_minute=2)).start()
    try:
        for question in ("One?", "Two?"):
            assert not TOO_FAST_REPLY.fullmatch(final_text(fake, posted(fake, quota, dm(ALICE, question))))
        before = engine_requests(quota)

        refusal = TOO_FAST_REPLY.fullmatch(final_text(fake, posted(fake, quota, dm(ALICE, "Three?"))))

        assert refusal is not None and 1 <= int(refusal[1]) <= 30  # a request every 30 s
        assert engine_requests(quota) == before
        assert not TOO_FAST_REPLY.fullmatch(final_text(fake, posted(fake, quota, dm(BOB, "My turn?"))))
    finally:
        quota.stop()


# --- the rules ------------------------------------------------------------------------------------


def asking(open_id: str = ALICE, *, chat_id: str = TEAM, private: bool = False, command: str | None = None) -> Asking:
    return Asking(open_id=open_id, chat_id=chat_id, private=private, command=command)


def rules(**overrides: Any) -> AccessRules:
    fields: dict[str, Any] = {
        "dm_allowlist": False,
        "allowed_users": frozenset(),
        "allowed_chats": frozenset(),
        "admins": frozenset(),
    }
    return AccessRules(**(fields | overrides))


def refused(rule: AccessRules, question: Asking) -> str | None:
    return text(rule.refusal(question))


def text(refusal: Refusal | None) -> str | None:
    return None if refusal is None else refusal.text


def test_by_default_everyone_may_ask_anywhere_and_run_any_command() -> None:
    for question in (asking(private=True), asking(), asking(command="system"), asking(command="reset")):
        assert refused(rules(), question) is None


def test_a_private_chat_allowlist_lets_in_the_allowed_users_and_the_admins() -> None:
    allowlist = rules(dm_allowlist=True, allowed_users=frozenset({ALICE}), admins=frozenset({ADMIN}))

    assert refused(allowlist, asking(ALICE, private=True)) is None
    assert refused(allowlist, asking(ADMIN, private=True)) is None
    assert refused(allowlist, asking(STRANGER, private=True)) == NOT_OPEN
    assert refused(allowlist, asking(STRANGER)) is None  # groups have rules of their own


def test_allowed_chats_hold_for_groups_only() -> None:
    team_only = rules(allowed_chats=frozenset({TEAM}))

    assert refused(team_only, asking(chat_id=TEAM)) is None
    assert refused(team_only, asking(chat_id=ELSEWHERE)) == NOT_OPEN
    assert refused(team_only, asking(chat_id="oc_private", private=True)) is None


def test_admin_commands_in_a_group_are_for_admins_and_in_a_private_chat_for_its_user() -> None:
    with_admins = rules(admins=frozenset({ADMIN}))

    assert refused(with_admins, asking(BOB, command="system")) == ADMINS_ONLY.format(command="system")
    assert refused(with_admins, asking(BOB, command="reset")) == ADMINS_ONLY.format(command="reset")
    assert refused(with_admins, asking(BOB, command="stats")) is None
    assert refused(with_admins, asking(ADMIN, command="reset")) is None
    assert refused(with_admins, asking(BOB, private=True, command="reset")) is None


@pytest.mark.parametrize(("action", "command"), [(NEW_SESSION, "reset"), (REGENERATE, None)])
def test_a_click_on_new_session_is_a_reset_and_on_regenerate_a_question(action: str, command: str | None) -> None:
    click = CardClick(
        event_id="ev_1",
        button=BUTTONS[action],
        chat_id=TEAM,
        chat_type="group",
        operator_open_id=BOB,
        question_id="om_question",
        thread_id=None,
        conversation_thread=None,
    )

    assert Asking.of_click(click) == asking(BOB, command=command)


def test_the_quota_refuses_with_the_wait_and_each_user_has_their_own() -> None:
    clock = Clock()
    gate = Gate(rules(allowed_chats=frozenset({TEAM})), TokenBuckets(3, clock))

    for _ in range(5):  # refused by the rules: that takes nothing from the quota
        assert text(gate.refusal(asking(ALICE, chat_id=ELSEWHERE))) == NOT_OPEN
    for _ in range(3):
        assert gate.refusal(asking(ALICE)) is None
    assert text(gate.refusal(asking(ALICE))) == TOO_FAST.format(wait_s=20)  # 3 a minute: one every 20 s
    assert gate.refusal(asking(BOB)) is None
    clock.advance(20)
    assert gate.refusal(asking(ALICE)) is None


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        (
            "feishu:\n  admins: [alice]\n",
            'config.yaml: feishu.admins.0: expected a user\'s open_id (ou_...), got "alice"',
        ),
        (
            "feishu:\n  allowed_chats: [ou_alice]\n",
            'config.yaml: feishu.allowed_chats.0: expected a chat_id (oc_...), got "ou_alice"',
        ),
        ("feishu:\n  dm_policy: closed\n", "config.yaml: feishu.dm_policy: expected one of 'open' or 'allowlist'"),
        (
            "feishu:\n  max_concurrent_per_chat: 0\n",
            "config.yaml: feishu.max_concurrent_per_chat: expected an integer >= 1",
        ),
    ],
)
def test_bad_access_settings_name_the_key(tmp_path: Path, yaml: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml, encoding="utf-8")

    with pytest.raises(ConfigError) as excinfo:
        load_settings(path)
    assert str(excinfo.value).startswith(f"{tmp_path}/{message}")  # the file's whole path
