from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from domain.redaction import REDACTED, redact, redact_text


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
    cleaned, _ = redact_text("call 555-123-4567 now")
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
