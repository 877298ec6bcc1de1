"""A fake Feishu Open Platform on 127.0.0.1, for running the real lark-oapi SDK against.

It serves, over real HTTP and WebSocket, what the bot uses: the tenant token, bot info, message
create / reply / patch / get, CardKit card create / update / element content / settings, and the long
connection (endpoint discovery plus protobuf frames from `lark_oapi.ws.pb`). It delivers events
the way Feishu does (a data frame on the long connection, or a signed POST to a webhook) and
records everything the bot sends: `calls` in order, `messages` by id, `cards` by card id.

What the bot reads: a message by id (one delivered or `remember`ed, or one the bot sent: a card as
its JSON when asked with card_msg_content_type=raw_card_content, else as Feishu shows a streamed
card, "upgrade your client"), a merged forward with the messages it carries (`forward`), and a
user's name (`users`; anyone else is refused as outside the app's contact range), and a docx
document's plain text (`documents`, by document id; any other is not found).

Switches: `rate_limit(n)` answers the next n OpenAPI calls with HTTP 429 / code 99991400;
`refuse_cardkit` answers CardKit calls with a permission error; `fail(fragment, n)` answers the
next n calls whose path contains `fragment` with a server error; `hold(fragment)` keeps the calls
whose path contains `fragment` waiting until `release(fragment)`; `refuse_connections` answers
the long connection's endpoint discovery with 503, so the SDK keeps retrying until it is cleared.

Threads: a reply goes in the thread of the message it replies to, or with reply_in_thread opens
one on it, as Feishu does; `threads` has the threads replies opened, by their first message.

Reactions and card buttons: `reactions` has every reaction added (and whether it was removed);
CardKit elements can be appended to a card; `push_callback` delivers a `card.action.trigger` on
the long connection and returns the client's answer (`post_event` does it on a webhook).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from lark_oapi.ws.pb.pbbp2_pb2 import Frame

from tests.fakes.events import BOT_OPEN_ID, encrypt, signature_headers

RATE_LIMIT_CODE = 99991400
CARDKIT_DENIED_CODE = 99991672
SEQUENCE_CODE = 300317
SERVER_ERROR_CODE = 1500
NO_USER_AUTHORITY_CODE = 41050
DOCUMENT_NOT_FOUND_CODE = 1770002
# How Feishu shows a card sent by card_id (a streamed one) to a reader that does not ask for its JSON.
UPGRADE_CARD = {"title": "", "elements": [[{"tag": "text", "text": "请升级至最新版本客户端，以查看内容"}]]}
FRAME_CONTROL, FRAME_DATA = 0, 1


@dataclass
class Call:
    method: str
    path: str
    body: dict[str, Any] | None


@dataclass
class SentMessage:
    message_id: str
    chat_id: str
    msg_type: str
    content: dict[str, Any]
    uuid: str | None
    reply_to: str | None = None
    reply_in_thread: bool = False
    patches: list[dict[str, Any]] = field(default_factory=list)
    app_id: str = ""
    thread_id: str | None = None


@dataclass
class CardEntity:
    card_id: str
    card: dict[str, Any]
    sequences: list[int] = field(default_factory=list)

    @property
    def streaming(self) -> bool:
        return bool(self.card.get("config", {}).get("streaming_mode"))

    def element(self, element_id: str) -> dict[str, Any] | None:
        return next((e for e in _elements(self.card) if e.get("element_id") == element_id), None)


@dataclass
class Reaction:
    reaction_id: str
    message_id: str
    emoji_type: str
    removed: bool = False


@dataclass
class _Connection:
    socket: WebSocket
    service_id: int


class _Refusal(Exception):
    def __init__(self, status: int, code: int, msg: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(msg)
        self.status, self.code, self.msg, self.headers = status, code, msg, headers or {}


class FakeFeishu:
    def __init__(self, port: int, *, bot_open_id: str = BOT_OPEN_ID, reconnect_interval_s: int = 1) -> None:
        self.port = port
        self.domain = f"http://127.0.0.1:{port}"
        self.bot_open_id = bot_open_id
        self.reconnect_interval_s = reconnect_interval_s
        self.calls: list[Call] = []
        self.messages: dict[str, SentMessage] = {}
        self.cards: dict[str, CardEntity] = {}
        self.users: dict[str, str] = {}
        self.time_zones: dict[str, str] = {}  # by open_id, for users in `users`
        self.documents: dict[str, str] = {}  # document_id -> its plain text
        self._carried: dict[str, list[dict[str, Any]]] = {}
        self.refuse_cardkit = False
        self.rate_limited = 0
        self.connections_opened = 0
        self.reactions: dict[str, Reaction] = {}
        self.refuse_connections = False
        self._rate_limit_left = 0
        self._rate_limit_reset_s = 1
        self._inbound: dict[str, dict[str, Any]] = {}
        self._failing, self._failures_left = "", 0
        self.threads: dict[str, str] = {}  # first message id -> thread_id
        self._holds: dict[str, asyncio.Event] = {}
        self._tokens: dict[str, str] = {}  # token -> app_id
        self._uuids: dict[str, str] = {}
        self._ids = itertools.count(1)
        self._connections: list[_Connection] = []
        self._acks: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server = uvicorn.Server(
            uvicorn.Config(
                self._build_app(), host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1
            )
        )
        self._thread = threading.Thread(target=self._server.run, name="fake-feishu", daemon=True)

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> FakeFeishu:
        self._thread.start()
        wait_for(lambda: self._server.started, what="the fake Feishu to listen")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    # --- switches --------------------------------------------------------------------------------

    def rate_limit(self, times: int, reset_s: int = 1) -> None:
        """Answer the next `times` OpenAPI calls with HTTP 429, code 99991400, x-ogw-ratelimit-reset."""
        self._rate_limit_left, self._rate_limit_reset_s = times, reset_s

    def fail(self, fragment: str, times: int = 1) -> None:
        """Answer the next `times` OpenAPI calls whose path contains `fragment` with HTTP 500."""
        self._failing, self._failures_left = fragment, times

    def hold(self, fragment: str) -> None:
        """Keep the OpenAPI calls whose path contains `fragment` waiting (recorded) until `release`."""
        self._holds[fragment] = asyncio.Event()

    def release(self, fragment: str) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._holds.pop(fragment).set)

    # --- delivering events -----------------------------------------------------------------------

    def push(self, event: dict[str, Any], timeout_s: float = 10.0) -> int:
        """Deliver `event` on the long connection; returns the status code of the client's ack."""
        self.remember(event)
        assert self._loop is not None, "fake Feishu is not running"
        ack = asyncio.run_coroutine_threadsafe(self._push(event, timeout_s), self._loop).result(timeout_s + 1)
        code: int = ack["code"]
        return code

    def post_event(
        self,
        url: str,
        event: dict[str, Any],
        *,
        encrypt_key: str,
        timestamp: int | None = None,
        signature: str | None = None,
    ) -> httpx.Response:
        """Deliver `event` to a webhook the way Feishu does: encrypted and signed."""
        self.remember(event)
        body = encrypt(event, encrypt_key)
        headers = signature_headers(body, encrypt_key, timestamp=timestamp)
        if signature is not None:
            headers["X-Lark-Signature"] = signature
        return httpx.post(url, content=body, headers=headers, timeout=10)

    def drop_connections(self) -> None:
        """Close every long connection from the server side, as a network loss would."""
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._close_connections(), self._loop).result(5)

    # --- inspecting what the bot sent ------------------------------------------------------------

    @property
    def connected(self) -> int:
        return len(self._connections)

    def replies_to(self, message_id: str) -> list[SentMessage]:
        return [m for m in list(self.messages.values()) if m.reply_to == message_id]

    def text_of(self, message: SentMessage) -> str:
        """What the user sees in `message` now: its text, or the text of its (patched or CardKit) card."""
        if message.msg_type == "text":
            return message.content["text"]
        card = self.shown_card(message)
        return "".join(e.get("content", "") for e in _elements(card) if e.get("tag") in ("markdown", "plain_text"))

    def card_of(self, message: SentMessage) -> CardEntity:
        return self.cards[message.content["data"]["card_id"]]

    def remember(self, event: dict[str, Any]) -> None:
        """Know the message `event` carries, as Feishu knows every message sent to the bot."""
        if event.get("event", {}).get("message"):
            self._inbound[event["event"]["message"]["message_id"]] = event["event"]

    def calls_to(self, fragment: str) -> list[Call]:
        return [c for c in list(self.calls) if fragment in c.path]

    # --- messages as the Open API reads them -----------------------------------------------------

    def forward(self, event: dict[str, Any], carried: list[dict[str, Any]]) -> None:
        """Know `event`, a merged forward, and the messages it carries (events of their own chats)."""
        self.remember(event)
        forward_id = event["event"]["message"]["message_id"]
        self._carried[forward_id] = [_api_message(e["event"]) | {"upper_message_id": forward_id} for e in carried]

    def shown_card(self, message: SentMessage) -> dict[str, Any]:
        """The card JSON `message` shows now: as sent, as last patched, or its CardKit card's."""
        card = message.patches[-1] if message.patches else message.content
        return self.cards[card["data"]["card_id"]].card if card.get("type") == "card" else card

    def _items(self, message_id: str, *, raw_cards: bool) -> list[dict[str, Any]]:
        if message_id in self._inbound:
            return [_api_message(self._inbound[message_id]), *self._carried.get(message_id, [])]
        return [self._api_sent(self._message(message_id), raw_cards=raw_cards)]

    def _api_sent(self, message: SentMessage, *, raw_cards: bool) -> dict[str, Any]:
        """A message the bot sent, as GET /im/v1/messages/{id} has it: its sender is the app."""
        content = message.content
        if message.msg_type == "interactive":
            content = {"json_card": json.dumps(self.shown_card(message))} if raw_cards else UPGRADE_CARD
        now_ms = str(int(time.time() * 1000))
        return {
            "message_id": message.message_id,
            "root_id": message.reply_to or "",
            "parent_id": message.reply_to or "",
            "thread_id": message.thread_id or "",
            "msg_type": message.msg_type,
            "create_time": now_ms,
            "update_time": now_ms,
            "deleted": False,
            "updated": bool(message.patches),
            "chat_id": message.chat_id,
            "sender": {"id": message.app_id, "id_type": "app_id", "sender_type": "app", "tenant_key": "tenant"},
            "body": {"content": json.dumps(content, ensure_ascii=False)},
            "mentions": [],
        }

    def _app_id(self, request: Request) -> str:
        return self._tokens.get(request.headers.get("authorization", "").removeprefix("Bearer "), "")

    # --- the server ------------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            self._loop = asyncio.get_running_loop()
            yield

        app = FastAPI(lifespan=lifespan)

        @app.exception_handler(_Refusal)
        async def _refused(_: Request, refusal: _Refusal) -> JSONResponse:
            return JSONResponse({"code": refusal.code, "msg": refusal.msg}, refusal.status, headers=refusal.headers)

        @app.post("/open-apis/auth/v3/tenant_access_token/internal")
        async def tenant_token(request: Request) -> dict[str, Any]:
            body = await request.json()
            token = f"t-{body['app_id']}-{next(self._ids)}"
            self._tokens[token] = body["app_id"]
            return {"code": 0, "msg": "ok", "tenant_access_token": token, "expire": 7200}

        @app.get("/open-apis/bot/v3/info")
        async def bot_info(request: Request) -> dict[str, Any]:
            await self._admit(request)
            return {
                "code": 0,
                "msg": "ok",
                "bot": {
                    "activate_status": 2,
                    "app_name": "Clawdbot",
                    "avatar_url": "",
                    "ip_white_list": [],
                    "open_id": self.bot_open_id,
                },
            }

        @app.post("/open-apis/im/v1/messages")
        async def create_message(request: Request) -> dict[str, Any]:
            body = await self._admit(request)
            return self._send(body, chat_id=body["receive_id"], app_id=self._app_id(request))

        @app.post("/open-apis/im/v1/messages/{message_id}/reply")
        async def reply_message(message_id: str, request: Request) -> dict[str, Any]:
            body = await self._admit(request)
            inbound = self._inbound.get(message_id)
            chat_id = inbound["message"]["chat_id"] if inbound else ""
            return self._send(body, chat_id=chat_id, app_id=self._app_id(request), reply_to=message_id)

        @app.get("/open-apis/im/v1/messages/{message_id}")
        async def get_message(message_id: str, request: Request) -> dict[str, Any]:
            await self._admit(request)
            raw_cards = request.query_params.get("card_msg_content_type") == "raw_card_content"
            return {"code": 0, "msg": "success", "data": {"items": self._items(message_id, raw_cards=raw_cards)}}

        @app.get("/open-apis/contact/v3/users/{user_id}")
        async def get_user(user_id: str, request: Request) -> dict[str, Any]:
            await self._admit(request)
            if request.query_params.get("user_id_type") != "open_id" or user_id not in self.users:
                raise _Refusal(400, NO_USER_AUTHORITY_CODE, "no user authority error")
            user = {"open_id": user_id, "name": self.users[user_id], "time_zone": self.time_zones.get(user_id)}
            return {"code": 0, "msg": "success", "data": {"user": user}}

        @app.get("/open-apis/docx/v1/documents/{document_id}/raw_content")
        async def document_text(document_id: str, request: Request) -> dict[str, Any]:
            await self._admit(request)
            if document_id not in self.documents:
                raise _Refusal(400, DOCUMENT_NOT_FOUND_CODE, "not found")
            return {"code": 0, "msg": "success", "data": {"content": self.documents[document_id]}}

        @app.patch("/open-apis/im/v1/messages/{message_id}")
        async def patch_message(message_id: str, request: Request) -> dict[str, Any]:
            body = await self._admit(request)
            message = self._message(message_id)
            if message.msg_type != "interactive" or message.content.get("type") == "card":
                raise _Refusal(400, 230001, "only a message with a card JSON can be patched")
            message.patches.append(json.loads(body["content"]))
            return {"code": 0, "msg": "success", "data": {}}

        @app.post("/open-apis/cardkit/v1/cards")
        async def create_card(request: Request) -> dict[str, Any]:
            body = await self._admit(request, cardkit=True)
            card_id = str(7_000_000_000 + next(self._ids))
            self.cards[card_id] = CardEntity(card_id, json.loads(body["data"]))
            return {"code": 0, "msg": "success", "data": {"card_id": card_id}}

        @app.put("/open-apis/cardkit/v1/cards/{card_id}")
        async def update_card(card_id: str, request: Request) -> dict[str, Any]:
            body = await self._admit(request, cardkit=True)
            card = self._sequenced(card_id, body)
            if body["card"].get("type") != "card_json":
                raise _Refusal(400, 300302, "this fake only takes card JSON")
            card.card = json.loads(body["card"]["data"])
            return {"code": 0, "msg": "success", "data": {}}

        @app.put("/open-apis/cardkit/v1/cards/{card_id}/elements/{element_id}/content")
        async def element_content(card_id: str, element_id: str, request: Request) -> dict[str, Any]:
            body = await self._admit(request, cardkit=True)
            card = self._sequenced(card_id, body)
            element = card.element(element_id)
            if element is None:
                raise _Refusal(400, 300301, f"element {element_id} not found")
            if not card.streaming:
                raise _Refusal(400, 200850, "card is not in streaming mode")
            element["content"] = body["content"]
            return {"code": 0, "msg": "success", "data": {}}

        @app.patch("/open-apis/cardkit/v1/cards/{card_id}/settings")
        async def card_settings(card_id: str, request: Request) -> dict[str, Any]:
            body = await self._admit(request, cardkit=True)
            card = self._sequenced(card_id, body)
            settings = json.loads(body["settings"])
            card.card.setdefault("config", {}).update(settings.get("config", {}))
            return {"code": 0, "msg": "success", "data": {}}

        @app.post("/callback/ws/endpoint")
        async def ws_endpoint(request: Request) -> dict[str, Any]:
            if self.refuse_connections:
                raise _Refusal(503, 1, "system busy")
            body = await request.json()
            if not body.get("AppID") or not body.get("AppSecret"):
                return {"code": 1000040344, "msg": "app_id and app_secret are required"}
            device = next(self._ids)
            return {
                "code": 0,
                "msg": "ok",
                "data": {
                    "URL": f"ws://127.0.0.1:{self.port}/ws?device_id={device}&service_id={device}",
                    "ClientConfig": {
                        "ReconnectCount": -1,
                        "ReconnectInterval": self.reconnect_interval_s,
                        "ReconnectNonce": 0,
                        "PingInterval": 120,
                    },
                },
            }

        @app.websocket("/ws")
        async def long_connection(socket: WebSocket) -> None:
            await socket.accept()
            connection = _Connection(socket, int(socket.query_params["service_id"]))
            self._connections.append(connection)
            self.connections_opened += 1
            try:
                while True:
                    await self._on_frame(connection, await socket.receive_bytes())
            except WebSocketDisconnect:
                pass
            finally:
                self._connections.remove(connection)

        self._add_reaction_and_card_routes(app)
        return app

    async def _admit(self, request: Request, *, cardkit: bool = False) -> dict[str, Any]:
        """Authenticate, apply the switches, record the call; returns the JSON body."""
        body = await request.json() if await request.body() else None
        self.calls.append(Call(request.method, request.url.path, body))
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        if token not in self._tokens:
            raise _Refusal(400, 99991663, "Invalid access token for authorization")
        for fragment, released in list(self._holds.items()):
            if fragment in request.url.path:
                await released.wait()
        if self._rate_limit_left > 0:
            self._rate_limit_left -= 1
            self.rate_limited += 1
            raise _Refusal(
                429,
                RATE_LIMIT_CODE,
                "request trigger frequency limit",
                {"x-ogw-ratelimit-limit": "50", "x-ogw-ratelimit-reset": str(self._rate_limit_reset_s)},
            )
        if self._failures_left > 0 and self._failing in request.url.path:
            self._failures_left -= 1
            raise _Refusal(500, SERVER_ERROR_CODE, "internal error")
        if cardkit and self.refuse_cardkit:
            raise _Refusal(400, CARDKIT_DENIED_CODE, "app has no permission cardkit:card:write")
        return body or {}

    def _send(self, body: dict[str, Any], *, chat_id: str, app_id: str, reply_to: str | None = None) -> dict[str, Any]:
        # Feishu answers a repeated uuid (within an hour) with the message it already sent.
        known = self._uuids.get(body.get("uuid") or "")
        if known is None:
            content = json.loads(body["content"])
            is_card = body["msg_type"] == "interactive" and content.get("type") == "card"
            if is_card and content["data"]["card_id"] not in self.cards:
                raise _Refusal(400, 230099, "card_id not found")
            message = SentMessage(
                message_id=f"om_sent_{next(self._ids)}",
                chat_id=chat_id,
                msg_type=body["msg_type"],
                content=content,
                uuid=body.get("uuid"),
                reply_to=reply_to,
                reply_in_thread=bool(body.get("reply_in_thread")),
                app_id=app_id,
                thread_id=self._thread_of(reply_to, in_thread=bool(body.get("reply_in_thread"))),
            )
            self.messages[message.message_id] = message
            if message.uuid:
                self._uuids[message.uuid] = message.message_id
            known = message.message_id
        message = self.messages[known]
        return {
            "code": 0,
            "msg": "success",
            "data": {
                "message_id": message.message_id,
                "chat_id": message.chat_id,
                "msg_type": message.msg_type,
                "create_time": str(int(time.time() * 1000)),
            },
        }

    def _thread_of(self, reply_to: str | None, *, in_thread: bool) -> str | None:
        """The thread a reply goes in: that of the message it replies to, else, with reply_in_thread,
        one opened on that message, which it then belongs to."""
        replied = self._inbound.get(reply_to or "", {}).get("message")
        if replied is None or not (in_thread or replied.get("thread_id")):
            return None
        thread_id = replied.get("thread_id") or self.threads.setdefault(replied["message_id"], f"omt_{next(self._ids)}")
        replied["thread_id"] = thread_id
        return thread_id

    def _message(self, message_id: str) -> SentMessage:
        if message_id not in self.messages:
            raise _Refusal(400, 230011, "message not found")
        return self.messages[message_id]

    def _sequenced(self, card_id: str, body: dict[str, Any]) -> CardEntity:
        card = self.cards.get(card_id)
        if card is None:
            raise _Refusal(400, 300300, "card not found")
        if card.sequences and body["sequence"] <= card.sequences[-1]:
            raise _Refusal(400, SEQUENCE_CODE, "sequence number compare failed")
        card.sequences.append(body["sequence"])
        return card

    # --- long connection frames ------------------------------------------------------------------

    async def _push(self, event: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if not self._connections:
            raise ConnectionError("no long connection is open")
        connection = self._connections[-1]
        frame_id = f"frame-{next(self._ids)}"
        frame = Frame(
            SeqID=next(self._ids),
            LogID=0,
            service=connection.service_id,
            method=FRAME_DATA,
            payload=json.dumps(event).encode(),
        )
        for key, value in (
            ("type", "event"),
            ("message_id", frame_id),
            ("trace_id", frame_id),
            ("sum", "1"),
            ("seq", "0"),
        ):
            frame.headers.add(key=key, value=value)
        ack: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._acks[frame_id] = ack
        try:
            await connection.socket.send_bytes(frame.SerializeToString())
            return await asyncio.wait_for(ack, timeout_s)
        finally:
            del self._acks[frame_id]

    async def _on_frame(self, connection: _Connection, data: bytes) -> None:
        frame = Frame()
        frame.ParseFromString(data)
        headers = {h.key: h.value for h in frame.headers}
        if frame.method == FRAME_CONTROL and headers.get("type") == "ping":
            pong = Frame(SeqID=0, LogID=0, service=connection.service_id, method=FRAME_CONTROL)
            pong.headers.add(key="type", value="pong")
            await connection.socket.send_bytes(pong.SerializeToString())
        elif frame.method == FRAME_DATA and (ack := self._acks.get(headers.get("message_id", ""))):
            ack.set_result(json.loads(frame.payload))

    async def _close_connections(self) -> None:
        for connection in list(self._connections):
            await connection.socket.close()

    # --- reactions and card callbacks ------------------------------------------------------------

    def push_callback(self, event: dict[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
        """Deliver a callback (`card.action.trigger`) on the long connection; returns what the
        client answered it with (a toast), as Feishu reads it from the ack."""
        assert self._loop is not None, "fake Feishu is not running"
        ack = asyncio.run_coroutine_threadsafe(self._push(event, timeout_s), self._loop).result(timeout_s + 1)
        assert ack["code"] == 200, ack
        answer: dict[str, Any] = json.loads(base64.b64decode(ack["data"])) if ack.get("data") else {}
        return answer

    def reactions_on(self, message_id: str) -> list[Reaction]:
        return [r for r in list(self.reactions.values()) if r.message_id == message_id]

    def buttons_of(self, message: SentMessage) -> list[dict[str, Any]]:
        """The buttons on the card `message` shows now, wherever they sit in its layout."""
        return [e for e in _all_elements(_elements(self.shown_card(message))) if e.get("tag") == "button"]

    def _add_reaction_and_card_routes(self, app: FastAPI) -> None:
        @app.post("/open-apis/im/v1/messages/{message_id}/reactions")
        async def add_reaction(message_id: str, request: Request) -> dict[str, Any]:
            body = await self._admit(request)
            if message_id not in self._inbound and message_id not in self.messages:
                raise _Refusal(400, 231003, "the message is not found")
            reaction = Reaction(f"react_{next(self._ids)}", message_id, body["reaction_type"]["emoji_type"])
            self.reactions[reaction.reaction_id] = reaction
            return {"code": 0, "msg": "success", "data": self._reaction_data(reaction, request)}

        @app.delete("/open-apis/im/v1/messages/{message_id}/reactions/{reaction_id}")
        async def remove_reaction(message_id: str, reaction_id: str, request: Request) -> dict[str, Any]:
            await self._admit(request)
            reaction = self.reactions.get(reaction_id)
            if reaction is None or reaction.removed:
                raise _Refusal(400, 231011, "the request has an invalid reaction_id")
            if reaction.message_id != message_id:
                raise _Refusal(400, 231010, "the reaction does not belong to the message")
            reaction.removed = True
            return {"code": 0, "msg": "success", "data": self._reaction_data(reaction, request)}

        @app.post("/open-apis/cardkit/v1/cards/{card_id}/elements")
        async def add_card_elements(card_id: str, request: Request) -> dict[str, Any]:
            body = await self._admit(request, cardkit=True)
            if body.get("type") != "append":
                raise _Refusal(400, 300302, "this fake only appends elements")
            card = self._sequenced(card_id, body)
            card.card.setdefault("body", {}).setdefault("elements", []).extend(json.loads(body["elements"]))
            return {"code": 0, "msg": "success", "data": {}}

    def _reaction_data(self, reaction: Reaction, request: Request) -> dict[str, Any]:
        return {
            "reaction_id": reaction.reaction_id,
            "operator": {"operator_id": self._app_id(request), "operator_type": "app"},
            "action_time": str(int(time.time() * 1000)),
            "reaction_type": {"emoji_type": reaction.emoji_type},
        }


def _api_message(event: dict[str, Any]) -> dict[str, Any]:
    """A received message as GET /im/v1/messages/{id} has it: other field names, bare ids, no chat type."""
    message, sender = event["message"], event["sender"]
    return {
        "message_id": message["message_id"],
        "root_id": message.get("root_id", ""),
        "parent_id": message.get("parent_id", ""),
        "thread_id": message.get("thread_id", ""),
        "msg_type": message["message_type"],
        "create_time": message["create_time"],
        "update_time": message["update_time"],
        "deleted": False,
        "updated": False,
        "chat_id": message["chat_id"],
        "sender": {
            "id": sender["sender_id"]["open_id"],
            "id_type": "open_id",
            "sender_type": sender["sender_type"],
            "tenant_key": sender["tenant_key"],
        },
        "body": {"content": message["content"]},
        "mentions": [
            {"key": m["key"], "id": m["id"]["open_id"], "id_type": "open_id", "name": m["name"], "tenant_key": "tenant"}
            for m in message["mentions"]
        ],
    }


def _elements(card: dict[str, Any]) -> list[dict[str, Any]]:
    return card.get("body", {}).get("elements", []) or card.get("elements", [])


def _all_elements(elements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`elements` and every element inside them (a column set's columns, a column's elements)."""
    nested = [e for element in elements for e in element.get("columns", []) + element.get("elements", [])]
    return elements + (_all_elements(nested) if nested else [])


def wait_for(predicate: Callable[[], Any], timeout_s: float = 15.0, what: str = "a condition") -> Any:
    """Poll `predicate` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(0.02)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
