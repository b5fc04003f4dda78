"""Finalising a tool's output: parse, coerce to the result schema, validate, redact.

Tool process protocol: one JSON value on stdout. Plain text is accepted when the
manifest declares no `result_schema`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jsonschema import Draft202012Validator

from domain.errors import ValidationFailed
from domain.redaction import redact
from domain.schema_cache import validator_for


@dataclass(frozen=True, slots=True)
class FinalResult:
    value: Any
    coerced: bool
    redactions: int


def parse_output(stdout: str, *, has_schema: bool) -> Any:
    """Decode stdout as JSON; plain text is returned as a string when no schema is
    declared. Raises E3303 when a schema is declared and stdout is not JSON."""
    text = stdout.strip()
    if not text:
        if has_schema:
            raise ValidationFailed("tool printed no result on stdout", code="E3303")
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        if has_schema:
            raise ValidationFailed(
                "tool output is not JSON but the manifest declares a result_schema",
                code="E3303",
                details={"position": exc.pos if hasattr(exc, "pos") else None},
            ) from exc
        return text


def coerce(value: Any, schema: Mapping[str, Any]) -> Any:
    """Coerce strings from tools (and LLMs) toward the schema's scalar types."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if isinstance(value, str):
        return _coerce_string(value, kind, schema)
    if kind == "object" and isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: coerce(v, props[k]) if k in props else v for k, v in value.items()}
    if kind == "array" and isinstance(value, list):
        items = schema.get("items", {})
        return [coerce(item, items) for item in value] if isinstance(items, dict) else value
    if kind == "number" and isinstance(value, int) and not isinstance(value, bool):
        return value
    return value


def _coerce_string(value: str, kind: Any, schema: Mapping[str, Any]) -> Any:
    try:
        if kind == "integer":
            return int(value.strip())
        if kind == "number":
            number = float(value.strip())
            return int(number) if number.is_integer() and "." not in value else number
        if kind == "boolean":
            lowered = value.strip().lower()
            if lowered in ("true", "1", "yes"):
                return True
            if lowered in ("false", "0", "no"):
                return False
        if kind == "string" and schema.get("format") == "date-time":
            datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    return value


def result_issues(value: Any, schema: Mapping[str, Any]) -> list[dict[str, str]]:
    """Every violation of `schema` by `value`, with JSON paths."""
    validator: Draft202012Validator = validator_for(schema)
    return [
        {"path": error.json_path, "message": error.message}
        for error in sorted(validator.iter_errors(value), key=lambda e: e.json_path)
    ]


def finalise(
    stdout: str,
    result_schema: Mapping[str, Any] | None,
    *,
    secrets: tuple[str, ...] = (),
) -> FinalResult:
    """Parse, coerce, validate (E3303 listing every violation) and redact a result."""
    value = parse_output(stdout, has_schema=bool(result_schema))
    coerced = False
    if result_schema:
        new_value = coerce(value, result_schema)
        coerced = new_value != value
        value = new_value
        issues = result_issues(value, result_schema)
        if issues:
            raise ValidationFailed(
                f"result violates result_schema ({len(issues)} issue(s))",
                code="E3303",
                details={"issues": issues},
            )
    redacted = redact(value, secrets=secrets)
    return FinalResult(redacted.value, coerced, redacted.count)
