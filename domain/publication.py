"""Planning a publication: which offered tool versions become new registry versions,
which are already published, and which are refused.

Versions are immutable: a version already in the registry with the same integrity is
`unchanged` (publishing it again is a no-op), with another integrity a `conflict`
(E3103; the registry keeps the first). Every new version is pinned to its executor
(`domain.chain.pin_executor`): the highest active version satisfying its executor
reference among the registry and the versions of the same batch accepted before it.
Versions are planned executors first, so a runtime and the tools on it can be
published together. A version whose executor cannot be found is `unresolvable`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from domain.chain import pin_executor
from domain.errors import RegistryError, ToolexecError, VersionConflict
from domain.model import ToolVersion
from domain.registry import Overlay, RegistryView
from domain.validation import executor_name

Outcome = Literal["new", "unchanged", "conflict", "unresolvable"]


@dataclass(frozen=True, slots=True)
class Planned:
    """What publishing one offered version does. `version` is the pinned new version
    (`new`), the registry's version (`unchanged`) or the offered one (refused)."""

    version: ToolVersion
    outcome: Outcome
    error: ToolexecError | None = None


def plan_publication(offered: Sequence[ToolVersion], registry: RegistryView) -> list[Planned]:
    """Plan every offered version against `registry`; the plans in offered order."""
    overlay = Overlay(registry)
    plans: dict[int, Planned] = {}
    for index in _executors_first(offered):
        tv = offered[index]
        existing = overlay.get(tv.tool_id, tv.version)
        if existing is not None:
            plans[index] = _against_existing(tv, existing)
            continue
        try:
            pinned = replace(tv, executor_pin=pin_executor(overlay, tv))
        except RegistryError as error:
            plans[index] = Planned(tv, "unresolvable", error)
            continue
        overlay.add(pinned)
        plans[index] = Planned(pinned, "new")
    return [plans[index] for index in range(len(offered))]


def _against_existing(offered: ToolVersion, existing: ToolVersion) -> Planned:
    if existing.integrity == offered.integrity:
        return Planned(existing, "unchanged")
    ref = f"{offered.tool_id}@{offered.version}"
    return Planned(offered, "conflict", VersionConflict(
        f"{ref} is already published with integrity {existing.integrity[:19]}; a published "
        "version never changes: publish these contents as a new version",
        details={"tool_id": offered.tool_id, "version": offered.version,
                 "published_integrity": existing.integrity,
                 "offered_integrity": offered.integrity}))


def _executors_first(offered: Sequence[ToolVersion]) -> list[int]:
    """Indexes of `offered`, each version after the offered versions of its executor
    (stable otherwise; versions in an executor cycle keep their order, last)."""
    pending = list(range(len(offered)))
    order: list[int] = []
    while pending:
        waiting_ids = {offered[i].tool_id for i in pending}
        ready = [i for i in pending
                 if (executor_name(offered[i].executor) or "") not in waiting_ids
                 or executor_name(offered[i].executor) == offered[i].tool_id]
        if not ready:  # a cycle: resolution will say so
            order.extend(pending)
            break
        order.extend(ready)
        pending = [i for i in pending if i not in ready]
    return order
