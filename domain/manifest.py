"""One manifest format for every tool type, and its normalisation.

`MANIFEST_SCHEMA` (JSON Schema Draft 2020-12) describes a *normalised* manifest: the
fields of the specification's Appendix C (with name, description, provider and protocol
optional, since tools here are data) plus the fields of the tool model: `tool_type`,
`executor`, `config`, `manifest` (script details), `validation.child_schemas`,
`idempotent`, `lifecycle_state` and `output` (`{format: json|text}`: what the tool
prints on stdout). Unknown top-level fields are tolerated.

`normalise_manifest` turns what authors write (legacy `executor_id`, the list form of
`parameters`, numeric versions, YAML dates) into that shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any

from domain.model import LIFECYCLE_STATES, TOOL_TYPES

TOOL_ID_PATTERN = "^[a-z][a-z0-9_]*$"
# An executor reference is a tool_id, optionally with a semver range: python_runtime@^1.0
EXECUTOR_PATTERN = "^[a-z][a-z0-9_]*(@.+)?$"
VERSION_PATTERN = r"^\d+\.\d+\.\d+(-[a-z0-9.]+)?(\+[a-z0-9.]+)?$"
# Appendix C says format "hostname"; a pattern keeps wildcards (*.example.com) and
# IPv4 literals valid and does not depend on optional format-checker packages.
DOMAIN_PATTERN = r"^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$"
METASCHEMA = "https://json-schema.org/draft/2020-12/schema"

_JSON_SCHEMA_OBJECT: dict[str, Any] = {"type": "object", "$ref": METASCHEMA}


def _int(minimum: int, maximum: int, **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "maximum": maximum, **extra}


_RETRY_POLICY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "max_attempts": _int(1, 10, default=3),
        "backoff_multiplier": {"type": "number", "minimum": 1.0, "maximum": 10.0, "default": 2.0},
        "backoff_max_seconds": _int(1, 300, default=60),
        "retry_on_status_codes": {
            "type": "array",
            "items": _int(400, 599),
            "default": [429, 500, 502, 503, 504],
        },
    },
}

_CIRCUIT_BREAKER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "failure_threshold": _int(1, 100, default=5),
        "success_threshold": _int(1, 100, default=3),
        "timeout_seconds": _int(1, 3600, default=60),
        "half_open_max_calls": _int(1, 100, default=10),
    },
}

_RESOURCE_LIMITS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "cpu": {"type": "string", "pattern": r"^\d+m?$", "default": "1"},
        "memory": {"type": "string", "pattern": r"^\d+(Mi|Gi)$", "default": "512Mi"},
        "ephemeral_storage": {"type": "string", "pattern": r"^\d+(Mi|Gi)$", "default": "1Gi"},
    },
}

_NETWORK_POLICY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "allowed_domains": {"type": "array", "items": {"type": "string", "pattern": DOMAIN_PATTERN}},
        "allowed_ports": {"type": "array", "items": _int(1, 65535), "default": [80, 443]},
        "deny_all_egress": {"type": "boolean", "default": False},
    },
}

_CHECKPOINT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "enabled": {"type": "boolean", "default": False},
        "micro_interval_seconds": _int(10, 300, default=30),
        "macro_events": {"type": "array", "items": {"type": "string"}},
    },
}

_SCRIPT_DETAILS: dict[str, Any] = {
    "type": "object",
    "description": "Script details read by runtimes' child schemas (language, entrypoint, requires).",
    "properties": {
        "language": {"type": "string"},
        "entrypoint": {"type": "string", "minLength": 1},
        "requires": {"type": "array", "items": {"type": "string"}},
    },
}

_OUTPUT: dict[str, Any] = {
    "type": "object",
    "description": "What the tool prints on stdout: one JSON value (format json, the "
    "default), or text that is the result as it is (format text).",
    "properties": {"format": {"type": "string", "enum": ["json", "text"], "default": "json"}},
    "additionalProperties": False,
}

_VALIDATION: dict[str, Any] = {
    "type": "object",
    "properties": {
        "child_schemas": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["match", "schema"],
                "properties": {"match": {"type": "object"}, "schema": _JSON_SCHEMA_OBJECT},
            },
        },
    },
}

MANIFEST_SCHEMA: dict[str, Any] = {
    "$schema": METASCHEMA,
    "$id": "https://toolexec.local/schemas/tool-manifest.schema.json",
    "title": "Tool Manifest",
    "description": "A normalised toolexec tool manifest (any tool type).",
    "type": "object",
    "required": ["tool_id", "version", "tool_type"],
    "properties": {
        "tool_id": {"type": "string", "pattern": TOOL_ID_PATTERN, "minLength": 3, "maxLength": 255},
        "version": {"type": "string", "pattern": VERSION_PATTERN},
        "tool_type": {"type": "string", "enum": list(TOOL_TYPES)},
        "executor": {
            "description": "tool_id (optionally @range) of the parent tool; "
            "null for primitives and knowledge.",
            "type": ["string", "null"],
            "pattern": EXECUTOR_PATTERN,
        },
        "name": {"type": "string", "minLength": 3, "maxLength": 255},
        "description": {"type": "string", "minLength": 10, "maxLength": 2000},
        "provider": {"type": "string"},
        "protocol": {"type": "string", "enum": ["native", "mcp", "openapi", "langchain", "custom"]},
        "category": {"type": "string"},
        "config": {"type": "object"},
        "manifest": _SCRIPT_DETAILS,
        "validation": _VALIDATION,
        "idempotent": {"type": "boolean"},
        "approval": {
            "type": "object",
            "description": "Whether every call needs an approver's yes (it can only add "
            "to what the operator's policies require).",
            "properties": {"required": {"type": "boolean", "default": False}},
            "additionalProperties": False,
        },
        "parameters": _JSON_SCHEMA_OBJECT,
        "result_schema": _JSON_SCHEMA_OBJECT,
        "output": _OUTPUT,
        "required_permissions": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[a-z_]+:[^ ]+$"},
        },
        "timeout_default": _int(1, 7200, default=30),
        "timeout_max": _int(1, 86400),
        "retry_policy": _RETRY_POLICY,
        "circuit_breaker_config": _CIRCUIT_BREAKER,
        "resource_limits": _RESOURCE_LIMITS,
        "network_policy": _NETWORK_POLICY,
        "external_service": {"type": "string"},
        "checkpoint_config": _CHECKPOINT,
        "lifecycle_state": {"type": "string", "enum": list(LIFECYCLE_STATES), "default": "active"},
        "deprecation_date": {"type": "string", "format": "date"},
        "sunset_date": {"type": "string", "format": "date"},
        "migration_guide_url": {"type": "string", "format": "uri"},
        "replacement_tool_id": {"type": "string"},
        "priority": _int(1, 10, default=5),
        "tags": {"type": "array", "items": {"type": "string"}},
        "changelog": {"type": "string"},
        "breaking_changes": {"type": "boolean", "default": False},
        "documentation_url": {"type": "string", "format": "uri"},
        "source_code_url": {"type": "string", "format": "uri"},
        "license": {"type": "string"},
        "author": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "email": {"type": "string", "format": "email"},
                "url": {"type": "string", "format": "uri"},
            },
        },
    },
}

_PARAMETER_RESERVED = ("name", "required")


def normalise_manifest(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Return a new manifest dict in the shape `MANIFEST_SCHEMA` describes.

    - `executor_id` (legacy) becomes `executor`; when both are given and differ, both
      are kept so validation can report the conflict.
    - `parameters` in list form (`[{name, type, required, description?, default?,
      enum?}]`) becomes a JSON Schema object with `additionalProperties: false`;
      missing parameters become `{"type": "object"}`. A list that cannot be converted
      is kept as is, for validation to report.
    - `version` is coerced to a string; YAML dates become ISO strings.
    The input is never modified.
    """
    manifest: dict[str, Any] = _plain(raw)
    _move_executor_alias(manifest)
    if manifest.get("parameters") is None:
        manifest["parameters"] = {"type": "object"}
    else:
        manifest["parameters"] = parameters_from_list(manifest["parameters"])
    if "version" in manifest and manifest["version"] is not None:
        manifest["version"] = str(manifest["version"])
    return manifest


