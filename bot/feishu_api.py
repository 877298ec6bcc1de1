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
    ContentCardElementRequest,
    ContentCardElementRequestBody,
    CreateCardRequest,
    CreateCardRequestBody,
    SettingsCardRequest,
    SettingsCardRequestBody,
)
from lark_oapi.api.im.v1 import (
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

    async def message(self, message_id: str) -> Message:
        """A message as the Open API has it now (recalled ones say `deleted`)."""
        request = GetMessageRequest.builder().message_id(message_id).build()
        response = await self._call("message get", lambda: self._client.im.v1.message.aget(request))
        return response.data.items[0]

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

    async def _call(self, what: str, send: Callable[[], Awaitable[Response]]) -> Response:
        attempt = 1
        while True:
            response = await send()
            if response.success():
                return response
            if not _rate_limited(response) or attempt == self._max_attempts:
                raise FeishuApiError(what, response)
            wait_s = self._retry_after(response)
            attempt += 1
            log.warning(
                "feishu %s: rate limited, retrying in %.1f s (attempt %d of %d)",
                what,
                wait_s,
                attempt,
                self._max_attempts,
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


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False)
