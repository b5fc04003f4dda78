"""Chain resolution: from a requested tool and range to [leaf, ..., primitive].

The leaf is the highest version satisfying the range; each link then names its parent
in `manifest.executor`, as `"name"` or `"name@range"`. A link published with an
executor pin runs on exactly that version, whose integrity must still be the pinned
one: a later executor version never changes an existing tool (`pin_executor` fixes
the pin at publish time: the highest active version in range then). A link without a
pin (published before pins existed) takes the highest active version in range now.
Versions in state `removed` never resolve (E3104 when only removed versions match);
`deprecated` and `sunset` ones do, with a warning. Pins (tool_id -> exact version,
from a lockfile) override every range, and must agree with executor pins.

`resolve_chain` is a pure function of the registry view; `ChainCache` memoises it on
an explicit registry revision.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from domain.errors import (
    ChainInvalid,
    IntegrityMismatch,
    RequestError,
    ToolNotFound,
    VersionNotFound,
)
from domain.lifecycle import lifecycle_warning, removed_error
from domain.model import MAX_CHAIN_DEPTH, PRIMITIVES, ExecutorPin, ResolvedChain, ToolVersion
from domain.registry import RegistryView
from domain.semver import ANY_RANGE, parse_range, select_highest

_WARN_STATES = ("deprecated", "sunset")


def resolve_chain(
    registry: RegistryView,
    tool_id: str,
    version_range: str = ANY_RANGE,
    *,
    pins: Mapping[str, str] | None = None,
) -> ResolvedChain:
    """Resolve `tool_id@version_range` and its executors down to a primitive.

    Raises ToolNotFound (E3101), VersionNotFound (E3102), VersionRemoved (E3104: only
    removed versions match, or a pinned executor was removed), IntegrityMismatch (E3105:
    a pinned executor's integrity differs from the pin) or ChainInvalid (E3105: cycle,
    depth over MAX_CHAIN_DEPTH, bad executor reference, chain not ending in a primitive,
    a lockfile pin disagreeing with an executor pin).
    """
    pins = pins or {}
    parse_range(version_range)  # a bad requested range is a request error, raised first
    warnings: list[str] = []
    link = _pick(registry, tool_id, version_range, pins, prefer_active=False,
                 required_by=None, warnings=warnings)
    links = [link]
    while link.executor is not None:
        parent_id, parent_range = parse_executor(link)
        _check_cycle(links, parent_id)
        if len(links) >= MAX_CHAIN_DEPTH:
            raise ChainInvalid(
                f"chain of {tool_id} is deeper than {MAX_CHAIN_DEPTH} links",
                details={"tool_id": tool_id, "max_depth": MAX_CHAIN_DEPTH,
                         "chain": [_ref(tv) for tv in links]},
            )
        if link.executor_pin is not None:
            link = _pinned_parent(registry, link, parent_id, pins, warnings)
        else:
            link = _pick(registry, parent_id, parent_range, pins, prefer_active=True,
                         required_by=link, warnings=warnings)
        links.append(link)
    _check_primitive(links)
    return ResolvedChain(links=tuple(links), warnings=tuple(warnings))


def parse_executor(tv: ToolVersion) -> tuple[str, str]:
    """Split `tv`'s executor reference into (tool_id, range); a bare name means `*`."""
    reference = tv.executor or ""
    name, _, range_text = reference.partition("@")
    name, range_text = name.strip(), range_text.strip() or ANY_RANGE
    if not name:
        raise _bad_reference(tv, reference, "no tool id")
    try:
        parse_range(range_text)
    except RequestError as error:
        raise _bad_reference(tv, reference, error.message) from error
    return name, range_text


