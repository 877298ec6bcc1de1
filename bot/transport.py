"""How events reach the bot: Feishu's long connection, or its webhook (POST /feishu/events).

Either way lark-oapi decodes the event and calls the dispatcher's handler, which must return at
once: Feishu redelivers anything not acknowledged within 3 s.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import threading
import time

import lark_oapi as lark
import lark_oapi.ws.client as lark_ws_client
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

log = logging.getLogger(__name__)

WEBHOOK_PATH = "/feishu/events"
SIGNATURE_MAX_AGE_S = 300
TIMESTAMP_HEADER = "X-Lark-Request-Timestamp"
NONCE_HEADER = "X-Lark-Request-Nonce"
SIGNATURE_HEADER = "X-Lark-Signature"


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
        client = lark.ws.Client(
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


def webhook_router(dispatcher: lark.EventDispatcherHandler, *, encrypt_key: str) -> APIRouter:
    router = APIRouter(tags=["feishu"])

    @router.post(WEBHOOK_PATH)
    async def feishu_events(request: Request) -> Response:
        body = await request.body()
        # Starlette lowercases header names; the SDK looks them up as Feishu spells them.
        headers = {_canonical(name): value for name, value in request.headers.items()}
        refusal = _signature_refusal(headers, body, encrypt_key) if encrypt_key else None
        if refusal is not None:
            log.warning(
                "feishu webhook: refused a request from %s: %s", request.client.host if request.client else "?", refusal
            )
            return JSONResponse({"msg": refusal}, status_code=401)
        raw = lark.RawRequest()
        raw.uri = request.url.path
        raw.headers = headers
        raw.body = body
        answer = dispatcher.do(raw)
        if answer.status_code != 200:
            log.warning("feishu webhook: rejected: %s", answer.content.decode(errors="replace"))
            # The handler never raises, so an SDK failure is the request's fault, not the server's.
            answer.status_code = 400
        return Response(answer.content, status_code=answer.status_code, headers=answer.headers)

    return router


def _signature_refusal(headers: dict[str, str], body: bytes, encrypt_key: str) -> str | None:
    """Why a signed request is refused, or None. Unsigned ones (the URL verification challenge is
    the only kind) go on to the SDK, which refuses any other event that lacks a signature."""
    signature = headers.get(SIGNATURE_HEADER)
    if signature is None:
        return None
    timestamp = headers.get(TIMESTAMP_HEADER, "")
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > SIGNATURE_MAX_AGE_S:
        return f"timestamp {timestamp!r} is not within {SIGNATURE_MAX_AGE_S} s of now"
    signed = (timestamp + headers.get(NONCE_HEADER, "") + encrypt_key).encode() + body
    if not hmac.compare_digest(hashlib.sha256(signed).hexdigest(), signature):
        return "signature does not match"
    return None


def _canonical(name: str) -> str:
    return "-".join(part.capitalize() for part in name.split("-"))
