"""The registry as the domain sees it: a read-only view of published tool versions.

`RegistryView` is the port chain resolution and lockfile verification read through;
`InMemoryRegistry` is the plain implementation the registry projection wraps and unit
tests use. `revision` grows with every change, so caches keyed on it stay correct.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Protocol

from domain.errors import RequestError, ToolNotFound, VersionNotFound
from domain.model import LIFECYCLE_STATES, ToolVersion
from domain.semver import parse_version


class RegistryView(Protocol):
    """Read access to published tool versions."""

    def versions(self, tool_id: str) -> Sequence[ToolVersion]:
        """Every known version of `tool_id` (any lifecycle), ascending; empty if unknown."""
        ...

    def get(self, tool_id: str, version: str) -> ToolVersion | None:
        """The exact version, or None."""
        ...

    def tool_ids(self) -> Iterable[str]:
        """Every known tool id."""
        ...


class InMemoryRegistry:
    """A dictionary-backed RegistryView with the two writes the registry fold needs."""

    def __init__(self, versions: Iterable[ToolVersion] = ()) -> None:
        self._tools: dict[str, dict[str, ToolVersion]] = {}
        self._sorted: dict[str, tuple[ToolVersion, ...]] = {}
        self.revision = 0
        for tv in versions:
            self.add(tv)

    def add(self, tv: ToolVersion) -> None:
        """Add (or replace) one tool version."""
        self._tools.setdefault(tv.tool_id, {})[tv.version] = tv
        self._changed(tv.tool_id)

    def set_lifecycle(self, tool_id: str, version: str, state: str, *,
                      reason: str | None = None,
                      replacement_tool_id: str | None = None) -> ToolVersion:
        """Move a version to another lifecycle state (with why, and what to use
        instead); returns the updated version."""
        if state not in LIFECYCLE_STATES:
            raise RequestError(f"unknown lifecycle state {state!r}; expected one of "
                               f"{', '.join(LIFECYCLE_STATES)}", details={"state": state})
        current = self.get(tool_id, version)
        if current is None:
            if tool_id not in self._tools:
                raise ToolNotFound(f"tool {tool_id!r} not found", details={"tool_id": tool_id})
            raise VersionNotFound(f"{tool_id}@{version} not found",
                                  details={"tool_id": tool_id, "version": version,
                                           "available": list(self._tools[tool_id])})
        updated = replace(current, lifecycle=state, lifecycle_reason=reason,
                          replacement_tool_id=replacement_tool_id)
        self._tools[tool_id][version] = updated
        self._changed(tool_id)
        return updated

    def versions(self, tool_id: str) -> Sequence[ToolVersion]:
        """Every version of `tool_id`, ascending by semver."""
        return self._sorted.get(tool_id, ())

    def get(self, tool_id: str, version: str) -> ToolVersion | None:
        """The exact version, or None."""
        return self._tools.get(tool_id, {}).get(version)

    def tool_ids(self) -> Iterable[str]:
        """Every known tool id, sorted."""
        return sorted(self._tools)

    def _changed(self, tool_id: str) -> None:
        self._sorted[tool_id] = tuple(sorted(self._tools[tool_id].values(), key=_order))
        self.revision += 1


class Overlay:
    """A RegistryView of `base` plus versions not published yet (a batch being planned).
    Where both hold a version, the base's stays: the registry keeps the first."""

    def __init__(self, base: RegistryView) -> None:
        self._base = base
        self._added = InMemoryRegistry()

    def add(self, tv: ToolVersion) -> None:
        """Add one version unless the base (or an earlier add) already holds it."""
        if self.get(tv.tool_id, tv.version) is None:
            self._added.add(tv)

    def versions(self, tool_id: str) -> Sequence[ToolVersion]:
        added = self._added.versions(tool_id)
        if not added:
            return self._base.versions(tool_id)
        return tuple(sorted([*self._base.versions(tool_id), *added], key=_order))

    def get(self, tool_id: str, version: str) -> ToolVersion | None:
        return self._base.get(tool_id, version) or self._added.get(tool_id, version)

    def tool_ids(self) -> Iterable[str]:
        return sorted({*self._base.tool_ids(), *self._added.tool_ids()})


def _order(tv: ToolVersion) -> tuple[int, object, str]:
    parsed = parse_version(tv.version)
    return (0, parsed, tv.version) if parsed is not None else (1, None, tv.version)
