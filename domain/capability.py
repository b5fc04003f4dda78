"""Capability tokens: RS256 JWTs naming what their holder may do.

Claims: `sub` (agent DID), `exp`, `iat`, `jti`, optional `nbf`, `tools: [{tool_id,
version_range}]` (the tools it may invoke) and `scopes` (publish, lifecycle, approve,
policy, audit, admin; see `domain.scopes`). A token with only `tools` may only invoke.

Verification is pure: the current time comes in as an argument, so expiry is checked
here rather than by PyJWT's own clock. Lifetimes are bounded (`TokenLifetime`): a
token living longer than the maximum, or issued (or valid from) a moment beyond the
clock skew in the future, is refused.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jwt

from domain.errors import AuthorizationError
from domain.scopes import NO_SCOPES, Need, ScopeClaimError, Scopes, missing, parse_scopes
from domain.semver import select_highest

ALGORITHM = "RS256"
DEFAULT_MAX_TTL_SECONDS = 24 * 3600
DEFAULT_CLOCK_SKEW_SECONDS = 60


@dataclass(frozen=True, slots=True)
class TokenLifetime:
    """Bounds on a token's lifetime: `exp - iat` at most `max_ttl_seconds`; `iat` and
    `nbf` at most `clock_skew_seconds` in the future."""

    max_ttl_seconds: int = DEFAULT_MAX_TTL_SECONDS
    clock_skew_seconds: int = DEFAULT_CLOCK_SKEW_SECONDS


DEFAULT_LIFETIME = TokenLifetime()


@dataclass(frozen=True, slots=True)
class Capability:
    subject: str
    jti: str
    expires_at: int
    tools: tuple[tuple[str, str], ...]
    scopes: Scopes = NO_SCOPES
    issued_at: int = 0

    def allows(self, tool_id: str, version: str) -> bool:
        """True when the token names `tool_id` with a range that admits `version`."""
        return any(
            granted == tool_id and select_highest([version], version_range) == version
            for granted, version_range in self.tools
        )

    def grants(self, need: Need) -> bool:
        """True when the token's scopes cover `need`."""
        return missing(self.scopes, need) is None

    @property
    def reads_everything(self) -> bool:
        """True when the token may read the audit trail and every caller's invocations."""
        return self.grants(Need("audit"))


def _fail(code: str, message: str) -> AuthorizationError:
    return AuthorizationError(message, code=code)


def verify_token(token: str, public_keys: Sequence[Any], *, now: int,
                 lifetime: TokenLifetime = DEFAULT_LIFETIME) -> Capability:
    """Verify `token` against any of `public_keys` (rotation) and return its claims.

    E3203 malformed (also: wrong algorithm, missing claims, bad `tools` or `scopes`,
    a lifetime over `lifetime.max_ttl_seconds`, `iat` or `nbf` in the future), E3202
    bad signature, E3201 expired. `alg: none` and HS256 are refused before any key is
    tried.
    """
    return _capability_from(_checked_claims(token, public_keys), now, lifetime)


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


def _capability_from(claims: dict[str, Any], now: int, lifetime: TokenLifetime) -> Capability:
    exp, iat = _moment(claims, "exp"), _moment(claims, "iat")
    if now >= exp:
        raise _fail("E3201", "token expired")
    _check_lifetime(claims, exp, iat, now, lifetime)
    tools = claims.get("tools", [])
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("tool_id"), str) for t in tools
    ):
        raise _fail("E3203", "malformed token: tools must be a list of {tool_id, version_range}")
    try:
        scopes = parse_scopes(claims.get("scopes"))
    except ScopeClaimError as error:
        raise _fail("E3203", f"malformed token: {error}") from error
    return Capability(
        subject=str(claims["sub"]),
        jti=str(claims["jti"]),
        expires_at=int(exp),
        tools=tuple((t["tool_id"], str(t.get("version_range", "*"))) for t in tools),
        scopes=scopes,
        issued_at=int(iat),
    )


def _moment(claims: dict[str, Any], name: str) -> float:
    value = claims.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail("E3203", f"malformed token: {name} must be a finite number of seconds")
    return value


