"""Capability tokens: RS256 JWTs naming the tools an agent may invoke.

Claims: `sub` (agent DID), `exp`, `iat`, `jti`, `tools: [{tool_id, version_range}]`.
Verification is pure: the current time comes in as an argument, so expiry is
checked here rather than by PyJWT's own clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
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
    return _capability_from(_checked_claims(token, public_keys), now)


def _checked_claims(token: str, public_keys: Sequence[Any]) -> dict[str, Any]:
    """The claims of `token` once its algorithm and signature are checked."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise _fail("E3203", f"malformed token: {exc}") from exc
    if header.get("alg") != ALGORITHM:
        raise _fail("E3203", f"token algorithm {header.get('alg')!r} is not accepted; RS256 only")
    if not public_keys:
        raise _fail("E3202", "no verification key is configured")
    return _decode_with_any(token, public_keys)


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


@dataclass
class VerifiedTokens:
    """Claims of tokens whose signature was already verified, so an agent presenting
    the same token again costs a lookup instead of an RSA verification (~0.2 ms).

    Keyed by the token text and the fingerprints of the keys it was checked against:
    a rotated key set misses. Expiry is checked again on every use.
    """

    limit: int = 10_000
    hits: int = 0
    misses: int = 0
    _claims: OrderedDict[tuple[str, tuple[int, ...]], dict[str, Any]] = field(
        default_factory=OrderedDict)

    def verify(self, token: str, public_keys: Sequence[Any], *, now: int) -> Capability:
        key = (token, tuple(_fingerprint(k) for k in public_keys))
        claims = self._claims.get(key)
        if claims is None:
            self.misses += 1
            claims = self._claims[key] = _checked_claims(token, public_keys)
            while len(self._claims) > self.limit:
                self._claims.popitem(last=False)
        else:
            self.hits += 1
        return _capability_from(claims, now)


def _fingerprint(public_key: Any) -> int:
    try:
        numbers = public_key.public_numbers()
        return hash((numbers.n, numbers.e))
    except AttributeError:  # not an RSA key: it can verify no RS256 token anyway
        return hash(repr(public_key))


def authorise(token: str | None, public_keys: Sequence[Any], *, tool_id: str, version: str,
              now: int, verified: VerifiedTokens | None = None) -> Capability:
    """Verify `token` and check it grants `tool_id@version` (E3204 otherwise).
    A missing token is refused like a malformed one (E3203). With `verified`, a token
    seen before is not verified again."""
    if not token:
        raise _fail("E3203", "capability token required but none was presented")
    capability = (verified.verify(token, public_keys, now=now) if verified is not None
                  else verify_token(token, public_keys, now=now))
    if not capability.allows(tool_id, version):
        raise _fail("E3204", f"tool {tool_id}@{version} is not in the capability token")
    return capability
