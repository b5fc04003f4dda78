"""Finalising a tool's output: parse, coerce to the result schema, validate, redact.

Tool process protocol: one JSON value on stdout (strict JSON: no NaN, Infinity or
lone surrogates), or any text when the manifest declares `output: {format: text}`
(the result is then that text, as a JSON string). Anything else fails with E3303.

What the caller receives is the tool's result, validated and coerced, with secrets
removed (values under secret field names, and the run's secret values) — and
nothing else changed: PII is redacted where others read (audit trail, logs), never
in the caller's own result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jsonschema import Draft202012Validator

from domain.errors import ValidationFailed
from domain.redaction import redact_secrets
from domain.request_limits import PayloadRejected, strict_json_loads
from domain.schema_cache import validator_for

OUTPUT_FORMATS: tuple[str, ...] = ("json", "text")
"""`output.format` of a manifest: what the tool prints on stdout."""


@dataclass(frozen=True, slots=True)
class FinalResult:
    value: Any
    coerced: bool
    redactions: int


def output_format(manifest: Mapping[str, Any]) -> str:
    """The manifest's `output.format` ("json" unless it declares "text")."""
    output = manifest.get("output")
    declared = output.get("format") if isinstance(output, Mapping) else None
    return declared if declared in OUTPUT_FORMATS else "json"


def parse_output(stdout: str, *, output_format: str = "json") -> Any:
    """The result a tool printed. "json": stdout must hold one strict JSON value
    (E3303 otherwise, empty output included); "text": stdout is the result, as a
    string, without its trailing line breaks."""
    if output_format == "text":
        return stdout.rstrip("\r\n")
    text = stdout.strip()
    if not text:
        raise ValidationFailed("tool printed no result on stdout (print one JSON value, "
                               "e.g. null, or declare output: {format: text})", code="E3303")
    try:
        return strict_json_loads(text)
    except PayloadRejected as exc:
        raise ValidationFailed(
            "tool output is not one JSON value (declare output: {format: text} in the "
            f"manifest for a text result): {exc.message}",
            code="E3303",
            details={"reason": exc.details.get("reason"), "output_format": "json"},
        ) from exc


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
    output_format: str = "json",
) -> FinalResult:
    """Parse (per `output_format`), coerce, validate (E3303 listing every violation)
    and remove secrets from a result (`redact_secrets`: no PII redaction)."""
    value = parse_output(stdout, output_format=output_format)
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
    redacted = redact_secrets(value, secrets=secrets)
    return FinalResult(redacted.value, coerced, redacted.count)
