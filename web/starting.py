"""Serve first, load after: the port answers `/healthz` within a second of launch, while the
model and its libraries load (importing torch, transformers and lark-oapi alone takes ~8 s on
2 cores; loading a checkpoint more). Until the app is built and started, `/readyz` and every other
path answer 503 with Retry-After, so a load balancer or an orchestrator waits instead of
restarting a process that is only slow to start. Once started, the objects loaded so far are
frozen out of the garbage collector (`_freeze_the_heap`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import logging
import threading
from collections.abc import Callable
from contextlib import AsyncExitStack

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

log = logging.getLogger("clawdbot")

RETRY_AFTER_S = 5


class StartupError(Exception):
    """A start-up failure whose message says all there is to say: logged as one line."""


class StartingApp:
    """An ASGI app that builds the real one (`build`, in a worker thread), runs its lifespan,
    then hands every request to it. `on_failure` is called when building or starting fails."""

    def __init__(self, build: Callable[[], Starlette], on_failure: Callable[[], None]) -> None:
        self._build = build
        self._on_failure = on_failure
        self._app: Starlette | None = None
        self._lifespans = AsyncExitStack()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if self._app is not None:
            await self._app(scope, receive, send)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1013})  # 1013: try again later
            return
        if scope["path"] == "/healthz":
            response = JSONResponse({"status": "ok"})
        else:
            detail = "starting: the model is loading" if scope["path"] != "/readyz" else "starting"
            response = JSONResponse(
                {"status": "starting", "detail": detail},
                status_code=503,
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        await response(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        message = await receive()
        assert message["type"] == "lifespan.startup"
        starting = asyncio.create_task(self._start())
        await send({"type": "lifespan.startup.complete"})
        message = await receive()
        assert message["type"] == "lifespan.shutdown"
        if not starting.done():
            log.info("stopping before start-up finished")
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
        await self._lifespans.aclose()
        await send({"type": "lifespan.shutdown.complete"})

    async def _start(self) -> None:
        try:
            app = await self._build_in_thread()
            await self._lifespans.enter_async_context(app.router.lifespan_context(app))
        except StartupError as exc:
            log.error("start-up failed: %s", exc)
            self._on_failure()
            return
        except Exception:
            log.exception("start-up failed")
            self._on_failure()
            return
        _freeze_the_heap()
        self._app = app

    def _build_in_thread(self) -> asyncio.Future[Starlette]:
        # A daemon thread, not the loop's executor: a server stopped while the app is still
        # loading exits at once instead of waiting for the load to finish.
        built: concurrent.futures.Future[Starlette] = concurrent.futures.Future()

        def build() -> None:
            try:
                built.set_result(self._build())
            except Exception as exc:  # noqa: BLE001 - handed to the awaiting task, which logs it
                built.set_exception(exc)

        threading.Thread(target=build, name="build-app", daemon=True).start()
        return asyncio.wrap_future(built)


def _freeze_the_heap() -> None:
    """Moves every object alive now out of the garbage collector's reach. The started app holds
    about 790,000 objects the collector tracks (torch's, transformers' and the other libraries'
    modules, functions and types), and each full collection walked them all: 400-430 ms on 2
    cores, with every thread that runs Python waiting, a turn's first token included (one stalled a
    benchmark run's event loop for 353 ms). They live as long as the process; what becomes
    garbage later is still collected. vLLM and SGLang freeze their heaps after start-up too."""
    gc.collect()
    gc.freeze()
    log.info("started: %d objects frozen out of the garbage collector", gc.get_freeze_count())
