"""Redaction of secrets and PII from JSON values (spec 11.3.5), at two levels.

- `redact_secrets` (what an authorized caller receives): values under field names
  that denote secrets (password, token, api_key...) are replaced whole, and every
  literal secret value passed in (credentials a run received, secret parameters) is
  scrubbed from every string. Nothing else changes: a result is the tool's result.
- `redact` (the audit trail, read models for others, logs): the same, plus text
  patterns, each validated before it is replaced so that ordinary values survive —
  e-mail addresses; JSON Web Tokens and bearer credentials; `key: value` or
  `key=value` pairs whose key denotes a secret; card numbers (13-19 digits, a
  2-6 first digit, Luhn check, not one repeated digit); SSNs (no 000/666/9xx area,
  00 group or 0000 serial); IPv4 and IPv6 literals (as `ipaddress` parses them);
  phone numbers written as phone numbers (an international `+` number of 8-15
  digits, or a North American number with separators, its area and exchange codes
  starting 2-9). Bare digit runs (counts, ids, timestamps) are never phone numbers.

Pure and deterministic: the same input always yields the same output and count, so
the audit hash chain is the same on every replay.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from domain.canonical_json import REFERENCE, SAME, key_encoding, leaf_encoding
from domain.secret_scrub import MIN_SECRET, REDACTED, Scrubber, json_forms

MIN_SECRET_CHARS: Final = MIN_SECRET

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
        "credential",
        "jwt",
    }
)


def _normalise_field(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


@lru_cache(maxsize=4096)
def is_sensitive_field(name: str) -> bool:
    """True when a field name denotes a secret (password, tokens, api_key, ...)."""
    normalised = _normalise_field(name)
    singular = normalised[:-1] if normalised.endswith("s") else normalised
    return (normalised in _SENSITIVE_FIELDS or singular in _SENSITIVE_FIELDS
            or normalised.endswith(("password", "secret", "apikey")))


# ----------------------------------------------------------------- text patterns


def _luhn(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _card(match: re.Match[str]) -> bool:
    digits = re.sub(r"[ -]", "", match.group(0))
    return (13 <= len(digits) <= 19 and digits[0] in "23456" and len(set(digits)) > 1
            and _luhn(digits))


def _ssn(match: re.Match[str]) -> bool:
    area, group, serial = match.group(1), match.group(2), match.group(3)
    return (area not in ("000", "666") and area[0] != "9" and group != "00"
            and serial != "0000")


def _ipv4(match: re.Match[str]) -> bool:
    try:
        ipaddress.IPv4Address(match.group(0))
    except ValueError:
        return False
    return True


def _ipv6(match: re.Match[str]) -> bool:
    try:
        ipaddress.IPv6Address(match.group(0))
    except ValueError:
        return False
    return True


def _nanp(match: re.Match[str]) -> bool:
    digits = re.sub(r"\D", "", match.group(0))
    national = digits[1:] if len(digits) == 11 else digits
    return len(national) == 10 and national[0] in "23456789" and national[3] in "23456789"


def _international(match: re.Match[str]) -> bool:
    digits = re.sub(r"\D", "", match.group(0))
    return 8 <= len(digits) <= 15 and digits[0] != "0"


def _always(match: re.Match[str]) -> bool:
    return True


_SECRET_KEY = (r"[A-Za-z0-9_-]{0,40}(?i:password|passwd|secret|token|api[_-]?key|"
               r"authorization|cookie|private[_-]?key|credential|jwt|ssn)[A-Za-z0-9_-]{0,40}")
_PAIR_VALUE = r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|[^\s\"',;&}\]]+"


_KEY_WORDS: Final = ("password", "passwd", "secret", "token", "apikey", "api_key", "api-key",
                     "authorization", "cookie", "private", "credential", "jwt", "ssn")
_THREE_DIGITS: Final = re.compile(r"\d{3}")
_DOTTED_DIGITS: Final = re.compile(r"\d\.\d")


def _digits(text: str, lowered: str) -> bool:
    return _THREE_DIGITS.search(text) is not None


@dataclass(frozen=True, slots=True)
class _Rule:
    label: str
    pattern: re.Pattern[str]
    valid: Callable[[re.Match[str]], bool]
    hint: Callable[[str, str], bool]
    """Cheap test of (text, text.lower()): False means the pattern cannot match."""


_RULES: Final[tuple[_Rule, ...]] = (
    _Rule("EMAIL", re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b"), _always,
          lambda text, lowered: "@" in text),
    _Rule("JWT", re.compile(r"\beyJ[A-Za-z0-9_-]{2,}\.eyJ[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*"),
          _always, lambda text, lowered: "eyJ" in text),
    _Rule("BEARER", re.compile(r"\b(?i:bearer|basic)\s+[A-Za-z0-9._~+/-]{8,}=*"), _always,
          lambda text, lowered: "bearer" in lowered or "basic" in lowered),
    _Rule("PAIR", re.compile(rf"([\"']?)\b({_SECRET_KEY})\1(\s*[:=]\s*)({_PAIR_VALUE})"),
          lambda m: (is_sensitive_field(m.group(2)) and REDACTED not in m.group(4)
                     and not m.string.startswith(f" {REDACTED}", m.end())),
          lambda text, lowered: any(word in lowered for word in _KEY_WORDS)),
    _Rule("CREDIT_CARD", re.compile(r"(?<![\w.-])\d(?:[ -]?\d){12,18}(?![\w-]|\.\d)"), _card,
          _digits),
    _Rule("SSN", re.compile(r"(?<![\w-])(\d{3})-(\d{2})-(\d{4})(?![\w-])"), _ssn,
          lambda text, lowered: "-" in text and _digits(text, lowered)),
    _Rule("IP_ADDRESS", re.compile(
        r"(?<![\w:.])(?=[0-9A-Fa-f:.]*[0-9A-Fa-f])(?:[0-9A-Fa-f]{0,4}:){2,7}"
        r"(?:[0-9A-Fa-f]{1,4}|(?:\d{1,3}\.){3}\d{1,3})?(?![\w:]|\.\w)"), _ipv6,
        lambda text, lowered: text.count(":") >= 2),
    _Rule("IP_ADDRESS", re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?!\.?\w)"), _ipv4,
          lambda text, lowered: (text.count(".") >= 3
                                 and _DOTTED_DIGITS.search(text) is not None)),
    _Rule("PHONE", re.compile(r"(?<![\w+])\+\d(?:[ .-]?\(?\d\)?){6,14}(?![\w-]|\.\d)"),
          _international, lambda text, lowered: "+" in text),
    _Rule("PHONE", re.compile(
        r"(?<![\w+.-])(?:1[ .-]?)?(?:\(\d{3}\)[ ]?|\d{3}[ .-])\d{3}[ .-]\d{4}(?![\w-]|\.\d)"),
        _nanp, _digits),
)


def _replace(rule: _Rule, counter: list[int]) -> Callable[[re.Match[str]], str]:
    def replace(match: re.Match[str]) -> str:
        if not rule.valid(match):
            return match.group(0)
        counter[0] += 1
        if rule.label == "PAIR":
            quote = match.group(4)[:1] if match.group(4)[:1] in "\"'" else ""
            return f"{match.group(1)}{match.group(2)}{match.group(1)}{match.group(3)}" \
                   f"{quote}{REDACTED}{quote}"
        if rule.label == "BEARER":
            return f"{match.group(0).split()[0]} {REDACTED}"
        return f"[{rule.label}_REDACTED]"
    return replace


def redact_text(text: str) -> tuple[str, int]:
    """Replace PII, tokens and secret pairs found in `text` (validated, see the module
    docstring); returns the new text and how many values were replaced."""
    # Ids, versions and integrity hashes recur in every event of a tool or invocation.
    return _redact_short_text(text) if len(text) <= _CACHED_TEXT else _redact_text(text)


_CACHED_TEXT = 200


@lru_cache(maxsize=16384)
def _redact_short_text(text: str) -> tuple[str, int]:
    return _redact_text(text)


_INERT_SHAPES: Final = re.compile(
    r"[0-9-]*+[A-Za-z_][A-Za-z0-9_-]*+|[A-Za-z0-9_-]{38,}+"
    r"|[0-9a-f]{20,}+(?:\.[0-9a-f]{20,}+)++")
"""Text no rule of `_RULES` can change: one run of ``[A-Za-z0-9_-]`` (ids, hex and
base64url digests, signatures) with a letter or ``_`` in it or longer than 37, and
lower-case hex runs of 20 or more joined by dots (a fact's signed digest set). Why:
the e-mail, JWT, bearer, pair, IPv6 and international phone rules each need what
these lack (``@``; ``eyJ`` and a dot; white space; ``:`` or ``=``; ``+``); the card,
SSN, IPv4 and NANP phone rules refuse a word character, ``.`` or ``-`` before a
match, so they can match only from the text's start, and what they match (digits
and separators, 37 characters at most, or 1-3 digits before a dot) does not fit
the first run. Keep in step with `_RULES` (tests/unit/test_redaction.py runs every
rule over generated text of these shapes). Written with possessive repeats, so that
text of no such shape is refused without backtracking (a fact's `sigset`: 2.8 µs
with ``[A-Za-z0-9_-]*[A-Za-z_]...``, 0.8 µs so)."""


def _redact_text(text: str) -> tuple[str, int]:
    if _INERT_SHAPES.fullmatch(text) is not None:
        return text, 0
    return _apply_rules(text)


def _apply_rules(text: str) -> tuple[str, int]:
    # Most text holds nothing to redact: each rule's cheap hint skips its pattern.
    lowered = text.lower()
    counter = [0]
    for rule in _RULES:
        if rule.hint(text, lowered):
            text = rule.pattern.sub(_replace(rule, counter), text)
    return text, counter[0]


# ------------------------------------------------------------------- JSON values


@dataclass(frozen=True, slots=True)
class Redacted:
    value: Any
    count: int


_PLAIN = frozenset({bool, int, float})


def redact(value: Any, *, secrets: tuple[str, ...] = ()) -> Redacted:
    """Audit-level redaction of a JSON value: sensitive fields, literal `secrets`
    (e.g. credentials injected into the tool's environment), and PII, tokens and
    secret pairs in strings."""
    redacted, count, _ = _walk(value, secrets, redact_text)
    return Redacted(redacted, count)


def redact_document(value: Any) -> tuple[Any, int, int]:
    """`redact(value)` as (value, count), and how `canonical_json` can encode the
    redacted value (`canonical_json.encoding_of` of it), found in the same walk: the
    audit trail hashes the canonical JSON of every document it redacts."""
    return _walk(value, (), redact_text)


def redact_secrets(value: Any, *, secrets: tuple[str, ...] = ()) -> Redacted:
    """Caller-level redaction: sensitive fields and literal `secrets` only; PII and
    every other value reach the caller unchanged."""
    redacted, count, _ = _walk(value, secrets, None)
    return Redacted(redacted, count)


def _unchanged(text: str) -> tuple[str, int]:
    return text, 0


def _walk(value: Any, secrets: tuple[str, ...],
          text_rules: Callable[[str], tuple[str, int]] | None) -> tuple[Any, int, int]:
    """(redacted value, values redacted, `canonical_json` encoding of the result)."""
    rules = text_rules or _unchanged
    if secrets:
        scrub = Scrubber(secrets)  # the one rule for credential values

        def text(node: str) -> tuple[str, int]:
            found = 0
            cleaned = scrub.text(node)
            if cleaned != node:
                found = max(cleaned.count(REDACTED) - node.count(REDACTED), 1)
            cleaned, n = rules(cleaned)
            return cleaned, found + n
    else:
        text = rules
    # Most strings are short and recur (ids, versions, hashes): their audit redaction
    # is cached, looked up without the two calls of `redact_text`.
    short = _redact_short_text if text is redact_text else text
    state = [0, SAME]  # values redacted, encoding
    redacted = _walk_node(value, state, text, short)
    return redacted, state[0], REFERENCE if state[1] & REFERENCE else state[1]


def _walk_node(node: Any, state: list[int], text: Callable[[str], tuple[str, int]],
               short: Callable[[str], tuple[str, int]]) -> Any:
    """`node` redacted (`text` for strings, `short` for those of at most `_CACHED_TEXT`
    characters under a key); counts and encoding noted in `state`."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, item in node.items():
            if type(key) is not str or not key.isascii():
                state[1] |= key_encoding(key)
            kind = type(item)
            if kind is str:  # first: most values are text
                if item and isinstance(key, str) and is_sensitive_field(key):
                    out[key] = REDACTED
                    state[0] += 1
                    continue
                cleaned, n = short(item) if len(item) <= _CACHED_TEXT else text(item)
                out[key] = cleaned
                if n:
                    state[0] += n
            elif isinstance(key, str) and is_sensitive_field(key) and item not in (None, ""):
                out[key] = REDACTED
                state[0] += 1
            elif item is None:
                out[key] = None
            elif kind in _PLAIN:
                out[key] = item
                if kind is not bool:
                    state[1] |= leaf_encoding(item)
            else:
                out[key] = _walk_node(item, state, text, short)
        return out
    if isinstance(node, list):
        return [_walk_node(item, state, text, short) for item in node]
    if isinstance(node, str):
        cleaned, n = text(node)
        state[0] += n
        state[1] |= leaf_encoding(cleaned)
        return cleaned
    state[1] |= leaf_encoding(node)
    return node


# ------------------------------------------------------------ planned documents

# What a plan does with the value under one key: TEXT, text under a key that is not
# sensitive (the text rules); NUMBER, a number (nothing to redact, its canonical
# encoding noted); VALUE, any JSON value (the full walk); OBJECT, an object of a known
# shape (its own plan); OBJECTS, a list of such objects; SECRET, a value under a
# sensitive key (replaced whole unless empty).
TEXT, NUMBER, VALUE, OBJECT, OBJECTS, SECRET = range(6)

Plan = tuple[tuple[str, int, Any], ...]
"""(key, kind, the plan of an `OBJECT` / `OBJECTS` or None) of each key of an object
whose redaction can change it or its encoding; a key of none of them is left as is."""


def redact_planned(document: dict[str, Any], plan: Plan) -> tuple[dict[str, Any], int, int]:
    """`redact_document(document)` for an object whose keys are ASCII text and whose
    values under keys left out of `plan` no redaction changes (its caller's promise:
    a plan compiled from a validated model). Redacts `document` in place: objects that
    `plan` describes are the caller's own (a fresh serialization); every other value
    is replaced, never changed."""
    state = [0, SAME]
    _apply_plan(document, plan, state)
    return document, state[0], REFERENCE if state[1] & REFERENCE else state[1]


def _apply_plan(node: dict[str, Any], plan: Plan, state: list[int]) -> None:
    for key, kind, inner in plan:
        item = node.get(key)
        if item is None:  # absent or null: nothing to redact, nothing to encode
            continue
        if kind == TEXT:
            cleaned, n = (_redact_short_text(item) if len(item) <= _CACHED_TEXT
                          else _redact_text(item))
            node[key] = cleaned
            state[0] += n
        elif kind == NUMBER:
            state[1] |= leaf_encoding(item)
        elif kind == OBJECT:
            _apply_plan(item, inner, state)
        elif kind == OBJECTS:
            for each in item:
                _apply_plan(each, inner, state)
        elif kind == SECRET:
            if item != "":
                node[key] = REDACTED
                state[0] += 1
        else:
            node[key] = _walk_node(item, state, redact_text, _redact_short_text)


# ------------------------------------------------------------ secret parameters

SECRET_FORMATS: Final = frozenset({"password"})


def is_secret_schema(schema: Any) -> bool:
    """A parameter schema that marks its value secret: `writeOnly: true`, `format:
    password` or `x-secret: true`."""
    return isinstance(schema, Mapping) and (
        schema.get("writeOnly") is True or schema.get("x-secret") is True
        or schema.get("format") in SECRET_FORMATS)


def secret_parameter_values(schema: Any, parameters: Any) -> tuple[str, ...]:
    """The string values of secret parameters, at any depth: under a sensitive field
    name (as `redact` decides) or where the tool's parameter schema marks them secret
    (`is_secret_schema`), each also as JSON writes it inside a string. Outputs of a
    run are scrubbed of them before any event."""
    found: list[str] = []

    def leaves(node: Any) -> None:
        if isinstance(node, str):
            found.append(node)
        elif isinstance(node, Mapping):
            for item in node.values():
                leaves(item)
        elif isinstance(node, list):
            for item in node:
                leaves(item)

    def walk(node: Any, node_schema: Any) -> None:
        if is_secret_schema(node_schema):
            leaves(node)
            return
        properties = node_schema.get("properties") if isinstance(node_schema, Mapping) else None
        items = node_schema.get("items") if isinstance(node_schema, Mapping) else None
        if isinstance(node, Mapping):
            for key, item in node.items():
                if isinstance(key, str) and is_sensitive_field(key):
                    leaves(item)
                else:
                    walk(item, properties.get(key) if isinstance(properties, Mapping) else None)
        elif isinstance(node, list):
            for item in node:
                walk(item, items)

    walk(parameters, schema)
    # A tool printing JSON escapes quotes, backslashes, control and (often) non-ASCII
    # characters: those written forms are the same secret.
    forms = (form for value in found for form in (value, *json_forms(value)))
    return tuple(dict.fromkeys(v for v in forms if len(v) >= MIN_SECRET_CHARS))
