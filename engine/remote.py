"""The engine on a model server: the same token ids the local engine would take, sent to an
OpenAI-compatible `/v1/completions` (vLLM, SGLang, or another Clawdbot's `engine.backend: local`).

Token ids, not chat messages: a chat-completions server renders the conversation again with its
template every turn, and Qwen3's template drops earlier `<think>` blocks, so the prompt's prefix
would change and miss the server's prefix cache. Sent as ids, turn N+1's prompt starts with turn
N's whole prompt and reply, exactly as with the local engine. The reply comes back as ids too
(`return_token_ids`), so history stores what the model produced, not a re-tokenization of it.
"""

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Self

import httpx

from .chat_format import ChatFormat
from .checkpoints import load_named_tokenizer
from .config import RemoteConfig
from .kv_pool import KVPoolFigures
from .metrics import EngineFigures, EngineMetrics, RequestFigures
from .outputs import FinishReason, StreamDelta
from .request import InputProcessor, checked_params
from .sampling_params import SamplingParams
from .token_ids import PromptIds, TokenArray

logger = logging.getLogger(__name__)

# English, Chinese, accents, an emoji and code: tokenizers that differ at all differ here.
VOCABULARY_PROBE = "Clawdbot checks the vocabulary: 你好，世界！Ünïcödé café 🙂 def f(x): return x ** 2\n"
# A server that cannot be reached is tried again by the next turn after 0.5 s, then 1, 2, ... 30 s:
# a turn in the meantime fails at once instead of waiting out a connect timeout.
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0


class EngineUnavailable(RuntimeError):
    """The model server cannot take the request now: unreachable, busy, or failing."""


class RemoteEngineError(RuntimeError):
    """The model server cannot serve this app at all (start-up checks): the message says why."""


