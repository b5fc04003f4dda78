from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.redaction import (
    _INERT_SHAPES,
    _RULES,
    REDACTED,
    _apply_rules,
    _redact_text,
    _replace,
    redact,
    redact_secrets,
    redact_text,
    secret_parameter_values,
)


def test_sensitive_field_names_are_redacted_whole() -> None:
    out = redact({"user": "ada", "password": "hunter2", "API-Key": "k-123", "nested": {"token": "t"}})
    assert out.value == {"user": "ada", "password": REDACTED, "API-Key": REDACTED,
                         "nested": {"token": REDACTED}}
    assert out.count == 3


def test_pii_in_strings_is_replaced_by_labels() -> None:
    text = "mail ada@example.com, ssn 123-45-6789, card 4111 1111 1111 1111, ip 10.1.2.3"
    cleaned, count = redact_text(text)
    assert "ada@example.com" not in cleaned and "[EMAIL_REDACTED]" in cleaned
    assert "[SSN_REDACTED]" in cleaned
    assert "[CREDIT_CARD_REDACTED]" in cleaned
    assert "[IP_ADDRESS_REDACTED]" in cleaned
    assert count == 4


def test_phone_numbers_are_redacted() -> None:
    cleaned, _ = redact_text("call 415-555-2671 now")
    assert cleaned == "call [PHONE_REDACTED] now"


def test_literal_secret_values_are_scrubbed_anywhere() -> None:
    out = redact({"log": "connected with s3cr3t-value ok"}, secrets=("s3cr3t-value",))
    assert out.value == {"log": f"connected with {REDACTED} ok"}


def test_values_without_pii_are_unchanged() -> None:
    value = {"count": 3, "words": ["to", "be"], "ok": True, "none": None}
    assert redact(value).value == value
    assert redact(value).count == 0


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
                    max_leaves=20))
def test_redaction_is_idempotent(value: object) -> None:
    once = redact(value).value
    assert redact(once).value == once


@pytest.mark.parametrize("text", [
    "1073741824", "0000000000000000", "1234567890123456", "4155552671", "1700000000000",
    "999.1.2.3", "v 1.2.3.4.5", "10:00:00", "00:1a:2b:3c:4d:5e", "call 555-123-4567",
    "ssn 000-12-3456", "2026-11-25T09:34:30.123456+00:00", "std::vector",
    "123e4567-e89b-12d3-a456-426614174000", "page_token=abc123",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
])
def test_values_that_only_look_like_pii_are_left_alone(text: str) -> None:
    assert redact_text(text) == (text, 0)


@pytest.mark.parametrize(("text", "label"), [
    ("card 4111 1111 1111 1111", "CREDIT_CARD"), ("card 5500-0000-0000-0004", "CREDIT_CARD"),
    ("amex 378282246310005", "CREDIT_CARD"), ("call (415) 555-2671", "PHONE"),
    ("call +44 20 7946 0958", "PHONE"), ("call +14155552671", "PHONE"),
    ("host 127.0.0.1", "IP_ADDRESS"), ("host 2001:db8::ff00:42:8329", "IP_ADDRESS"),
    ("host ::ffff:192.0.2.1", "IP_ADDRESS"), ("ssn 123-45-6789", "SSN"),
    ("t eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhZGEifQ.c2ln", "JWT"),
])
def test_real_pii_is_recognised(text: str, label: str) -> None:
    cleaned, count = redact_text(text)
    assert f"[{label}_REDACTED]" in cleaned and count == 1


def test_a_jwt_inside_a_list_is_redacted() -> None:
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhZGEifQ.c2lnbmF0dXJl"
    out = redact({"headers": ["x-trace: 1", jwt], "tokens": [jwt]})
    assert jwt not in str(out.value) and out.count == 2


def test_secret_pairs_in_text_are_redacted() -> None:
    text = 'log {"password": "hun\\"ter2", "page": 2} api_key=sk-live-1&x=1 ' \
           "Authorization: Bearer abcdefgh12345678"
    cleaned, count = redact_text(text)
    assert "hun" not in cleaned and "sk-live-1" not in cleaned and "abcdefgh" not in cleaned
    assert '"page": 2' in cleaned and "&x=1" in cleaned and count == 3


def test_caller_level_redaction_leaves_pii_and_removes_secrets() -> None:
    value = {"email": "ada@example.com", "ip": "127.0.0.1", "api_key": "k", "log": "x s3cret!"}
    out = redact_secrets(value, secrets=("s3cret!",))
    assert out.value == {"email": "ada@example.com", "ip": "127.0.0.1", "api_key": REDACTED,
                         "log": f"x {REDACTED}"}


