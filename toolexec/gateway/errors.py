"""Errors of the HTTP gateway: `{"error": {"code", "message", "details"}}` with the HTTP
status of the spec's error table (contracts.errors, section 11.5).

Request bodies and query strings that do not match the API's schema are 422 with code
E3004 (invalid request format) and pydantic's error list in `details.errors`.
"""

from __future__ import annotations

from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts.errors import ErrorInfo, http_status_for
from domain.errors import InvalidRequest, ToolexecError
from domain.request_limits import PayloadRejected, check_request_payload

log = structlog.get_logger(__name__)

REQUEST_INVALID = "E3004"
INTERNAL = "E3000"


class ErrorResponse(BaseModel):
    """Body of every error answer."""

    error: ErrorInfo = Field(description="E3xxx code, message and structured details.")


class ApiError(Exception):
    """An error answer: the code decides the status unless `status` overrides it."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None, *,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}
        self.status = status or http_status_for(code)

    @classmethod
    def from_info(cls, info: ErrorInfo, **extra: Any) -> ApiError:
        return cls(info.code, info.message, {**info.details, **extra})


def check_invoke_payload(parameters: Any, lockfile: Any, max_bytes: int) -> None:
    """Parameters (and lockfile) must be strict JSON within `max_bytes`: ApiError
    E3004, 413 when too large, else 422."""
    try:
        check_request_payload(parameters, lockfile=lockfile, max_bytes=max_bytes)
    except PayloadRejected as error:
        raise ApiError(error.code, error.message, error.details,
                       status=status_of(error)) from None


def status_of(error: ToolexecError) -> int:
    """The HTTP status of a use case's error: 413 for a payload too large, 422 for any
    other malformed request, else the status of its code in the error table."""
    if isinstance(error, PayloadRejected) and error.too_large:
        return 413
    if isinstance(error, InvalidRequest):
        return 422
    return http_status_for(error.code)


def error_response(status: int, code: str, message: str,
                   details: dict[str, Any] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "details": details or {}}}
    return JSONResponse(jsonable_encoder(body), status_code=status, headers=headers)


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries for error statuses of a route."""
    return {status: {"model": ErrorResponse} for status in statuses}


def install_error_handlers(app: FastAPI) -> None:
    """Every failure, including unexpected ones, answers with the error body."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.details)

    @app.exception_handler(ToolexecError)
    async def toolexec_error(request: Request, exc: ToolexecError) -> JSONResponse:
        return error_response(status_of(exc), exc.code, exc.message, exc.details)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""),
                   "type": e.get("type", "")} for e in exc.errors()]
        return error_response(422, REQUEST_INVALID, "request does not match the API schema",
                              {"errors": errors})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, REQUEST_INVALID, str(exc.detail),
                              headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Boundary: any bug becomes an E3000 answer, with the cause in the log.
        log.exception("gateway.unexpected_error", path=request.url.path)
        return error_response(500, INTERNAL, "internal error", {"type": type(exc).__name__})
