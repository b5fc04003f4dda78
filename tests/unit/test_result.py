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


def test_plain_text_fails_unless_the_manifest_declares_text_output() -> None:
    with pytest.raises(ValidationFailed) as caught:
        finalise("hello world\n", None)
    assert caught.value.code == "E3303" and "output: {format: text}" in caught.value.message
    assert finalise("  hello world\n", None, output_format="text").value == "  hello world"


def test_text_output_is_validated_against_a_string_schema() -> None:
    with pytest.raises(ValidationFailed):
        finalise("", {"type": "string", "minLength": 1}, output_format="text")
    assert finalise("{not json", {"type": "string"}, output_format="text").value == "{not json"


@pytest.mark.parametrize("stdout", ["", "  \n", "NaN", '{"a": Infinity}', '"\\ud800"',
                                    '{"a": 1} {"b": 2}'])
def test_anything_but_one_strict_json_value_fails(stdout: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        finalise(stdout, None)
    assert caught.value.code == "E3303"


def test_null_is_a_result() -> None:
    assert finalise("null\n", None).value is None


def test_the_caller_gets_pii_unchanged_and_secrets_removed() -> None:
    stdout = ('{"count": 1, "email": "ada@example.com", "secret": "x", "size": "1073741824", '
              '"host": "127.0.0.1", "zeros": "0000000000000000", "echo": "key sk-live-42"}')
    result = finalise(stdout, SCHEMA, secrets=("sk-live-42",))
    assert result.value == {"count": 1, "email": "ada@example.com", "secret": "[REDACTED]",
                            "size": "1073741824", "host": "127.0.0.1",
                            "zeros": "0000000000000000", "echo": "key [REDACTED]"}
    assert result.redactions == 2
