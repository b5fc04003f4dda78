"""Pinned MCP tool definitions: what a server announces for a tool, its hash, a diff.

An MCP server announces each of its tools (`tools/list`): name, title, description,
input and output schema, annotations — text an agent reads and trusts. The server is
not the operator, so what it announces is held to the hash it had when first seen
(or when a person last approved one): `definition_hash` is `sha256:` + the hex sha256
of the RFC 8785 canonical JSON of the `announced_definition`, and `diff_definitions`
says what changed between two definitions, field by field.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.canonical_json import canonical_json
from domain.errors import DefinitionChanged, ExecutionError
from domain.integrity import sha256_ref

DEFINITION_FIELDS: tuple[str, ...] = ("name", "title", "description", "inputSchema",
                                      "outputSchema", "annotations")
"""The parts of an announced tool that are pinned (what reaches an agent)."""

MAX_DEFINITION_BYTES = 128 * 1024
"""Largest canonical definition pinned: it travels in registry events (twice in a
drift: the definition and the diff), which must stay under one Kafka record."""

MAX_DIFF_ENTRIES = 200

MAX_PENDING_DRIFTS = 20
"""Drifted definitions of one tool recorded while none is approved: a server that
announces a new definition on every start (or every listing) cannot fill the registry
topic, which is kept whole; past this its calls are still refused, unrecorded."""


@dataclass(frozen=True, slots=True)
class DefinitionPin:
    """The pinned definition of one MCP tool of one server, and the other hashes seen
    since (drifted, waiting for a person's approval)."""

    definition_hash: str
    definition: Mapping[str, Any]
    pin_event_id: str
    pending: frozenset[str] = frozenset()


def announced_definition(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The pinned fields of a tool as a server announced it (a `tools/list` entry in
    its JSON form); absent and null fields are left out.

    Raises ExecutionError (E3401) when the definition is not canonical JSON or is
    larger than MAX_DEFINITION_BYTES: a server announcing that is refused."""
    definition = {key: tool[key] for key in DEFINITION_FIELDS if tool.get(key) is not None}
    size = len(_canonical(definition))
    if size > MAX_DEFINITION_BYTES:
        raise ExecutionError(
            f"MCP tool {str(tool.get('name'))[:100]!r} announces a definition of {size} bytes; "
            f"at most {MAX_DEFINITION_BYTES} are pinned",
            details={"bytes": size, "limit": MAX_DEFINITION_BYTES})
    return definition


def definition_hash(definition: Mapping[str, Any]) -> str:
    """`sha256:` + hex sha256 of the definition's RFC 8785 canonical JSON."""
    return sha256_ref(_canonical(definition))


def _canonical(definition: Mapping[str, Any]) -> bytes:
    try:
        return canonical_json(dict(definition))
    except (ValueError, TypeError) as error:  # rfc8785 errors are ValueErrors
        raise ExecutionError(f"MCP tool definition is not canonical JSON: {error}",
                             details={"reason": str(error)[:200]}) from None


def diff_definitions(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What changed from `old` to `new`: one entry per changed leaf, in path order,
    `{"path": JSON Pointer, "change": "added"|"removed"|"changed", "old", "new"}`
    (objects are compared key by key, anything else as a whole value); at most
    MAX_DIFF_ENTRIES entries, the last one then `{"path": "", "change": "truncated"}`."""
    changes: list[dict[str, Any]] = []
    _diff("", old, new, changes)
    if len(changes) > MAX_DIFF_ENTRIES:
        changes = [*changes[:MAX_DIFF_ENTRIES - 1], {"path": "", "change": "truncated",
                                                     "old": None, "new": None}]
    return changes


def _diff(path: str, old: Any, new: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in sorted(set(old) | set(new)):
            child = f"{path}/{_escape(key)}"
            if key not in new:
                out.append({"path": child, "change": "removed", "old": old[key], "new": None})
            elif key not in old:
                out.append({"path": child, "change": "added", "old": None, "new": new[key]})
            else:
                _diff(child, old[key], new[key], out)
    elif canonical_json(old) != canonical_json(new):  # 1 == True in Python, not in JSON
        out.append({"path": path, "change": "changed", "old": old, "new": new})


def _escape(key: str) -> str:
    """A key as a JSON Pointer reference token (RFC 6901)."""
    return str(key).replace("~", "~0").replace("/", "~1")


def refusal(pin: DefinitionPin, announced: str, *, server_id: str,
            tool_name: str) -> DefinitionChanged:
    """The E3108 error refusing a call whose tool's announced definition is not the
    pinned one."""
    return DefinitionChanged(
        f"MCP tool {tool_name} of {server_id} announces definition {announced[:19]}..., "
        f"not the approved {pin.definition_hash[:19]}...; approve it with `toolexec "
        f"definitions approve {server_id} {announced}`",
        details={"server": server_id, "mcp_tool": tool_name, "announced": announced,
                 "approved": pin.definition_hash})


def lock_refusal(locked: str, announced: str, *, server_id: str,
                 tool_name: str) -> DefinitionChanged:
    """The E3108 error refusing a locked call whose tool's announced definition is not
    the one the lockfile pins (no approval lifts it: lock again)."""
    return DefinitionChanged(
        f"MCP tool {tool_name} of {server_id} announces definition {announced[:19]}..., "
        f"not the {locked[:19]}... the lockfile pins: lock it again once approved",
        details={"server": server_id, "mcp_tool": tool_name, "announced": announced,
                 "locked": locked})
