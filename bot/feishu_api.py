"""Every Feishu Open Platform call the bot makes, through lark-oapi.

Rate limits (HTTP 429 or code 99991400) are waited out as the response's `x-ogw-ratelimit-reset`
says and the call is retried with the same request, so the same `uuid`: Feishu drops a repeated
send instead of posting it twice. Any other failure raises FeishuApiError.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import lark_oapi as lark
from lark_oapi.api.cardkit.v1 import (
    Card,
    ContentCardElementRequest,
    ContentCardElementRequestBody,
    CreateCardElementRequest,
    CreateCardElementRequestBody,
    CreateCardRequest,
    CreateCardRequestBody,
    SettingsCardRequest,
    SettingsCardRequestBody,
    UpdateCardRequest,
    UpdateCardRequestBody,
)
from lark_oapi.api.contact.v3 import GetUserRequest, User
from lark_oapi.api.docx.v1 import RawContentDocumentRequest
from lark_oapi.api.im.v1 import (
    CreateMessageReactionRequest,
    CreateMessageReactionRequestBody,
    CreateMessageRequest,
    CreateMessageRequestBody,
    DeleteMessageReactionRequest,
    Emoji,
    GetMessageRequest,
    Message,
    PatchMessageRequest,
    PatchMessageRequestBody,
    ReplyMessageRequest,
    ReplyMessageRequestBody,
)

log = logging.getLogger(__name__)

RATE_LIMIT_CODE = 99991400
RATE_LIMIT_RESET_HEADER = "x-ogw-ratelimit-reset"

Response = TypeVar("Response", bound=lark.BaseResponse)


class FeishuApiError(Exception):
    def __init__(self, what: str, response: lark.BaseResponse) -> None:
        status = response.raw.status_code if response.raw is not None else None
        super().__init__(
            f"{what} failed: HTTP {status}, code {response.code}: {response.msg} (log id {response.get_log_id()})"
        )
        self.code = response.code


class FeishuApi:
    def __init__(self, client: lark.Client, *, max_attempts: int = 5, max_wait_s: float = 60.0) -> None:
        self._client = client
        self._max_attempts = max_attempts
        self._max_wait_s = max_wait_s

    @classmethod
    def connect(cls, app_id: str, app_secret: str, domain: str) -> FeishuApi:
        client = (
            lark.Client.builder()
            .app_id(app_id)
            .app_secret(app_secret)
            .domain(domain)
            .log_level(lark.LogLevel.WARNING)
            .build()
        )
        return cls(client)

    async def bot_open_id(self) -> str:
        # The SDK has no typed model for bot/v3/info, and the answer is at the top level, not in `data`.
        request = (
            lark.BaseRequest.builder()
            .http_method(lark.HttpMethod.GET)
            .uri("/open-apis/bot/v3/info")
            .token_types({lark.AccessTokenType.TENANT})
            .build()
        )
        response = await self._call("bot info", lambda: self._client.arequest(request))
        return json.loads(response.raw.content)["bot"]["open_id"]

    async def reply(
        self, message_id: str, msg_type: str, content: dict[str, Any], *, uuid: str, in_thread: bool = False
    ) -> str:
        """Reply to `message_id`; returns the id of the message sent."""
        request = (
            ReplyMessageRequest.builder()
            .message_id(message_id)
            .request_body(
                ReplyMessageRequestBody.builder()
                .msg_type(msg_type)
                .content(_json(content))
                .reply_in_thread(in_thread)
                .uuid(uuid)
                .build()
            )
            .build()
        )
        response = await self._call("reply", lambda: self._client.im.v1.message.areply(request))
        return response.data.message_id

    async def send(self, chat_id: str, msg_type: str, content: dict[str, Any], *, uuid: str) -> str:
        """A new message in a chat, replying to nothing; returns its id."""
        request = (
            CreateMessageRequest.builder()
            .receive_id_type("chat_id")
            .request_body(
                CreateMessageRequestBody.builder()
                .receive_id(chat_id)
                .msg_type(msg_type)
                .content(_json(content))
                .uuid(uuid)
                .build()
            )
            .build()
        )
        response = await self._call("send", lambda: self._client.im.v1.message.acreate(request))
        return response.data.message_id

    async def message(self, message_id: str) -> Message:
        """A message as the Open API has it now (recalled ones say `deleted`)."""
        return (await self.messages(message_id))[0]

    async def messages(self, message_id: str) -> list[Message]:
        """The message, then, for a merged forward, the messages it carries (their `upper_message_id`
        says which forward holds them). A card comes as its JSON: read otherwise, one that streamed
        says only "upgrade your client" (请升级至最新版本客户端)."""
        request = GetMessageRequest.builder().message_id(message_id).card_msg_content_type("raw_card_content").build()
        response = await self._call("message get", lambda: self._client.im.v1.message.aget(request))
        return list(response.data.items)

    async def user(self, open_id: str) -> User:
        """A user as the contact API has them (`name`, `time_zone`, either may be missing); needs
        the contact:user.base:readonly scope."""
        request = GetUserRequest.builder().user_id(open_id).user_id_type("open_id").build()
        response = await self._call("user get", lambda: self._client.contact.v3.user.aget(request))
        user: User = response.data.user
        return user

    async def document_text(self, document_id: str) -> str:
        """A docx document's plain text; needs the docx:document:readonly scope, and the document
        shared with the app."""
        request = RawContentDocumentRequest.builder().document_id(document_id).build()
        response = await self._call("document read", lambda: self._client.docx.v1.document.araw_content(request))
        return response.data.content or ""

    async def patch_card(self, message_id: str, card: dict[str, Any]) -> None:
        request = (
            PatchMessageRequest.builder()
            .message_id(message_id)
            .request_body(PatchMessageRequestBody.builder().content(_json(card)).build())
            .build()
        )
        await self._call("card patch", lambda: self._client.im.v1.message.apatch(request))

    async def create_card(self, card: dict[str, Any]) -> str:
        """Create a CardKit card entity from card JSON 2.0; returns its card_id."""
        request = (
            CreateCardRequest.builder()
            .request_body(CreateCardRequestBody.builder().type("card_json").data(_json(card)).build())
            .build()
        )
        response = await self._call("card create", lambda: self._client.cardkit.v1.card.acreate(request))
        return response.data.card_id

    async def update_card(self, card_id: str, card: dict[str, Any], *, sequence: int, uuid: str) -> None:
        """Replace a CardKit card entity's whole JSON, in whatever mode it is."""
        request = (
            UpdateCardRequest.builder()
            .card_id(card_id)
            .request_body(
                UpdateCardRequestBody.builder()
                .card(Card.builder().type("card_json").data(_json(card)).build())
                .sequence(sequence)
                .uuid(uuid)
                .build()
            )
            .build()
        )
        await self._call("card update", lambda: self._client.cardkit.v1.card.aupdate(request))

    async def set_element_content(
        self, card_id: str, element_id: str, content: str, *, sequence: int, uuid: str
    ) -> None:
        request = (
            ContentCardElementRequest.builder()
            .card_id(card_id)
            .element_id(element_id)
            .request_body(
                ContentCardElementRequestBody.builder().content(content).sequence(sequence).uuid(uuid).build()
            )
            .build()
        )
        await self._call("card content", lambda: self._client.cardkit.v1.card_element.acontent(request))

    async def set_card_settings(self, card_id: str, settings: dict[str, Any], *, sequence: int, uuid: str) -> None:
        request = (
            SettingsCardRequest.builder()
            .card_id(card_id)
            .request_body(
                SettingsCardRequestBody.builder().settings(_json(settings)).sequence(sequence).uuid(uuid).build()
            )
            .build()
        )
        await self._call("card settings", lambda: self._client.cardkit.v1.card.asettings(request))

    async def append_card_elements(
        self, card_id: str, elements: list[dict[str, Any]], *, sequence: int, uuid: str
    ) -> None:
        """Add `elements` (card JSON 2.0) at the end of a CardKit card's body."""
        request = (
            CreateCardElementRequest.builder()
            .card_id(card_id)
            .request_body(
                CreateCardElementRequestBody.builder()
                .type("append")
                .elements(_json(elements))
                .sequence(sequence)
                .uuid(uuid)
                .build()
            )
            .build()
        )
        await self._call("card elements", lambda: self._client.cardkit.v1.card_element.acreate(request))

    async def add_reaction(self, message_id: str, emoji_type: str) -> str:
        """React to `message_id`; returns the reaction's id. Tried once: a reaction is not worth a wait."""
        request = (
            CreateMessageReactionRequest.builder()
            .message_id(message_id)
            .request_body(
                CreateMessageReactionRequestBody.builder()
                .reaction_type(Emoji.builder().emoji_type(emoji_type).build())
                .build()
            )
            .build()
        )
        response = await self._call(
            "reaction add", lambda: self._client.im.v1.message_reaction.acreate(request), max_attempts=1
        )
        return response.data.reaction_id

    async def remove_reaction(self, message_id: str, reaction_id: str) -> None:
        request = DeleteMessageReactionRequest.builder().message_id(message_id).reaction_id(reaction_id).build()
        await self._call(
            "reaction remove", lambda: self._client.im.v1.message_reaction.adelete(request), max_attempts=1
        )

    async def _call(
        self, what: str, send: Callable[[], Awaitable[Response]], *, max_attempts: int | None = None
    ) -> Response:
        max_attempts = max_attempts or self._max_attempts
        attempt = 1
        while True:
            response = await send()
            if response.success():
                return response
            if not _rate_limited(response) or attempt == max_attempts:
                raise FeishuApiError(what, response)
            wait_s = self._retry_after(response)
            attempt += 1
            log.warning(
                "feishu %s: rate limited, retrying in %.1f s (attempt %d of %d)",
                what,
                wait_s,
                attempt,
                max_attempts,
            )
            await asyncio.sleep(wait_s)

    def _retry_after(self, response: lark.BaseResponse) -> float:
        try:
            reset_s = float(response.raw.headers.get(RATE_LIMIT_RESET_HEADER, 1))
        except ValueError:
            reset_s = 1.0
        return min(max(reset_s, 0.1), self._max_wait_s)


def _rate_limited(response: lark.BaseResponse) -> bool:
    return response.code == RATE_LIMIT_CODE or (response.raw is not None and response.raw.status_code == 429)


def _json(value: dict[str, Any] | list[Any]) -> str:
    return json.dumps(value, ensure_ascii=False)