def _check_lifetime(claims: dict[str, Any], exp: float, iat: float, now: int,
                    lifetime: TokenLifetime) -> None:
    """A token valid longer than the maximum lifetime, or issued (valid from) beyond the
    clock skew in the future, is refused: a leaked token must not outlive its bound."""
    if iat > now + lifetime.clock_skew_seconds:
        raise _fail("E3203", "token issued in the future (iat is "
                    f"{int(iat - now)} s ahead; at most {lifetime.clock_skew_seconds} s "
                    "of clock skew is accepted)")
    if "nbf" in claims and _moment(claims, "nbf") > now + lifetime.clock_skew_seconds:
        raise _fail("E3203", "token not valid yet (nbf is in the future)")
    if exp - iat > lifetime.max_ttl_seconds:
        raise _fail("E3203", f"token lifetime {_seconds(exp - iat)} exceeds the "
                    f"{lifetime.max_ttl_seconds} s maximum; issue a shorter-lived token")


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value < 1e12 else f"{value:.3g} s"


@dataclass
class VerifiedTokens:
    """Claims of tokens whose signature was already verified, so an agent presenting
    the same token again costs a lookup instead of an RSA verification (~0.2 ms).

    Keyed by the token text and the fingerprints of the keys it was checked against:
    a rotated key set misses. Expiry is checked again on every use.
    """

    limit: int = 10_000
    lifetime: TokenLifetime = DEFAULT_LIFETIME
    """Lifetime bounds applied by `authorise` when it is given no other."""
    hits: int = 0
    misses: int = 0
    _claims: OrderedDict[tuple[str, tuple[int, ...]], dict[str, Any]] = field(
        default_factory=OrderedDict)

    def verify(self, token: str, public_keys: Sequence[Any], *, now: int,
               lifetime: TokenLifetime | None = None) -> Capability:
        key = (token, tuple(_fingerprint(k) for k in public_keys))
        claims = self._claims.get(key)
        if claims is None:
            self.misses += 1
            claims = self._claims[key] = _checked_claims(token, public_keys)
            while len(self._claims) > self.limit:
                self._claims.popitem(last=False)
        else:
            self.hits += 1
        return _capability_from(claims, now, lifetime or self.lifetime)


def _fingerprint(public_key: Any) -> int:
    try:
        numbers = public_key.public_numbers()
        return hash((numbers.n, numbers.e))
    except AttributeError:  # not an RSA key: it can verify no RS256 token anyway
        return hash(repr(public_key))


def authorise(token: str | None, public_keys: Sequence[Any], *, tool_id: str, version: str,
              now: int, verified: VerifiedTokens | None = None,
              lifetime: TokenLifetime | None = None) -> Capability:
    """Verify `token` and check its invoke grant (`tools`) admits `tool_id@version`
    (E3204 otherwise). A missing token is refused like a malformed one (E3203). With
    `verified`, a token seen before is not verified again. `lifetime` defaults to
    `verified.lifetime`, else to DEFAULT_LIFETIME."""
    capability = _verified(token, public_keys, now=now, verified=verified, lifetime=lifetime)
    if not capability.allows(tool_id, version):
        raise _fail("E3204", f"tool {tool_id}@{version} is not in the capability token")
    return capability


def authorise_action(token: str | None, public_keys: Sequence[Any], need: Need, *, now: int,
                     lifetime: TokenLifetime = DEFAULT_LIFETIME,
                     verified: VerifiedTokens | None = None) -> Capability:
    """Verify `token` and check its scopes grant `need` (publish, lifecycle, approve,
    policy, audit; admin for runtimes, primitives and MCP servers): E3206 otherwise."""
    capability = _verified(token, public_keys, now=now, verified=verified, lifetime=lifetime)
    require(capability, need)
    return capability


def authorise_reader(token: str | None, public_keys: Sequence[Any], *, now: int,
                     lifetime: TokenLifetime = DEFAULT_LIFETIME) -> Capability:
    """Verify the token of someone reading invocations or the audit trail: any valid
    token may read its own invocations; `reads_everything` tells whether it may read
    every caller's."""
    return _verified(token, public_keys, now=now, verified=None, lifetime=lifetime)


def require(capability: Capability, need: Need) -> None:
    """Raise E3206 unless `capability`'s scopes grant `need`."""
    reason = missing(capability.scopes, need)
    if reason is not None:
        raise AuthorizationError(f"permission denied: {reason}", code="E3206",
                                 details={"needs": need.describe(),
                                          "subject": capability.subject})


def _verified(token: str | None, public_keys: Sequence[Any], *, now: int,
              verified: VerifiedTokens | None, lifetime: TokenLifetime | None) -> Capability:
    if not token:
        raise _fail("E3203", "capability token required but none was presented")
    if verified is not None:
        return verified.verify(token, public_keys, now=now, lifetime=lifetime)
    return verify_token(token, public_keys, now=now, lifetime=lifetime or DEFAULT_LIFETIME)
