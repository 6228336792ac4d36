"""OpenAI-style errors: every failure is ``{"error": {"message", "type", "param", "code"}}``.

``APIError`` is raised by the endpoints; ``install_error_handlers`` maps it, FastAPI's
validation errors (400 instead of FastAPI's 422), Starlette's HTTP errors (404 route, 405,
413) and speclive's own errors (context overflow -> 400 ``context_length_exceeded``, bad
audio -> 400) onto that shape. Anything else is a 500 with a generic message, produced by the
error boundary in ``middleware.py`` (which also logs it).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from speclive.asr.audio import AudioError
from speclive.errors import ConfigError, ContextOverflowError

log = logging.getLogger("speclive.server")

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class APIError(Exception):
    """An error answered with ``status`` and the OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        type_: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type_ or error_type(status)
        self.headers = headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class BodyTooLarge(StarletteHTTPException):
    """The request body passed ``ServerConfig.max_body_bytes`` while it was being read.

    An ``HTTPException`` so that FastAPI's body parsing re-raises it as it is (it turns other
    exceptions from reading the body into a 400).
    """

    def __init__(self, limit: int):
        super().__init__(413, f"request body too large: this server accepts at most {limit} bytes")


def model_not_found(name: str, served: list[str]) -> APIError:
    return APIError(
        404,
        f"The model `{name}` does not exist. Models served here: {', '.join(served)}.",
        code="model_not_found",
        param="model",
    )


def translate(exc: BaseException) -> APIError | None:
    """The ``APIError`` for an exception a request may legitimately cause, else None (a 500)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextOverflowError):
        return APIError(400, str(exc), code="context_length_exceeded", param="messages")
    if isinstance(exc, AudioError):
        message = f"the uploaded file is not readable audio: {exc}"
        return APIError(400, message, code="invalid_audio", param="file")
    if isinstance(exc, ConfigError):
        return APIError(400, str(exc), code="invalid_value")
    return None


def _loc_param(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header", "form", "file")]
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out += f"[{p}]" if p.isdigit() else f".{p}"
    return out


def validation_error(exc: RequestValidationError) -> APIError:
    errors = list(exc.errors())
    if not errors:
        return APIError(400, "invalid request", code="invalid_request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        return APIError(
            400,
            f"We could not parse the JSON body of your request: {ctx.get('error', 'invalid JSON')}",
            code="invalid_json",
        )
    msgs = []
    for e in errors[:5]:
        param = _loc_param(tuple(e.get("loc", ())))
        msgs.append(f"{param}: {e.get('msg')}" if param else str(e.get("msg")))
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return APIError(
        400,
        "Invalid request: " + "; ".join(msgs) + more,
        code="invalid_type" if first.get("type", "").endswith("_type") else "invalid_value",
        param=_loc_param(tuple(first.get("loc", ()))),
    )


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        err = translate(exc)
        assert err is not None
        return err.response()

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return validation_error(exc).response()

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        status = exc.status_code
        message = str(exc.detail)
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(status)
        if status == 404 and message == "Not Found":
            message = f"Unknown endpoint {request.method} {request.url.path}"
        return APIError(status, message, code=code, headers=getattr(exc, "headers", None)).response()

    for cls in (APIError, ContextOverflowError, AudioError, ConfigError):
        app.add_exception_handler(cls, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
