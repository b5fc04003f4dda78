"""Callbacks of async callers: where a terminal result may be POSTed, and how it is
signed so the receiver can tell it came from this deployment.

Where (the operator's right, never the caller's): `check_callback_url` accepts an
http(s) URL without credentials whose host matches one of the operator's callback
hosts (exact, or `*.example.com` for any subdomain, as `domain.egress.host_matches`);
a malformed URL is E3004, a host not listed E3406. Private, loopback, link-local...
addresses (`domain.egress.forbidden_reason`) are reached only through a host the
operator listed by its exact name or address, never through a `*.` pattern:
`check_callback_addresses` checks what the host resolved to at delivery.

How it is signed (Stripe / GitHub style): the header
``Toolexec-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>`` where the HMAC is keyed
with the operator's secret over ``<t>.`` followed by the exact body bytes.
`verify_signature` is what a receiver does (constant-time compare, bounded clock skew).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from domain.egress import forbidden_reason, host_matches
from domain.errors import InvalidRequest, NetworkPolicyViolation

SIGNATURE_HEADER = "Toolexec-Signature"
EVENT_ID_HEADER = "Toolexec-Event-Id"
"""The terminal event's id: the same on every re-send, the receiver's dedupe key."""
MAX_URL_CHARS = 2000
DEFAULT_TOLERANCE_SECONDS = 300


@dataclass(frozen=True, slots=True)
class CallbackTarget:
    """A checked callback URL: its host (lower case, no trailing dot) and port."""

    url: str
    scheme: str
    host: str
    port: int
    listed_exactly: bool
    """The host is one of the operator's entries by name (not only by a `*.` pattern):
    it may resolve to private or loopback addresses."""


def check_callback_url(url: str, allowed_hosts: Iterable[str]) -> CallbackTarget:
    """`url` as a CallbackTarget when the operator allows it; InvalidRequest (E3004)
    for a malformed URL, NetworkPolicyViolation (E3406) for a host not allowed."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise InvalidRequest(f"callback_url must be a URL of at most {MAX_URL_CHARS} "
                             "characters", details={"callback_url": str(url)[:200]})
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise InvalidRequest(f"callback_url is not a valid URL: {error}",
                             details={"callback_url": url[:200]}) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest("callback_url must be an http or https URL with a host",
                             details={"callback_url": url[:200]})
    if parts.username is not None or parts.password is not None:
        raise InvalidRequest("callback_url must not carry credentials",
                             details={"host": parts.hostname})
    host = parts.hostname.lower().rstrip(".")
    hosts = [h.lower().rstrip(".") for h in allowed_hosts]
    if not any(host_matches(host, pattern) for pattern in hosts):
        raise NetworkPolicyViolation(
            f"callback host {host!r} is not one the operator allows "
            "(TOOLEXEC_CALLBACK_HOSTS)", details={"host": host})
    exact = host in hosts
    _check_literal(host, exact)
    return CallbackTarget(url=url, scheme=parts.scheme, host=host,
                          port=port or (443 if parts.scheme == "https" else 80),
                          listed_exactly=exact)


def _check_literal(host: str, exact: bool) -> None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return
    reason = forbidden_reason(address)
    if reason is not None and not exact:
        raise NetworkPolicyViolation(
            f"callback address {host} is {reason}: list it exactly to allow it",
            details={"host": host, "range": reason})


def check_callback_addresses(target: CallbackTarget, addresses: Iterable[str]) -> None:
    """Refuse (E3406) a host resolving to no address, or to a private, loopback...
    address when the operator did not list the host exactly."""
    resolved = list(addresses)
    if not resolved:
        raise NetworkPolicyViolation(f"{target.host} did not resolve to any address",
                                     details={"host": target.host})
    if target.listed_exactly:
        return
    for text in resolved:
        reason = forbidden_reason(ipaddress.ip_address(text.split("%", 1)[0]))
        if reason is not None:
            raise NetworkPolicyViolation(
                f"{target.host} resolves to {text}, a {reason} address; only a host listed "
                "exactly may", details={"host": target.host, "address": text, "range": reason})


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """The `Toolexec-Signature` header value of `body` sent at `timestamp`."""
    digest = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


def verify_signature(secret: bytes, header: str, body: bytes, now: float, *,
                     tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS) -> bool:
    """Whether `header` signs `body` with `secret` and its time is within `tolerance`
    of `now` (a replayed old delivery is refused)."""
    fields: dict[str, list[str]] = {}
    for item in header.split(","):
        name, sep, value = item.strip().partition("=")
        if sep:
            fields.setdefault(name, []).append(value)
    try:
        timestamp = int(fields["t"][0])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance_seconds:
        return False
    expected = signature(secret, timestamp, body).rpartition("v1=")[2]
    return any(hmac.compare_digest(expected, given) for given in fields.get("v1", []))