def test_secret_parameters_by_name_and_by_schema() -> None:
    schema = {"type": "object", "properties": {
        "db": {"type": "object", "properties": {"dsn": {"type": "string", "writeOnly": True}}},
        "pin": {"type": "string", "format": "password"},
        "note": {"type": "string"}}}
    params = {"db": {"dsn": "postgres://u:p@h/db"}, "pin": "8731", "note": "hello",
              "auth": {"password": "hunter2", "user": "ada"}, "tokens": ["tok-abcdef"],
              "short": {"secret": "ab"}}
    assert set(secret_parameter_values(schema, params)) == {
        "postgres://u:p@h/db", "8731", "hunter2", "tok-abcdef"}


def test_secret_parameters_also_in_the_form_json_writes_them() -> None:
    values = secret_parameter_values(None, {"password": 'pa"ss\\wörd'})
    assert {'pa"ss\\wörd', 'pa\\"ss\\\\w\\u00f6rd', 'pa\\"ss\\\\wörd'} <= set(values)


def _every_pattern(text: str) -> tuple[str, int]:
    """`redact_text` with no rule skipped by its hint (the hints' reference)."""
    counter = [0]
    for rule in _RULES:
        text = rule.pattern.sub(_replace(rule, counter), text)
    return text, counter[0]


@settings(max_examples=500, deadline=None)
@given(text=st.text("0123456789.-: ()+abcdefxyz@", max_size=40)
       | st.sampled_from(["123-45-6789", "10.0.0.1", "a 10.0.0.12.", "1.2.3", "::1",
                          "212-555-0199", "4111-1111-1111-1111", "0a1b.2c3d.4e5f"]))
def test_a_rule_skipped_by_its_hint_could_not_have_matched(text: str) -> None:
    assert _redact_text(text) == _every_pattern(text)


_RUN = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
_HEX = "0123456789abcdef"


@settings(max_examples=500, deadline=None)
@given(text=st.from_regex(_INERT_SHAPES, fullmatch=True)
       | st.text("0123456789-", min_size=38, max_size=80)
       | st.builds(lambda a, b: a + "x" + b, st.text("0123456789-", max_size=40),
                   st.text("0123456789-", max_size=40))
       | st.lists(st.text("0123456789", min_size=20, max_size=40), min_size=2, max_size=4)
       .map(".".join)
       | st.lists(st.text(_HEX, min_size=20, max_size=36), min_size=2, max_size=4).map(".".join)
       | st.text(_RUN, min_size=1, max_size=90).filter(_INERT_SHAPES.fullmatch))
def test_text_of_an_inert_shape_is_one_no_rule_changes(text: str) -> None:
    if _INERT_SHAPES.fullmatch(text) is None:  # the digit-only runs drawn above
        return
    assert _every_pattern(text) == (text, 0)
    assert _apply_rules(text) == (text, 0)


_INERT_SHAPES_PLAINLY = re.compile(
    r"[A-Za-z0-9_-]*[A-Za-z_][A-Za-z0-9_-]*|[A-Za-z0-9_-]{38,}"
    r"|[0-9a-f]{20,}(?:\.[0-9a-f]{20,})+")
"""`_INERT_SHAPES` as first written (backtracking): the possessive spelling must
accept exactly the same text."""


@settings(max_examples=1000, deadline=None)
@given(text=st.from_regex(_INERT_SHAPES_PLAINLY, fullmatch=True)
       | st.text(_RUN + ".:@ é", max_size=60) | st.text(_HEX + ".", max_size=90)
       | st.text("0123456789-", max_size=45))
def test_the_inert_shapes_are_those_of_the_plain_pattern(text: str) -> None:
    assert (_INERT_SHAPES.fullmatch(text) is None) == (
        _INERT_SHAPES_PLAINLY.fullmatch(text) is None)


@pytest.mark.parametrize("text", [
    "4111111111111111", "123-45-6789", "415-555-2671", "4111-1111-1111-1111",
    "4111111111111111.abcdef0123456789abcd", "10.0.0.1", "a@b.co", "x 10.0.0.1"])
def test_what_a_rule_changes_is_of_no_inert_shape(text: str) -> None:
    assert _INERT_SHAPES.fullmatch(text) is None
    assert _redact_text(text) == _every_pattern(text) != (text, 0)
