"""How events reach the bot: Feishu's long connection, or its webhook (POST /feishu/events).

The webhook authenticates and decrypts a request itself, then hands the event to lark-oapi as
the long connection does. Either way lark-oapi decodes the event and calls the dispatcher's
handler, which must return at once: Feishu redelivers anything not acknowledged within 3 s. A
callback (`card.action.trigger`) is answered with what its handler returns, a toast.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import re
import threading
import time
from typing import Any

import lark_oapi as lark
import lark_oapi.ws.client as lark_ws_client
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from lark_oapi.core.utils import AESCipher
from starlette.datastructures import Headers

from bot.status import TransportState

log = logging.getLogger(__name__)

WEBHOOK_PATH = "/feishu/events"
SIGNATURE_MAX_AGE_S = 300
# Seconds since the epoch, in ASCII digits: `isdigit()` admits "²", and 5,000 digits pass int()'s limit.
TIMESTAMP = re.compile(r"[0-9]{1,12}")
TIMESTAMP_HEADER = "X-Lark-Request-Timestamp"
NONCE_HEADER = "X-Lark-Request-Nonce"
SIGNATURE_HEADER = "X-Lark-Signature"
URL_VERIFICATION = "url_verification"
# Every refusal answers the same, whatever failed.
REFUSED = {"msg": "unauthorized"}
NOT_HANDLED = {"msg": "event not handled"}


class LongConnection:
    """lark.ws.Client on a thread of its own: its `start()` blocks, on the loop the SDK module holds.

    The SDK reconnects by itself after a lost connection (at the pace the server sets); `stop()`
    cancels everything on that loop and closes the socket.
    """

    def __init__(self, app_id: str, app_secret: str, domain: str, dispatcher: lark.EventDispatcherHandler) -> None:
        self._app_id = app_id
        self._app_secret = app_secret
        self._domain = domain
        self._dispatcher = dispatcher
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="feishu-long-connection", daemon=True)
        self._client: lark.ws.Client | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        if not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(_cancel_all_tasks)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("feishu long connection did not stop within %.0f s", timeout_s)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        # The SDK module captured whatever loop was current at import and runs everything on it.
        lark_ws_client.loop = self._loop
        client = self._client = lark.ws.Client(
            self._app_id,
            self._app_secret,
            event_handler=self._dispatcher,
            domain=self._domain,
            log_level=lark.LogLevel.INFO,
        )
        try:
            client.start()
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("feishu long connection gave up")
        finally:
            self._loop.run_until_complete(_close(client))
            self._loop.close()
        log.info("feishu long connection closed")

    @property
    def state(self) -> TransportState:
        """Read from any thread: the SDK holds its websocket in `_conn` while it is open and sets it to
        None as soon as it drops, before retrying (it has no public way to ask, and no callback for
        the first connection)."""
        if self._client is None:
            return TransportState.CONNECTING
        if not self._thread.is_alive():
            return TransportState.STOPPED
        return TransportState.CONNECTED if self._client._conn is not None else TransportState.RECONNECTING


def _cancel_all_tasks() -> None:
    for task in asyncio.all_tasks():
        task.cancel()


async def _close(client: lark.ws.Client) -> None:
    pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=1)
    # The SDK has no public way to stop; this is the method its own receive loop closes with.
    await client._disconnect()


def webhook_router(dispatcher: lark.EventDispatcherHandler, *, encrypt_key: str, verification_token: str) -> APIRouter:
    router = APIRouter(tags=["feishu"])

    @router.post(WEBHOOK_PATH)
    async def feishu_events(request: Request) -> Response:
        try:
            payload, plaintext = _authentic(request.headers, await request.body(), encrypt_key, verification_token)
        except Refused as refusal:
            log.warning(
                "feishu webhook: refused a request from %s: %s", request.client.host if request.client else "?", refusal
            )
            return JSONResponse(REFUSED, status_code=401)
        if payload.get("type") == URL_VERIFICATION:
            return JSONResponse({"challenge": payload["challenge"]})
        try:
            # Authenticated already: this is how the SDK's own long connection dispatches. Its
            # do() would decrypt again and log a traceback for any event it cannot handle.
            answer = dispatcher._do_without_validation(plaintext)
        except Exception as exc:  # noqa: BLE001 - whatever the SDK raises, the event is not handled
            log.warning("feishu webhook: event not handled: %s: %s", type(exc).__name__, exc)
            return JSONResponse(NOT_HANDLED, status_code=400)
        if answer is not None:  # a callback's (a card click's): Feishu shows it to the user
            return Response(lark.JSON.marshal(answer), media_type="application/json")
        return JSONResponse({"msg": "success"})

    return router


class Refused(Exception):
    """Why a webhook request is refused: logged, never told to the caller."""


def _authentic(
    headers: Headers, body: bytes, encrypt_key: str, verification_token: str
) -> tuple[dict[str, Any], bytes]:
    """The request's payload and its plaintext, or Refused.

    With an encrypt key, a signed request's timestamp and signature are checked before anything
    is decrypted; an unsigned one may only be the URL verification challenge (Feishu does not sign
    it). A forger sees one answer for every failure: a padding error that answered differently
    from a JSON error once recovered a 16-byte block of an event in 2,067 requests."""
    signed = SIGNATURE_HEADER in headers
    if encrypt_key and signed:
        _check_signature(headers, body, encrypt_key)
    plaintext = _decrypt(body, encrypt_key) if encrypt_key else body
    payload = _json_object(plaintext)
    if encrypt_key and not signed and payload.get("type") != URL_VERIFICATION:
        raise Refused("an unsigned request that is not a URL verification challenge")
    if verification_token and not hmac.compare_digest(_token(payload).encode(), verification_token.encode()):
        raise Refused("the verification token does not match")
    if payload.get("type") == URL_VERIFICATION and not isinstance(payload.get("challenge"), str):
        raise Refused("a URL verification without a challenge")
    return payload, plaintext


def _check_signature(headers: Headers, body: bytes, encrypt_key: str) -> None:
    timestamp = headers.get(TIMESTAMP_HEADER, "")
    if not TIMESTAMP.fullmatch(timestamp) or abs(time.time() - int(timestamp)) > SIGNATURE_MAX_AGE_S:
        raise Refused(f"timestamp {timestamp[:20]!r} is not within {SIGNATURE_MAX_AGE_S} s of now")
    signed = (timestamp + headers.get(NONCE_HEADER, "") + encrypt_key).encode() + body
    if not hmac.compare_digest(hashlib.sha256(signed).hexdigest().encode(), headers[SIGNATURE_HEADER].encode()):
        raise Refused("the signature does not match")


def _decrypt(body: bytes, encrypt_key: str) -> bytes:
    """AES-256-CBC, key sha256(encrypt_key), the IV first; every failure is the same refusal."""
    try:
        sealed = _json_object(body)["encrypt"]
        return AESCipher(encrypt_key).decrypt(base64.b64decode(sealed, validate=True))
    except (Refused, KeyError, TypeError, ValueError):
        raise Refused("the body could not be decrypted") from None


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        raise Refused("the body is not JSON") from None
    if not isinstance(value, dict):
        raise Refused("the body is not a JSON object")
    return value


def _token(payload: dict[str, Any]) -> str:
    """Schema 2.0 events carry the verification token in their header; the challenge at the top."""
    header = payload.get("header")
    token = header.get("token") if isinstance(header, dict) else payload.get("token")
    return token if isinstance(token, str) else ""
