"""The gateway's request body guard: a size limit and strict JSON, before any route.

An ASGI middleware in front of the FastAPI application:
- a body larger than the route's limit is answered 413 with an E3004 error body: at
  once when `Content-Length` says so (nothing is read), else as soon as the bytes
  read pass the limit (a chunked body is never buffered past it);
- a JSON body (or one without a content type, which FastAPI reads as JSON) holding
  NaN, Infinity, a lone UTF-16 surrogate or nesting past a bound is answered 422
  with E3004, as any body that does not match the API schema (Python's JSON reader
  takes those, and they would reach tools as null or break the next event).
The accepted body is handed to the application as it was received.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from domain.request_limits import PayloadRejected, strict_json_loads

REQUEST_INVALID = "E3004"

BodyLimit = Callable[[str], int]
"""The largest body, in bytes, accepted for a request path."""


class _TooLarge(Exception):
    def __init__(self, limit: int, received: int | None) -> None:
        super().__init__(limit)
        self.limit = limit
        self.received = received


class RequestBodyGuard:
    """ASGI middleware: body size limit (413) and strict JSON (422), both E3004."""

    def __init__(self, app: ASGIApp, limit_for: BodyLimit) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        try:
            body = await _read_body(scope, receive, limit)
        except _TooLarge as error:
            await _answer(send, 413, f"request body is larger than the {error.limit}-byte "
                          "limit", {"reason": "too_large", "max": error.limit,
                                    **({"actual": error.received} if error.received else {})})
            return
        if body and _is_json(scope):
            try:
                strict_json_loads(body)
            except PayloadRejected as error:
                if error.details.get("reason") != "not_json":  # FastAPI reports those
                    await _answer(send, 422, f"request body is not strict JSON: "
                                  f"{error.message}", error.details)
                    return
        await self.app(scope, _replay(body), send)


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    declared = _content_length(scope)
    if declared is not None and declared > limit:
        raise _TooLarge(limit, declared)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge(limit, None)
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return receive


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


def _content_length(scope: Scope) -> int | None:
    raw = _header(scope, b"content-length")
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _is_json(scope: Scope) -> bool:
    raw = _header(scope, b"content-type")
    if raw is None:
        return True
    media = raw.decode("latin-1").split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


async def _answer(send: Send, status: int, message: str, details: dict[str, Any]) -> None:
    body = json.dumps({"error": {"code": REQUEST_INVALID, "message": message,
                                 "details": details}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def body_limits(default_bytes: int, register_bytes: int) -> BodyLimit:
    """`register_bytes` for `POST /v1/tools/register` (its body carries a tool's
    files), `default_bytes` for every other path."""
    def limit_for(path: str) -> int:
        return register_bytes if path.rstrip("/") == "/v1/tools/register" else default_bytes
    return limit_for
