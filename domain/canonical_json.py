"""RFC 8785 (JCS) canonical JSON, fast.

`rfc8785.dumps` is the reference; it serialises in Python, character by character,
and dominated the audit projection's profile. For the values events actually carry,
orjson (Rust; keys sorted) writes the very same bytes (same escapes, same separators,
shortest round-trip floats), several times faster than the standard library's C
encoder with sorted keys: `canonical_json` checks that a value is such a value and
falls back to `rfc8785.dumps` — which also raises the reference's errors — when it is
not. The checks, each a place where the two disagree:

- object keys must be `str` without characters beyond U+FFFF (JCS sorts by UTF-16
  code units, Python by code points; the orders differ only for those);
- integers must lie in JCS's safe range (the reference refuses others);
- floats must be finite, and print without an exponent (Python switches to
  exponents at 1e16 and below 1e-4, ECMAScript at 1e21 and below 1e-6); integral
  floats print as integers in JCS (``100`` not ``100.0``), so they are converted;
- only dict, list, str, int, bool, float and None (subclasses and tuples go to the
  reference, which knows how it treats them).
"""

from __future__ import annotations

from typing import Any, Final

import orjson
import rfc8785

_INT_MAX: Final = 2**53 - 1
_SORTED: Final = orjson.OPT_SORT_KEYS

SAME, INTEGRAL_FLOATS, REFERENCE = 0, 1, 2
"""How a value can be encoded (`encoding_of`): by orjson as it is, by orjson once its
integral floats are integers, or only by the reference."""
_SAME, _INTEGRAL_FLOATS, _REFERENCE = SAME, INTEGRAL_FLOATS, REFERENCE
_INF: Final = float("inf")


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical JSON bytes of `value` (raises `rfc8785.CanonicalizationError`
    exactly when `rfc8785.dumps` does)."""
    return canonical_json_encoded(value, _check(value))


def canonical_json_encoded(value: Any, verdict: int) -> bytes:
    """`canonical_json(value)` when `verdict` is already known: `encoding_of(value)`,
    or what a walk that built `value` found (`domain.redaction.redact_document`)."""
    if verdict == _INTEGRAL_FLOATS:
        value = _integral_floats_as_ints(value)
    elif verdict == _REFERENCE:
        return rfc8785.dumps(value)
    try:
        return orjson.dumps(value, option=_SORTED)
    except (orjson.JSONEncodeError, ValueError, TypeError):
        return rfc8785.dumps(value)  # lone surrogates and the like: the reference decides


def encoding_of(value: Any) -> int:
    """How `value` can be encoded: `SAME`, `INTEGRAL_FLOATS` or `REFERENCE`."""
    return _check(value)


def key_encoding(key: Any) -> int:
    """How an object key can be encoded (`SAME` or `REFERENCE`)."""
    if type(key) is not str or (not key.isascii() and max(key, default="") > "\uffff"):
        return _REFERENCE
    return _SAME


def leaf_encoding(value: Any) -> int:
    """How a value that is neither an object nor an array can be encoded."""
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return _SAME
    if kind is int:
        return _SAME if -_INT_MAX <= value <= _INT_MAX else _REFERENCE
    if kind is float:
        return _float_verdict(value)
    return _REFERENCE


def _check(value: Any) -> int:
    """How `value` can be encoded: as is, after integral floats become ints, or only
    by the reference. Iterative, strings and None skipped inline: it visits every
    node of every audited event."""
    verdict = _SAME
    pending = [value]
    while pending:
        node = pending.pop()
        kind = type(node)
        if kind is dict:
            for key, item in node.items():
                if type(key) is not str or (not key.isascii() and max(key, default="") > "\uffff"):
                    return _REFERENCE
                if type(item) is not str and item is not None:
                    pending.append(item)
        elif kind is list:
            pending.extend(item for item in node if type(item) is not str and item is not None)
        elif kind is str or node is None or kind is bool:
            continue
        elif kind is int:
            if not -_INT_MAX <= node <= _INT_MAX:
                return _REFERENCE
        elif kind is float:
            found = _float_verdict(node)
            if found == _REFERENCE:
                return _REFERENCE
            verdict |= found
        else:
            return _REFERENCE
    return verdict


def _float_verdict(value: float) -> int:
    if value != value or value in (_INF, -_INF):
        return _REFERENCE
    if value.is_integer():
        return _INTEGRAL_FLOATS if abs(value) <= _INT_MAX else _REFERENCE
    return _SAME if "e" not in repr(value) else _REFERENCE


def _integral_floats_as_ints(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return {key: _integral_floats_as_ints(item) for key, item in value.items()}
    if kind is list:
        return [_integral_floats_as_ints(item) for item in value]
    if kind is float and value.is_integer():
        return int(value)
    return value