def pin_executor(registry: RegistryView, tv: ToolVersion) -> ExecutorPin | None:
    """The executor `tv` is published with: the highest active version satisfying its
    executor reference now (else the highest deprecated or sunset one), never a removed
    one. None for a tool without an executor (primitives, knowledge).

    Raises ToolNotFound / VersionNotFound (E3101 / E3102) when no such version is in
    `registry`, VersionRemoved (E3104) when only removed ones are, ChainInvalid for a
    bad executor reference."""
    if tv.executor is None:
        return None
    parent_id, parent_range = parse_executor(tv)
    if parent_id == tv.tool_id:
        raise ChainInvalid(f"{_ref(tv)} names itself as its executor",
                           details={"tool_id": tv.tool_id, "executor": tv.executor})
    parent = _pick(registry, parent_id, parent_range, {}, prefer_active=True,
                   required_by=tv, warnings=[])
    return ExecutorPin(parent.tool_id, parent.version, parent.integrity)


def _pinned_parent(registry: RegistryView, child: ToolVersion, parent_id: str,
                   pins: Mapping[str, str], warnings: list[str]) -> ToolVersion:
    """The exact executor version `child` was published with, checked."""
    pin = child.executor_pin
    assert pin is not None
    details: dict[str, object] = {"tool_id": child.tool_id, "version": child.version,
                                  "executor_pin": str(pin)}
    if pin.tool_id != parent_id:
        raise ChainInvalid(f"{_ref(child)} is pinned to {pin} but its executor is "
                           f"{child.executor!r}", details=details)
    locked = pins.get(parent_id)
    if locked is not None and locked != pin.version:
        raise ChainInvalid(f"{_ref(child)} runs on {pin} (it was published with it); the "
                           f"lockfile pins {parent_id}@{locked}: lock it again",
                           details={**details, "locked": f"{parent_id}@{locked}"})
    parent = registry.get(pin.tool_id, pin.version)
    if parent is None:
        if not registry.versions(pin.tool_id):
            raise _not_found(pin.tool_id, child)
        raise VersionNotFound(f"{pin} (the executor {_ref(child)} was published with) is "
                              "not in the registry", details=details)
    if parent.lifecycle == "removed":
        available = [tv.version for tv in registry.versions(pin.tool_id)
                     if tv.lifecycle != "removed"]
        raise removed_error(pin.tool_id, pin.version, [parent], available, pinned=True)
    if parent.integrity != pin.integrity:
        raise IntegrityMismatch(
            f"{pin} (the executor of {_ref(child)}) has integrity {parent.integrity[:19]}, "
            f"not the pinned {pin.integrity[:19]}",
            details={**details, "expected": pin.integrity, "actual": parent.integrity})
    if parent.lifecycle in _WARN_STATES:
        warnings.append(lifecycle_warning(parent))
    return parent


class ChainCache:
    """Memoised `resolve_chain`, keyed by (tool_id, range, pins, registry revision).

    The revision is an explicit argument (the registry view's position or counter), so a
    new publish or lifecycle change is a new key. Errors are not cached. Bounded, LRU.
    """

    def __init__(self, max_entries: int = 1024) -> None:
        self._max_entries = max_entries
        self._entries: OrderedDict[tuple[object, ...], ResolvedChain] = OrderedDict()

    def resolve(
        self,
        registry: RegistryView,
        tool_id: str,
        version_range: str = ANY_RANGE,
        *,
        revision: object,
        pins: Mapping[str, str] | None = None,
    ) -> ResolvedChain:
        """`resolve_chain(registry, tool_id, version_range, pins=pins)`, memoised."""
        key = (tool_id, version_range, tuple(sorted((pins or {}).items())), revision)
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            return hit
        chain = resolve_chain(registry, tool_id, version_range, pins=pins)
        self._entries[key] = chain
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
        return chain

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def _pick(
    registry: RegistryView,
    tool_id: str,
    range_text: str,
    pins: Mapping[str, str],
    *,
    prefer_active: bool,
    required_by: ToolVersion | None,
    warnings: list[str],
) -> ToolVersion:
    candidates = [tv for tv in registry.versions(tool_id) if tv.lifecycle != "removed"]
    if not registry.versions(tool_id):
        raise _not_found(tool_id, required_by)
    pinned = pins.get(tool_id)
    if pinned is not None:
        chosen = next((tv for tv in candidates if tv.version == pinned), None)
        if chosen is None:
            _raise_if_removed(registry, tool_id, pinned, pinned=True)
            raise _version_not_found(registry, tool_id, pinned, required_by, pinned=True)
    else:
        chosen = _highest(candidates, range_text, prefer_active)
        if chosen is None:
            _raise_if_removed(registry, tool_id, range_text, pinned=False)
            raise _version_not_found(registry, tool_id, range_text, required_by, pinned=False)
    if chosen.lifecycle in _WARN_STATES:
        warnings.append(lifecycle_warning(chosen))
    return chosen


