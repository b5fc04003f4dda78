"""Capability tokens: RS256 JWTs naming the tools an agent may invoke.

Claims: `sub` (agent DID), `exp`, `iat`, `jti`, `tools: [{tool_id, version_range}]`.
Verification is pure: the current time comes in as an argument, so expiry is
checked here rather than by PyJWT's own clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jwt

from domain.errors import AuthorizationError
from domain.semver import select_highest

ALGORITHM = "RS256"


@dataclass(frozen=True, slots=True)
class Capability:
    subject: str
    jti: str
    expires_at: int
    tools: tuple[tuple[str, str], ...]

    def allows(self, tool_id: str, version: str) -> bool:
        """True when the token names `tool_id` with a range that admits `version`."""
        return any(
            granted == tool_id and select_highest([version], version_range) == version
            for granted, version_range in self.tools
        )


def _fail(code: str, message: str) -> AuthorizationError:
    return AuthorizationError(message, code=code)


def verify_token(token: str, public_keys: Sequence[Any], *, now: int) -> Capability:
    """Verify `token` against any of `public_keys` (rotation) and return its claims.

    E3203 malformed (also: wrong algorithm, missing claims), E3202 bad signature,
    E3201 expired. `alg: none` and HS256 are refused before any key is tried.
    """
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise _fail("E3203", f"malformed token: {exc}") from exc
    if header.get("alg") != ALGORITHM:
        raise _fail("E3203", f"token algorithm {header.get('alg')!r} is not accepted; RS256 only")
    if not public_keys:
        raise _fail("E3202", "no verification key is configured")
    claims = _decode_with_any(token, public_keys)
    return _capability_from(claims, now)


def _decode_with_any(token: str, public_keys: Sequence[Any]) -> dict[str, Any]:
    last: Exception | None = None
    for key in public_keys:
        try:
            return jwt.decode(
                token,
                key=key,
                algorithms=[ALGORITHM],
                options={"verify_exp": False, "verify_iat": False, "verify_aud": False,
                         "require": ["exp", "iat", "jti", "sub"]},
            )
        except jwt.InvalidSignatureError as exc:
            last = exc
        except jwt.MissingRequiredClaimError as exc:
            raise _fail("E3203", f"malformed token: {exc}") from exc
        except jwt.PyJWTError as exc:
            raise _fail("E3203", f"malformed token: {exc}") from exc
    raise _fail("E3202", "token signature does not verify with any configured key") from last


def _capability_from(claims: dict[str, Any], now: int) -> Capability:
    exp = claims.get("exp")
    if not isinstance(exp, int | float):
        raise _fail("E3203", "malformed token: exp must be a number")
    if now >= int(exp):
        raise _fail("E3201", "token expired")
    tools = claims.get("tools", [])
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("tool_id"), str) for t in tools
    ):
        raise _fail("E3203", "malformed token: tools must be a list of {tool_id, version_range}")
    return Capability(
        subject=str(claims["sub"]),
        jti=str(claims["jti"]),
        expires_at=int(exp),
        tools=tuple((t["tool_id"], str(t.get("version_range", "*"))) for t in tools),
    )


def authorise(token: str | None, public_keys: Sequence[Any], *, tool_id: str, version: str,
              now: int) -> Capability:
    """Verify `token` and check it grants `tool_id@version` (E3204 otherwise).
    A missing token is refused like a malformed one (E3203)."""
    if not token:
        raise _fail("E3203", "capability token required but none was presented")
    capability = verify_token(token, public_keys, now=now)
    if not capability.allows(tool_id, version):
        raise _fail("E3204", f"tool {tool_id}@{version} is not in the capability token")
    return capability