def parameters_from_list(parameters: Any) -> Any:
    """Convert the list form of parameters into a JSON Schema object; anything else
    (already a schema, or a list with malformed entries) is returned unchanged."""
    if not isinstance(parameters, list) or not all(_is_parameter_entry(p) for p in parameters):
        return parameters
    properties: dict[str, Any] = {}
    required: list[str] = []
    for entry in parameters:
        properties[entry["name"]] = {k: v for k, v in entry.items() if k not in _PARAMETER_RESERVED}
        if entry.get("required") is True:
            required.append(entry["name"])
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _is_parameter_entry(entry: Any) -> bool:
    return isinstance(entry, Mapping) and isinstance(entry.get("name"), str) and bool(entry["name"])


def _move_executor_alias(manifest: dict[str, Any]) -> None:
    if "executor_id" not in manifest:
        return
    if "executor" not in manifest:
        manifest["executor"] = manifest.pop("executor_id")
    elif manifest["executor"] == manifest["executor_id"]:
        del manifest["executor_id"]


def _plain(value: Any) -> Any:
    """A deep copy made of plain JSON-like containers (dict, list), dates as ISO text."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray):
        return [_plain(v) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value


def split_frontmatter(text: str) -> tuple[str | None, str]:
    """Split a markdown text into (YAML frontmatter, body).

    Frontmatter is the block between a first line `---` and the next line `---` (or
    `...`). Returns `(None, text)` when the text has no complete frontmatter block.
    """
    lines = text.lstrip("\ufeff").splitlines(keepends=True)
    if not lines or lines[0].rstrip() != "---":
        return None, text
    for index, line in enumerate(lines[1:], start=1):
        if line.rstrip() in ("---", "..."):
            return "".join(lines[1:index]), "".join(lines[index + 1 :])
    return None, text
