"""Tool lifecycle: deciding a lifecycle change, and what resolution says about one.

A version is `active`, `deprecated` or `sunset` (both still resolve, with a warning),
or `removed` (never resolves; asking for it fails with E3104). `decide_lifecycle_change`
checks a requested change against what the registry knows and returns the change to
record; it is the rule both the CLI and the HTTP gateway apply before emitting
`tool.lifecycle.changed`. Deprecating every version leaves removed ones removed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from domain.errors import RequestError, ToolNotFound, VersionNotFound, VersionRemoved
from domain.model import LIFECYCLE_STATES, ToolVersion


@dataclass(frozen=True, slots=True)
class LifecycleChange:
    """One requested lifecycle change; `version` None means every version of the tool."""

    tool_id: str
    version: str | None
    state: str
    reason: str | None = None
    replacement_tool_id: str | None = None


def decide_lifecycle_change(
    change: LifecycleChange,
    known_versions: Mapping[str, str] | None,
    known_tools: Sequence[str] | frozenset[str] = frozenset(),
) -> tuple[LifecycleChange, ...]:
    """Check `change` against the registry; the changes to record.

    A change of every version (`version` None) to deprecated or sunset becomes one
    change per version not removed when some are (a removed version stays removed).
    `known_versions` is version -> current lifecycle of `change.tool_id` (None when the
    tool is unknown); `known_tools` are the tool ids a replacement may name. Raises
    RequestError (E3004: unknown state, removal without a version, a tool replacing
    itself), ToolNotFound (E3101: the tool or its replacement), VersionNotFound
    (E3102, with the available versions) or VersionRemoved (E3104: deprecating a tool
    whose versions were all removed).
    """
    if change.state not in LIFECYCLE_STATES:
        raise RequestError(f"unknown lifecycle state {change.state!r}; expected one of "
                           f"{', '.join(LIFECYCLE_STATES)}", details={"state": change.state})
    if change.state == "removed" and change.version is None:
        raise RequestError(f"removing {change.tool_id} needs an exact version (TOOL@VERSION)",
                           details={"tool_id": change.tool_id})
    if known_versions is None:
        raise ToolNotFound(f"tool {change.tool_id!r} not found",
                           details={"tool_id": change.tool_id})
    if change.version is not None and change.version not in known_versions:
        raise VersionNotFound(
            f"{change.tool_id} has no version {change.version}; available: "
            f"{', '.join(known_versions) or 'none'}",
            details={"tool_id": change.tool_id, "version": change.version,
                     "available": list(known_versions)})
    _check_replacement(change, known_tools)
    return _per_version(change, known_versions)


def _per_version(change: LifecycleChange,
                 known_versions: Mapping[str, str]) -> tuple[LifecycleChange, ...]:
    removed = [v for v, state in known_versions.items() if state == "removed"]
    if change.version is not None or change.state == "active" or not removed:
        return (change,)
    kept = [v for v in known_versions if v not in removed]
    if not kept:
        raise VersionRemoved(f"every version of {change.tool_id} was removed",
                             details={"tool_id": change.tool_id, "removed": removed})
    return tuple(replace(change, version=v) for v in kept)


def _check_replacement(change: LifecycleChange, known_tools: Sequence[str] | frozenset[str]) -> None:
    replacement = change.replacement_tool_id
    if replacement is None:
        return
    replacement_id = replacement.partition("@")[0].strip()
    if replacement_id == change.tool_id and change.version is None:
        raise RequestError(f"{change.tool_id} cannot replace itself",
                           details={"tool_id": change.tool_id, "replacement_tool_id": replacement})
    if replacement_id not in known_tools:
        raise ToolNotFound(f"replacement tool {replacement_id!r} not found",
                           details={"tool_id": replacement_id, "replacement_for": change.tool_id})


def lifecycle_warning(tv: ToolVersion) -> str:
    """What resolution tells the caller about a deprecated or sunset version."""
    message = f"{tv.tool_id}@{tv.version} is {tv.lifecycle}"
    if tv.lifecycle_reason:
        message += f": {tv.lifecycle_reason}"
    replacement = tv.replacement_tool_id or tv.manifest.get("replacement_tool_id")
    if replacement:
        message += f"; use {replacement} instead"
    sunset = tv.manifest.get("sunset_date")
    if sunset:
        message += f" (sunset date {sunset})"
    return message


def removed_error(tool_id: str, wanted: str, removed: Sequence[ToolVersion],
                  available: Sequence[str], *, pinned: bool) -> VersionRemoved:
    """E3104 for a request whose only matching versions were removed."""
    last = removed[-1]
    replacement = last.replacement_tool_id or last.manifest.get("replacement_tool_id")
    message = (f"{tool_id}@{wanted} was removed" if pinned else
               f"every version of {tool_id} satisfying {wanted!r} was removed "
               f"({', '.join(tv.version for tv in removed)})")
    if last.lifecycle_reason:
        message += f": {last.lifecycle_reason}"
    if replacement:
        message += f"; use {replacement} instead"
    details: dict[str, object] = {"tool_id": tool_id, "pinned" if pinned else "range": wanted,
                                  "removed": [tv.version for tv in removed],
                                  "available": list(available)}
    if replacement:
        details["replacement_tool_id"] = str(replacement)
    if last.lifecycle_reason:
        details["reason"] = last.lifecycle_reason
    return VersionRemoved(message, details=details)
