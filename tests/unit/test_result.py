from __future__ import annotations

import pytest

from domain.errors import ValidationFailed
from domain.result import finalise

SCHEMA = {
    "type": "object",
    "properties": {"count": {"type": "integer"}, "ratio": {"type": "number"},
                   "ok": {"type": "boolean"}},
    "required": ["count"],
}


def test_json_result_matching_schema_is_returned() -> None:
    result = finalise('{"count": 3}', SCHEMA)
    assert result.value == {"count": 3}
    assert result.coerced is False


def test_string_scalars_are_coerced_to_schema_types() -> None:
    result = finalise('{"count": "3", "ratio": "0.5", "ok": "yes"}', SCHEMA)
    assert result.value == {"count": 3, "ratio": 0.5, "ok": True}
    assert result.coerced is True


def test_result_violating_schema_fails_with_every_issue() -> None:
    with pytest.raises(ValidationFailed) as caught:
        finalise('{"ratio": "x", "ok": []}', SCHEMA)
    assert caught.value.code == "E3303"
    assert len(caught.value.details["issues"]) == 3


def test_non_json_output_with_schema_fails() -> None:
    with pytest.raises(ValidationFailed) as caught:
        finalise("hello", SCHEMA)
    assert caught.value.code == "E3303"


def test_plain_text_is_accepted_without_schema() -> None:
    assert finalise("hello world\n", None).value == "hello world"


def test_result_is_redacted() -> None:
    result = finalise('{"count": 1, "email": "ada@example.com", "secret": "x"}', SCHEMA)
    assert result.value["email"] == "[EMAIL_REDACTED]"
    assert result.value["secret"] == "[REDACTED]"
    assert result.redactions == 2
