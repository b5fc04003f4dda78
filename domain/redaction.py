"""Redaction of secrets and PII from any JSON value (spec 11.3.5).

Field names that denote secrets are replaced whole; strings are scanned for e-mail
addresses, SSNs, card numbers, phone numbers and IPv4 addresses. Pure and
deterministic: the same input always yields the same output and count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

REDACTED = "[REDACTED]"

_SENSITIVE_FIELDS = frozenset(
    {
        "password",
        "passwd",
        "secret",
        "clientsecret",
        "token",
        "accesstoken",
        "refreshtoken",
        "idtoken",
        "captoken",
        "apikey",
        "privatekey",
        "authorization",
        "cookie",
        "creditcard",
        "cardnumber",
        "ssn",
        "socialsecurity",
        "socialsecuritynumber",
    }
)

# Order matters: the more specific patterns run first so a card number is not
# half-eaten by the phone pattern.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("EMAIL", re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b")),
    ("CREDIT_CARD", re.compile(r"\b\d{4}[\s-]?\d{4}[\s-]?\d{4}[\s-]?\d{4}\b")),
    ("SSN", re.compile(r"\b\d{3}-\d{2}-\d{4}\b")),
    ("IP_ADDRESS", re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")),
    ("PHONE", re.compile(r"(?<![\w.])(?:\+?\d{1,2}[\s.-]?)?\(?\d{3}\)?[\s.-]?\d{3}[\s.-]?\d{4}\b")),
)

# Matches wherever any of `_PATTERNS` matches (and maybe elsewhere): text it does not
# match has nothing to redact, which is most text, so one search replaces five passes.
_ANY_PATTERN = re.compile("|".join(f"(?:{pattern.pattern})" for _, pattern in _PATTERNS))


def _normalise_field(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


@lru_cache(maxsize=4096)
def is_sensitive_field(name: str) -> bool:
    """True when a field name denotes a secret (password, token, api_key, ...)."""
    normalised = _normalise_field(name)
    return normalised in _SENSITIVE_FIELDS or normalised.endswith(("password", "secret", "apikey"))


@dataclass(frozen=True, slots=True)
class Redacted:
    value: Any
    count: int


def redact_text(text: str) -> tuple[str, int]:
    """Replace PII found in `text`; returns the new text and how many matches."""
    # Ids, versions and integrity hashes recur in every event of a tool or invocation.
    return _redact_short_text(text) if len(text) <= _CACHED_TEXT else _redact_text(text)


_CACHED_TEXT = 200


@lru_cache(maxsize=16384)
def _redact_short_text(text: str) -> tuple[str, int]:
    return _redact_text(text)


def _redact_text(text: str) -> tuple[str, int]:
    if _ANY_PATTERN.search(text) is None:
        return text, 0
    total = 0
    for label, pattern in _PATTERNS:
        text, n = pattern.subn(f"[{label}_REDACTED]", text)
        total += n
    return text, total


_PLAIN = frozenset({bool, int, float})


def redact(value: Any, *, secrets: tuple[str, ...] = ()) -> Redacted:
    """Redact a JSON value: sensitive fields, PII in strings, and any literal secret
    value in `secrets` (e.g. credentials injected into the tool's environment)."""
    literals = tuple(s for s in secrets if len(s) >= 4)
    count = 0

    def walk(node: Any) -> Any:
        nonlocal count
        if isinstance(node, dict):
            out: dict[str, Any] = {}
            for key, item in node.items():
                if isinstance(key, str) and is_sensitive_field(key) and item not in (None, ""):
                    out[key] = REDACTED
                    count += 1
                elif item is None or type(item) in _PLAIN:  # inline: most values are leaves
                    out[key] = item
                elif type(item) is str and not literals:
                    out[key], n = redact_text(item)
                    count += n
                else:
                    out[key] = walk(item)
            return out
        if isinstance(node, list):
            return [walk(item) for item in node]
        if isinstance(node, str):
            for literal in literals:
                if literal in node:
                    count += node.count(literal)
                    node = node.replace(literal, REDACTED)
            node, n = redact_text(node)
            count += n
            return node
        return node

    return Redacted(walk(value), count)
