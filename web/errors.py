"""Errors a web client sees, in OpenAI's format: {"error": {"message", "type", "param", "code"}}.

The OpenAI-compatible API must answer this way, and the chat page uses the same shape so one
client-side reader handles both."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from web.openai_schemas import ErrorBody, ErrorDetail


class WebError(Exception):
    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def body(self) -> ErrorBody:
        return ErrorBody(error=ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code))

    def response(self) -> JSONResponse:
        return JSONResponse(self.body().model_dump(), status_code=self.status_code, headers=self.headers)


def invalid_body(exc: RequestValidationError) -> WebError:
    """400 naming the offending field the way OpenAI does (`messages[1].role`)."""
    # A value that fits no member of a union (`str | list[TextPart]`) has an error per member; the
    # member that got deepest says what is wrong (a list's bad item, not "expected a string").
    error = max(exc.errors(), key=lambda error: len(error["loc"]))
    if error["type"] == "json_invalid":
        return WebError(400, "The request body is not valid JSON.", code="invalid_json")
    # A union's members name themselves in the location (`list[TextPart]`): they are not fields.
    location = [part for part in error["loc"] if part != "body" and not (isinstance(part, str) and "[" in part)]
    param = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in location).lstrip(".")
    if not param:
        return WebError(400, f"The request body is invalid: {error['msg']}.")
    return WebError(400, f"Invalid value for '{param}': {error['msg']}.", param=param)


class WebErrorRoute(APIRoute):
    """Answers its routes' errors in OpenAI's format, body validation included (400, not FastAPI's
    422). Dependencies run inside the route handler, so their errors are caught here too."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return invalid_body(exc).response()
            except WebError as exc:
                return exc.response()

        return handle
