"""A fake model server on 127.0.0.1 in vLLM's and SGLang's shapes, for what our own
`/v1/completions` never sends: vLLM's `owned_by`, no `/tokenize`, a "repetition" finish, an error
event mid-stream, chunks without token ids, SGLang's flat error body. Each completion answers
with the next scripted reply; the request bodies are kept."""

from __future__ import annotations

import json
import threading
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tests.fakes.feishu import wait_for

Reply = list[dict[str, Any]] | JSONResponse  # the SSE events' JSON, or a whole response


class FakeModelServer:
    def __init__(self, port: int, *, model: str, max_model_len: int = 4096, owned_by: str = "vllm") -> None:
        self.base_url = f"http://127.0.0.1:{port}"
        self.model = model
        self.max_model_len = max_model_len
        self.owned_by = owned_by
        self.tokenize: list[int] | None = None  # None: no /tokenize (404)
        self.replies: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        self._server = uvicorn.Server(
            uvicorn.Config(self._build_app(), host="127.0.0.1", port=port, log_level="warning")
        )
        self._thread = threading.Thread(target=self._server.run, name="fake-model-server", daemon=True)

    def start(self) -> FakeModelServer:
        self._thread.start()
        wait_for(lambda: self._server.started, what="the fake model server to listen")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            card = {"id": self.model, "object": "model", "owned_by": self.owned_by, "max_model_len": self.max_model_len}
            return {"object": "list", "data": [card]}

        @app.post("/tokenize")
        async def tokenize() -> Response:
            if self.tokenize is None:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            return JSONResponse({"count": len(self.tokenize), "tokens": self.tokenize})

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            self.requests.append(await request.json())
            reply = self.replies.pop(0)
            if isinstance(reply, JSONResponse):
                return reply
            events = [f"data: {json.dumps(event)}\n\n" for event in reply] + ["data: [DONE]\n\n"]
            return StreamingResponse(iter(events), media_type="text/event-stream")

        return app


def chunk(text: str, token_ids: list[int] | None, finish_reason: str | None = None) -> dict[str, Any]:
    """A vLLM completion chunk; `token_ids` None leaves the field out, as a server without
    `return_token_ids` does."""
    choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
        },
    }
