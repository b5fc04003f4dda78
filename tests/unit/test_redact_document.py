"""`redact_document`: one walk gives `redact`'s value and count and the encoding that
`canonical_json`'s own check finds in the redacted value, so the audit trail may
encode with it and skip the second walk."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.envelope import new_envelope
from contracts.events import InvokeRequested
from domain import redaction
from domain.canonical_json import (
    INTEGRAL_FLOATS,
    REFERENCE,
    SAME,
    canonical_json,
    canonical_json_encoded,
    encoding_of,
)
from domain.redaction import redact, redact_document
from projections.audit_document import audit_document, audit_values

_texts = st.sampled_from(["", "hi", "bob@example.com", "4111 1111 1111 1111", "10.0.0.1",
                          "password=hunter22", "call +44 20 7946 0958", "Bearer abcdefgh1",
                          "ключ", "\U0001d11e clef", "123-45-6789"]) | st.text(max_size=12)
_keys = st.sampled_from(["password", "api_key", "token", "note", "ключ", "\U0001d11e", "id",
                         "Authorization", "items"]) | st.text(max_size=6)
_scalars = (st.none() | st.booleans() | st.integers(-(2**60), 2**60)
            | st.floats(allow_nan=True, allow_infinity=True) | _texts)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(_keys, inner, max_size=4), max_leaves=25)


def _encoded(value: Any, encoding: int | None) -> bytes | type[Exception]:
    try:
        return canonical_json(value) if encoding is None else canonical_json_encoded(value,
                                                                                      encoding)
    except rfc8785.CanonicalizationError as error:
        return type(error)


@settings(max_examples=500, deadline=None)
@given(_values)
def test_one_walk_redacts_as_redact_and_finds_the_canonical_check_s_encoding(
        value: Any) -> None:
    reference = redact(value)
    redacted, count, encoding = redact_document(value)
    assert (redacted, count) == (reference.value, reference.count)
    assert encoding == encoding_of(reference.value)
    assert _encoded(redacted, encoding) == _encoded(reference.value, None)


def test_each_encoding_is_found() -> None:
    assert redact_document({"a": "x", "n": 3, "f": 2.5})[2] == SAME
    assert redact_document({"a": [1.0, {"b": 2}]})[2] == INTEGRAL_FLOATS
    assert redact_document({"a": 1.0, "b": 2**60})[2] == REFERENCE
    assert redact_document({"\U0001d11e": "x"})[2] == REFERENCE
    assert redact_document([1e-7])[2] == REFERENCE
    assert redact_document({"t": ("a", "b")})[2] == REFERENCE
    assert redact_document({1: "x"})[2] == REFERENCE


def test_subclasses_of_dict_and_list_come_out_plain_and_encodable() -> None:
    class Mapping(dict):  # type: ignore[type-arg]
        pass

    class Items(list):  # type: ignore[type-arg]
        pass

    redacted, count, encoding = redact_document(Mapping(a=Items(["x", Mapping(password="p")])))
    assert (redacted, count, encoding) == ({"a": ["x", {"password": "[REDACTED]"}]}, 1, SAME)
    assert type(redacted) is dict and type(redacted["a"]) is list


_EXTENSION_DATA = InvokeRequested(invocation_id="inv-1", tool_id="t", parameters={})


@settings(max_examples=200, deadline=None)
@given(extensions=st.dictionaries(
    st.sampled_from(["token", "apikey", "password", "sig", "sigset", "note", "traceparent"]),
    _texts | st.text("0123456789abcdef.-", max_size=40), max_size=4))
def test_text_extensions_are_redacted_in_the_audit_document_as_redact_would(
        extensions: dict[str, str]) -> None:
    env = new_envelope(_EXTENSION_DATA, source="urn:t", partitionkey="k", correlationid="k",
                       time=datetime(2026, 1, 1, tzinfo=UTC), id="e-1",
                       extensions=extensions)
    document, count = audit_document(env)
    expected = 0
    for name, value in extensions.items():
        if name == "traceparent":
            assert document[name] == value
            continue
        kept = redact({name: value})
        assert document[name] == kept.value[name]
        expected += kept.count
    assert count == expected + audit_document(replace(env, extensions={}))[1]


_hostile = (_texts | st.from_regex(r"[0-9a-f]{20,40}(\.[0-9a-f]{20,40}){0,3}", fullmatch=True)
            | st.from_regex(r"[A-Za-z0-9_-]{1,90}", fullmatch=True)
            | st.text("0123456789-. +@:=eyJ", max_size=45))


@settings(max_examples=100, deadline=None)
@given(parameters=st.dictionaries(_keys, _hostile | _values, max_size=5),
       extensions=st.dictionaries(st.sampled_from(["sig", "sigset", "sigkid", "note", "token"]),
                                  _hostile, max_size=4),
       subject=st.none() | _hostile.filter(bool))
def test_the_audit_row_is_the_same_with_every_rule_run_over_every_text(
        parameters: dict[str, Any], extensions: dict[str, str], subject: str | None) -> None:
    """The shortcut for text of an inert shape changes no audit row: the rows of
    hostile events equal those made with the shortcut off (every rule run)."""
    env = new_envelope(InvokeRequested(invocation_id="inv-1", tool_id="t",
                                       parameters=parameters),
                       source="urn:t", partitionkey="k", correlationid="k", subject=subject,
                       time=datetime(2026, 1, 1, tzinfo=UTC), id="e-1", extensions=extensions)
    place = {"topic": "t", "partition": 0, "offset": 7, "prev_hash": "0" * 64}
    redaction._redact_short_text.cache_clear()
    fast = audit_values(env, **place)
    shortcut = redaction._INERT_SHAPES
    redaction._INERT_SHAPES = re.compile(r"(?!)")  # matches nothing: every rule runs
    try:
        redaction._redact_short_text.cache_clear()
        full = audit_values(env, **place)
    finally:
        redaction._INERT_SHAPES = shortcut
        redaction._redact_short_text.cache_clear()
    assert fast == full
