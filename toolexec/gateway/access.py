"""Who is calling the gateway, and what they may see.

With authorization on, every write route needs a bearer token with the right scope
and every read of invocations or the audit trail a valid token (`toolexec.rights`).
A reader sees its own invocations (the token's subject) unless the token holds the
audit scope. Browsers reach the status page through a session cookie holding the
token (`POST /session` from the sign-in form): HttpOnly, SameSite=Strict, expiring
with the token, and accepted by read routes only, never by a route that writes.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from domain.capability import Capability
from domain.errors import AuthorizationError
from domain.scopes import Need
from toolexec import rights
from toolexec.gateway.errors import ApiError
from toolexec.settings import Settings
from toolexec.usecases.readers import check_reader, reader_subject

SESSION_COOKIE = "toolexec_token"
MAX_FORM_BYTES = 16 * 1024


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def read_token(request: Request) -> str | None:
    """The token of a read request: the bearer header, else the session cookie."""
    return bearer(request.headers.get("authorization")) or request.cookies.get(SESSION_COOKIE)


def caller(settings: Settings, token: str | None, needs: tuple[Need, ...] = ()) -> Capability | None:
    """The verified capability (None with authorization off) once it grants `needs`;
    401 / 403 with the E32xx code otherwise."""
    try:
        capability = rights.caller(settings, token)
        rights.demand(capability, needs)
    except AuthorizationError as error:
        raise ApiError(error.code, error.message, error.details) from None
    return capability


def subject_filter(capability: Capability | None) -> str | None:
    """The subject whose invocations a reader is limited to; None = every invocation."""
    return reader_subject(capability)


def check_visible(capability: Capability | None, row: Mapping[str, Any]) -> None:
    """403 E3206 unless the reader may see this invocation (toolexec.usecases.readers)."""
    try:
        check_reader(capability, row)
    except AuthorizationError as error:
        raise ApiError(error.code, error.message, error.details) from None


def session_routes(app: FastAPI, settings: Settings) -> None:
    """`POST /session` (sign in with a token) and `POST /session/end` (sign out)."""

    @app.post("/session", include_in_schema=False)
    async def sign_in(request: Request) -> Response:
        body = await request.body()
        fields = parse_qs(body[:MAX_FORM_BYTES].decode("utf-8", "replace"))
        token = (fields.get("token") or [""])[0].strip() or None
        try:
            capability = rights.caller(settings, token)
        except AuthorizationError as error:
            return sign_in_page(f"{error.code}: {error.message}", status=401)
        response = RedirectResponse("/", status_code=303)
        if capability is not None and token is not None:
            response.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="strict",
                                secure=request.url.scheme == "https", path="/",
                                max_age=max(capability.expires_at - int(time.time()), 0))
        return response

    @app.post("/session/end", include_in_schema=False)
    async def sign_out() -> Response:
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response


def sign_in_page(problem: str, *, status: int = 401) -> HTMLResponse:
    """The status page's answer without a valid token: why, and a sign-in form."""
    return HTMLResponse(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        "<title>toolexec status: sign in</title></head><body>"
        "<h1>toolexec status</h1>"
        f'<p id="problem">{html.escape(problem)}</p>'
        "<p>This system requires a capability token to read invocations. Paste one "
        "(<code>toolexec token issue --sub YOUR_DID --audit</code> reads every caller's; "
        "any valid token reads its own), or send it as "
        "<code>Authorization: Bearer</code>.</p>"
        '<form method="post" action="/session"><label>token '
        '<input name="token" type="password" autocomplete="off"></label>'
        '<button type="submit">Sign in</button></form></body></html>',
        status_code=status)