class RemoteEngine:
    """The `Engine` interface over HTTP, on the event loop: one pooled connection per request in
    flight, at most `max_num_seqs` of them (the others wait here, counted as waiting).

    The figures are what this replica sees: a "step" is a streamed chunk, its batch the requests
    this replica has in flight; prefix-cache hits are the server's `cached_tokens`. The KV pool is
    the server's own, so its blocks show as 0.
    """

    def __init__(self, config: RemoteConfig) -> None:
        self.config = config
        self.url = config.url.rstrip("/")
        self.tokenizer = load_named_tokenizer(config.tokenizer, Path(config.data_dir))
        self._headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        with httpx.Client(base_url=self.url, headers=self._headers, timeout=config.connect_timeout_s) as client:
            card = self._served_model(client)
            self.model_name: str = card["id"]
            self.max_model_len = self._max_model_len(card)
            self._check_vocabulary(client)
        # Our own server takes the dynamic top-k settings; vLLM would log every request's as unknown.
        self._takes_dynamic_top_k = card.get("owned_by") == "clawdbot"
        self.is_demo_model = False
        self.num_parameters: int | None = None
        self.max_num_seqs = config.max_num_seqs
        self.inputs = InputProcessor(self.tokenizer, len(self.tokenizer), self.max_model_len)
        self._client = httpx.AsyncClient(
            base_url=self.url,
            headers=self._headers,
            timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            limits=httpx.Limits(max_connections=config.max_num_seqs),
        )
        self._slots = asyncio.Semaphore(config.max_num_seqs)
        self._num_waiting = 0
        self._num_running = 0
        self._metrics = EngineMetrics()
        self._prefix_queried_tokens = 0
        self._prefix_hit_tokens = 0
        self._failures = 0
        self._retry_at = 0.0
        self._started = self._stopped = False
        logger.info("serving %s from %s (max_model_len %d)", self.model_name, self.url, self.max_model_len)

    def chat_format(self, *, enable_thinking: bool = False) -> ChatFormat:
        return ChatFormat.for_tokenizer(self.tokenizer, enable_thinking=enable_thinking)

    def start(self) -> Self:
        self._started = True
        return self

    async def close(self, timeout_s: float) -> bool:
        """Requests in flight end with "abort" as their connections close."""
        self._stopped = True
        await self._client.aclose()
        return True

    def is_running(self) -> bool:
        return self._started and not self._stopped and time.monotonic() >= self._retry_at

    @property
    def num_waiting_requests(self) -> int:
        return self._num_waiting

    def claim_cpu(self) -> AbstractContextManager[None]:
        """Nothing to claim: the model computes on another machine."""
        return nullcontext()

    def stream(
        self,
        prompt_token_ids: PromptIds,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int | None = None,
    ) -> AsyncGenerator[StreamDelta]:
        params = checked_params(params)
        prompt = self.inputs.validate_prompt(prompt_token_ids)
        if not self._started or self._stopped:
            raise RuntimeError("the engine is not running: start() it, or it was closed")
        headers = {"X-Request-Id": request_id} if request_id is not None else {}
        return self._stream(self._body(prompt, params, priority), headers, len(prompt))

    def figures(self) -> EngineFigures:
        queried, hit = self._prefix_queried_tokens, self._prefix_hit_tokens
        return EngineFigures(
            model=self.model_name,
            num_parameters=self.num_parameters,
            is_demo_model=self.is_demo_model,
            device=f"remote {self.url}",
            dtype="remote",
            max_model_len=self.max_model_len,
            requests=RequestFigures(running=self._num_running, waiting=self._num_waiting, preemptions=0),
            kv_cache=KVPoolFigures(
                block_size=0,
                blocks_total=0,
                blocks_used=0,
                blocks_free=0,
                blocks_cached=0,
                usage=0.0,
                prefix_queried_tokens=queried,
                prefix_hit_tokens=hit,
                prefix_hit_rate=hit / queried if queried else 0.0,
            ),
            activity=self._metrics.figures(),
        )

    # --- start-up checks ------------------------------------------------------------------------

    def _served_model(self, client: httpx.Client) -> dict[str, Any]:
        try:
            response = client.get("/v1/models")
        except httpx.HTTPError as exc:
            raise RemoteEngineError(f"engine.remote_url {self.url}: cannot reach the model server ({exc})") from None
        if response.status_code != 200:
            raise RemoteEngineError(
                f"engine.remote_url {self.url}: /v1/models answered {response.status_code} {_error_message(response)}"
            )
        served = {card["id"]: card for card in response.json().get("data", [])}
        wanted = self.config.model
        if wanted is None and len(served) == 1:
            return next(iter(served.values()))
        if wanted in served:
            return served[wanted]
        raise RemoteEngineError(
            f"engine.remote_model: the server at {self.url} serves {', '.join(sorted(served)) or 'no model'}"
            + ("" if wanted is None else f", not {wanted!r}")
            + ("; name one" if wanted is None and served else "")
        )

    def _max_model_len(self, card: dict[str, Any]) -> int:
        lengths = [n for n in (card.get("max_model_len"), self.config.max_model_len) if isinstance(n, int)]
        if not lengths:
            raise RemoteEngineError(
                f"engine.max_model_len: the server at {self.url} does not report its max_model_len; set it"
            )
        return min(lengths)

    def _check_vocabulary(self, client: httpx.Client) -> None:
        """The server's tokenizer and ours must give the same ids, or every prompt means something
        else there: vLLM's and SGLang's `/tokenize` say what theirs gives."""
        ours = self.tokenizer.encode(VOCABULARY_PROBE, add_special_tokens=False)
        body = {"model": self.model_name, "prompt": VOCABULARY_PROBE, "add_special_tokens": False}
        response = client.post("/tokenize", json=body)
        if response.status_code == 404:
            logger.warning("%s has no /tokenize: engine.tokenizer cannot be checked against it", self.url)
            return
        if response.status_code != 200:
            raise RemoteEngineError(f"{self.url}/tokenize answered {response.status_code} {_error_message(response)}")
        theirs = response.json().get("tokens")
        if theirs != ours:
            raise RemoteEngineError(
                f"engine.tokenizer {self.config.tokenizer!r} does not match the tokenizer of {self.model_name} at "
                f"{self.url}: a probe text is {len(ours)} tokens here and {len(theirs or [])} there; "
                "name the served model's tokenizer"
            )

    # --- requests -------------------------------------------------------------------------------

    def _body(self, prompt: TokenArray, params: SamplingParams, priority: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": prompt.tolist(),  # JSON has no arrays of int32
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            # Elsewhere dynamic top-k samples from its wider choice at every position.
            "top_k": (params.max_top_k if params.dynamic_top_k else params.top_k) or -1,
            "stop": params.stop,
            "stop_token_ids": params.stop_token_ids,
            "ignore_eos": params.ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if self.config.send_priority:
            body["priority"] = params.priority if priority is None else priority
        if self._takes_dynamic_top_k:
            body |= {
                "dynamic_top_k": params.dynamic_top_k,
                "min_top_k": params.min_top_k,
                "max_top_k": params.max_top_k,
                "confidence": params.confidence,
            }
        return body

    async def _stream(
        self, body: dict[str, Any], headers: dict[str, str], num_prompt_tokens: int
    ) -> AsyncGenerator[StreamDelta]:
        if (wait_s := self._retry_at - time.monotonic()) > 0:
            raise EngineUnavailable(f"the model server at {self.url} is unreachable; trying again in {wait_s:.1f} s")
        self._num_waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._num_waiting -= 1
        self._num_running += 1
        try:
            async for delta in self._completion(body, headers, num_prompt_tokens):
                yield delta
        finally:
            self._num_running -= 1
            self._slots.release()

    async def _completion(
        self, body: dict[str, Any], headers: dict[str, str], num_prompt_tokens: int
    ) -> AsyncGenerator[StreamDelta]:
        started = last = time.perf_counter()
        ttft_s: float | None = None
        finished: StreamDelta | None = None
        try:
            async with self._client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise self._refusal(response)
                self._reachable()
                async for chunk in _events(response):
                    for delta in _deltas(chunk):
                        now = time.perf_counter()
                        ttft_s = now - started if ttft_s is None else ttft_s
                        n = len(delta.token_ids)
                        self._metrics.record_step(now - last, self._num_running, n, n)
                        last = now
                        if delta.finished:
                            finished = delta
                        else:
                            yield delta
                    if (usage := chunk.get("usage")) and finished is not None:
                        finished.num_prompt_tokens = usage.get("prompt_tokens")
                        finished.num_cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            self._unreachable(exc)
            raise EngineUnavailable(f"the model server at {self.url} is unreachable ({exc})") from None
        except (httpx.TransportError, RemoteStreamError) as exc:
            # Cut mid-way (or the client closed by shutdown): the reply ends unfinished, nothing of it kept.
            logger.warning("the stream from %s broke: %s", self.url, exc)
            finished = None
        if finished is None:
            finished = StreamDelta(finished=True, finish_reason="abort" if self._stopped else "error")
        finished.num_prompt_tokens = finished.num_prompt_tokens or num_prompt_tokens
        finished.num_cached_tokens = finished.num_cached_tokens or 0
        self._record_finished(finished, ttft_s)
        yield finished

    def _record_finished(self, delta: StreamDelta, ttft_s: float | None) -> None:
        assert delta.finish_reason is not None and delta.num_prompt_tokens is not None
        self._metrics.record_finished(delta.finish_reason, delta.num_prompt_tokens, ttft_s)
        self._prefix_queried_tokens += delta.num_prompt_tokens
        self._prefix_hit_tokens += delta.num_cached_tokens or 0

    def _refusal(self, response: httpx.Response) -> Exception:
        """400: the prompt or its parameters (ValueError, as the local engine raises); anything
        else: the server cannot serve now."""
        message = _error_message(response)
        if response.status_code == 400:
            return ValueError(message)
        if response.status_code in (401, 403):
            logger.error("%s refused engine.remote_api_key (%d)", self.url, response.status_code)
        return EngineUnavailable(f"the model server answered {response.status_code}: {message}")

    def _unreachable(self, exc: Exception) -> None:
        self._failures += 1
        backoff_s = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (self._failures - 1))
        self._retry_at = time.monotonic() + backoff_s
        logger.warning("the model server at %s is unreachable (%s); next try in %.1f s", self.url, exc, backoff_s)

    def _reachable(self) -> None:
        if self._failures:
            logger.info("the model server at %s is reachable again", self.url)
        self._failures, self._retry_at = 0, 0.0