def _raise_if_removed(registry: RegistryView, tool_id: str, wanted: str, *,
                      pinned: bool) -> None:
    """E3104 when the versions `wanted` names exist but were all removed."""
    removed = [tv for tv in registry.versions(tool_id) if tv.lifecycle == "removed"]
    if pinned:
        matching = [tv for tv in removed if tv.version == wanted]
    else:
        matching = [tv for tv in removed if select_highest([tv.version], wanted) is not None]
    if matching:
        available = [tv.version for tv in registry.versions(tool_id) if tv.lifecycle != "removed"]
        raise removed_error(tool_id, wanted, matching, available, pinned=pinned)


def _highest(candidates: Sequence[ToolVersion], range_text: str,
             prefer_active: bool) -> ToolVersion | None:
    pools = [candidates]
    if prefer_active:
        pools.insert(0, [tv for tv in candidates if tv.lifecycle == "active"])
    for pool in pools:
        by_version = {tv.version: tv for tv in pool}
        best = select_highest(by_version, range_text)
        if best is not None:
            return by_version[best]
    return None


def _check_cycle(links: Sequence[ToolVersion], parent_id: str) -> None:
    ids = [tv.tool_id for tv in links]
    if parent_id in ids:
        cycle = [*ids[ids.index(parent_id):], parent_id]
        raise ChainInvalid(f"executor cycle: {' -> '.join(cycle)}",
                           details={"cycle": cycle, "chain": [_ref(tv) for tv in links]})


def _check_primitive(links: Sequence[ToolVersion]) -> None:
    last = links[-1]
    if last.tool_type == "primitive" and last.tool_id in PRIMITIVES:
        return
    if last.tool_type == "primitive":
        reason = f"{last.tool_id!r} is not a known primitive ({', '.join(sorted(PRIMITIVES))})"
    else:
        reason = f"{last.tool_id!r} is a {last.tool_type or 'untyped'} tool with no executor"
    raise ChainInvalid(f"chain does not end in a primitive: {reason}",
                       details={"tool_id": last.tool_id, "version": last.version,
                                "chain": [_ref(tv) for tv in links]})


def _not_found(tool_id: str, required_by: ToolVersion | None) -> ToolNotFound:
    if required_by is None:
        return ToolNotFound(f"tool {tool_id!r} not found", details={"tool_id": tool_id})
    return ToolNotFound(
        f"executor {tool_id!r} of {required_by.tool_id}@{required_by.version} not found",
        details={"tool_id": tool_id, "required_by": _ref(required_by)},
    )


def _version_not_found(registry: RegistryView, tool_id: str, wanted: str,
                       required_by: ToolVersion | None, *, pinned: bool) -> VersionNotFound:
    available = [tv.version for tv in registry.versions(tool_id) if tv.lifecycle != "removed"]
    what = f"pinned version {wanted}" if pinned else f"a version satisfying {wanted!r}"
    where = f" (executor of {required_by.tool_id}@{required_by.version})" if required_by else ""
    details: dict[str, object] = {"tool_id": tool_id, "available": available,
                                  "pinned" if pinned else "range": wanted}
    if required_by is not None:
        details["required_by"] = _ref(required_by)
    return VersionNotFound(f"{tool_id}{where} has no {what}; available: "
                           f"{', '.join(available) or 'none'}", details=details)


def _bad_reference(tv: ToolVersion, reference: str, reason: str) -> ChainInvalid:
    return ChainInvalid(f"{tv.tool_id}@{tv.version} has an invalid executor reference "
                        f"{reference!r}: {reason}",
                        details={"tool_id": tv.tool_id, "version": tv.version,
                                 "executor": reference})


def _ref(tv: ToolVersion) -> str:
    return f"{tv.tool_id}@{tv.version}"
