"""What Feishu sends the bot: `im.message.receive_v1` envelopes, and webhook encryption/signing."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import time
import uuid
from typing import Any

from Crypto.Cipher import AES

BOT_OPEN_ID = "ou_bot_0001"
USER_OPEN_ID = "ou_user_0001"

_nonces = itertools.count(1)


def new_message_id() -> str:
    return f"om_{uuid.uuid4().hex}"


def mention(number: int, open_id: str, name: str) -> dict[str, Any]:
    return {
        "key": f"@_user_{number}",
        "id": {"open_id": open_id, "union_id": f"on_{open_id}", "user_id": ""},
        "name": name,
        "tenant_key": "tenant",
    }


def bot_mention(number: int = 1, open_id: str = BOT_OPEN_ID) -> dict[str, Any]:
    return mention(number, open_id, "Clawdbot")


def message_event(
    *,
    chat_id: str,
    text: str | None = None,
    content: dict[str, Any] | None = None,
    message_type: str = "text",
    chat_type: str = "p2p",
    sender_open_id: str = USER_OPEN_ID,
    sender_type: str = "user",
    mentions: list[dict[str, Any]] | None = None,
    message_id: str | None = None,
    thread_id: str | None = None,
    created_at: float | None = None,
    app_id: str = "cli_test",
    token: str = "",
) -> dict[str, Any]:
    """An `im.message.receive_v1` event (schema 2.0) as Feishu delivers it."""
    if content is None:
        content = {"text": text or ""}
    create_ms = str(int((created_at if created_at is not None else time.time()) * 1000))
    message: dict[str, Any] = {
        "message_id": message_id or new_message_id(),
        "create_time": create_ms,
        "update_time": create_ms,
        "chat_id": chat_id,
        "chat_type": chat_type,
        "message_type": message_type,
        "content": json.dumps(content, ensure_ascii=False),
        "mentions": mentions or [],
        "user_agent": "fake-feishu",
    }
    if thread_id is not None:
        message["thread_id"] = thread_id
    return {
        "schema": "2.0",
        "header": {
            "event_id": uuid.uuid4().hex,
            "event_type": "im.message.receive_v1",
            "create_time": create_ms,
            "token": token,
            "app_id": app_id,
            "tenant_key": "tenant",
        },
        "event": {
            "sender": {
                "sender_id": {"open_id": sender_open_id, "union_id": f"on_{sender_open_id}", "user_id": ""},
                "sender_type": sender_type,
                "tenant_key": "tenant",
            },
            "message": message,
        },
    }


def url_verification(token: str, challenge: str = "challenge-1234") -> dict[str, Any]:
    return {"challenge": challenge, "token": token, "type": "url_verification"}


def encrypt(payload: dict[str, Any], encrypt_key: str) -> bytes:
    """The webhook body Feishu sends when an Encrypt Key is set: AES-256-CBC, key = sha256(encrypt_key)."""
    plain = json.dumps(payload, ensure_ascii=False).encode()
    pad = AES.block_size - len(plain) % AES.block_size
    return seal(plain + bytes([pad]) * pad, encrypt_key)


def seal(blocks: bytes, encrypt_key: str) -> bytes:
    """A webhook body of `blocks` encrypted as they are, padded or not (a forger's)."""
    iv = os.urandom(AES.block_size)
    cipher = AES.new(hashlib.sha256(encrypt_key.encode()).digest(), AES.MODE_CBC, iv)
    return json.dumps({"encrypt": base64.b64encode(iv + cipher.encrypt(blocks)).decode()}).encode()


def signature_headers(body: bytes, encrypt_key: str, *, timestamp: int | str | None = None) -> dict[str, str]:
    """X-Lark-* headers: sha256(timestamp + nonce + encrypt_key + body)."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    nonce = f"nonce-{next(_nonces)}"
    signature = hashlib.sha256((stamp + nonce + encrypt_key).encode() + body).hexdigest()
    return {
        "X-Lark-Request-Timestamp": stamp,
        "X-Lark-Request-Nonce": nonce,
        "X-Lark-Signature": signature,
        "Content-Type": "application/json",
    }


def reply_event(*, parent_id: str, root_id: str | None = None, **fields: Any) -> dict[str, Any]:
    """A message that replies to `parent_id`; in a thread every message replies to its root."""
    event = message_event(**fields)
    event["event"]["message"] |= {"parent_id": parent_id, "root_id": root_id or parent_id}
    return event


def post_event(*, paragraphs: list[list[dict[str, Any]]], title: str = "", **fields: Any) -> dict[str, Any]:
    """A rich-text post: a title and paragraphs of elements (text, a, at, img, media, emotion, ...)."""
    return message_event(message_type="post", content={"title": title, "content": paragraphs}, **fields)


def image_event(**fields: Any) -> dict[str, Any]:
    return message_event(message_type="image", content={"image_key": f"img_v3_{uuid.uuid4().hex[:12]}"}, **fields)


def merge_forward_event(**fields: Any) -> dict[str, Any]:
    """A merged forward: its content is fixed; what it carries is read through the Open API."""
    return message_event(message_type="merge_forward", content={"content": "Merged and Forwarded Message"}, **fields)


def mentioning_bot(text: str) -> dict[str, Any]:
    """The `text` and `mentions` of a message that @mentions the bot, then says `text`."""
    return {"text": f"@_user_1 {text}", "mentions": [bot_mention(1)]}


def card_action_event(
    *,
    value: dict[str, Any],
    chat_id: str,
    card_message_id: str,
    operator_open_id: str = USER_OPEN_ID,
    app_id: str = "cli_test",
    token: str = "",
) -> dict[str, Any]:
    """A `card.action.trigger` callback (schema 2.0): a click on a button whose value is `value`."""
    return {
        "schema": "2.0",
        "header": {
            "event_id": uuid.uuid4().hex,
            "event_type": "card.action.trigger",
            "create_time": str(int(time.time() * 1_000_000)),
            "token": token,
            "app_id": app_id,
            "tenant_key": "tenant",
        },
        "event": {
            "operator": {
                "tenant_key": "tenant",
                "open_id": operator_open_id,
                "union_id": f"on_{operator_open_id}",
                "user_id": "",
            },
            "token": f"c-{uuid.uuid4().hex}",
            "action": {"tag": "button", "value": value},
            "host": "im_message",
            "context": {"open_message_id": card_message_id, "open_chat_id": chat_id},
        },
    }