class RemoteStreamError(Exception):
    """The server's stream says it failed, or is not what a token-id client needs."""


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Server-sent events' JSON, up to [DONE]; a stream that ends without it was cut."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise RemoteStreamError(f"the server sent an event that is not JSON: {data[:80]!r}") from None
        if "error" in chunk:
            raise RemoteStreamError(_message(chunk))
        yield chunk
    raise RemoteStreamError("the stream ended before [DONE]")


def _deltas(chunk: dict[str, Any]) -> list[StreamDelta]:
    deltas = []
    for choice in chunk.get("choices") or []:
        token_ids = choice.get("token_ids")
        if token_ids is None:
            raise RemoteStreamError("the server sends no token_ids: it needs return_token_ids (vLLM 0.10.2 or later)")
        reason = choice.get("finish_reason")
        delta = StreamDelta(token_ids=list(token_ids), text=choice.get("text") or "")
        if reason is not None:
            delta.finished, delta.finish_reason = True, _finish_reason(reason)
        deltas.append(delta)
    return deltas


# vLLM's "repetition": its repetition detector stopped the reply, a stop like any other.
FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "repetition": "stop", "length": "length", "abort": "abort"}


def _finish_reason(reason: str) -> FinishReason:
    return FINISH_REASONS.get(reason, "error")


def _error_message(response: httpx.Response) -> str:
    try:
        return _message(response.json())
    except ValueError:
        return response.text[:200]


def _message(body: Any) -> str:
    """vLLM's and ours: {"error": {"message": ...}}; SGLang's older: {"message": ...}."""
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return str(body)[:200]
