"""Plain ASGI middleware around the routes (outermost first):

- ``ObserveMiddleware``: counts every request by endpoint and status, times it to the last
  byte of the response, and is the error boundary: an exception nothing else handled becomes a
  500 with a generic OpenAI-style message (the traceback goes to the log, not to the client)
  and the server keeps serving;
- ``AuthMiddleware``: with an API key, every path but ``/health`` needs
  ``Authorization: Bearer KEY`` (compared in constant time), else 401;
- ``BodyLimitMiddleware``: a declared ``Content-Length`` over the limit is refused with 413
  before the body is read; a body without one (chunked) is counted while it is read.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from speclive.server.errors import APIError, BodyTooLarge
from speclive.server.metrics import Metrics

log = logging.getLogger("speclive.server")

#: open without the API key: health, and the web page with its static files (they hold no data;
#: the page asks for the key and uses it on the API)
OPEN_PATHS = frozenset({"/health", "/"})
OPEN_PREFIXES = ("/static/",)
INTERNAL_ERROR = "The server had an error while processing your request."


async def send_error(send: Send, err: APIError) -> None:
    body = json.dumps(err.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (err.headers or {}).items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k.lower() == name:
            return v.decode("latin-1")
    return None


class ObserveMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics, endpoint: Callable[[Scope], str]):
        self.app = app
        self.metrics = metrics
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500
        started = False

        async def observed_send(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = int(message["status"]), True
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if not started:
                status = 500
                err = APIError(500, INTERNAL_ERROR, code="internal_error")
                try:
                    await send_error(send, err)
                except Exception:  # the client may be gone as well
                    pass
        finally:
            endpoint = self.endpoint(scope)
            method = scope.get("method", "")
            self.metrics.requests.labels(endpoint=endpoint, method=method, status=str(status)).inc()
            self.metrics.latency.labels(endpoint=endpoint).observe(time.perf_counter() - t0)


WS_KEY_PREFIX = "openai-insecure-api-key."


class AuthMiddleware:
    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] not in ("http", "websocket") or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        auth = _header(scope, b"authorization") or ""
        scheme, _, token = auth.partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._key)
        if not ok and scope["type"] == "websocket":
            # browsers cannot set headers on a WebSocket: OpenAI's clients send the key as the
            # subprotocol "openai-insecure-api-key.<KEY>"
            for proto in scope.get("subprotocols") or []:
                if proto.startswith(WS_KEY_PREFIX) and hmac.compare_digest(
                    proto[len(WS_KEY_PREFIX) :].encode(), self._key
                ):
                    ok = True
        if ok:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            # accept, then close with 1008 and a reason (a refused handshake is only "HTTP 403")
            if (await receive())["type"] == "websocket.connect":
                await send({"type": "websocket.accept"})
                await send({"type": "websocket.close", "code": 1008, "reason": "invalid API key"})
            return
        message = (
            "Incorrect API key provided."
            if auth
            else "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'."
        )
        await send_error(
            send, APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        )


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = BodyTooLarge(self.max_bytes)
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await send_error(send, APIError(413, str(too_large.detail), code="request_too_large"))
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise too_large
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except BodyTooLarge as exc:
            if started:
                raise
            await send_error(send, APIError(413, str(exc.detail), code="request_too_large"))


def route_label(scope: Scope) -> str:
    """The path template of the route the request matched (``/v1/models/{model}``), else ``other``
    (the router records the route in the scope, which this middleware shares)."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else "other"
