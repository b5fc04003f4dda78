"""Lockfiles, format version 1: a resolved, verified chain frozen with exact versions
and integrities, for reproducible execution.

```json
{"lockfile_version": 1, "generated_at": "...",
 "root": {"tool_id", "version", "integrity"},
 "resolved_chain": [{"tool_id", "version", "integrity", "executor"}, ...],
 "registry": {"url", "fetched_at"}}
```
Each entry's `executor` is the tool_id of the next entry (null for the primitive).
The entry of an `mcp_tool` may also pin `definition_hash`: the hash of the definition
its server announces (domain.definitions); a locked call whose server announces
another one is refused (E3108), whatever was approved.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.chain import parse_executor
from domain.errors import IntegrityMismatch, LockfileError, ToolNotFound, VersionNotFound
from domain.lifecycle import lifecycle_warning, removed_error
from domain.model import MAX_CHAIN_DEPTH, PRIMITIVES, ResolvedChain, ToolVersion
from domain.registry import RegistryView
from domain.semver import is_valid_version

LOCKFILE_VERSION = 1
_INTEGRITY = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class LockEntry:
    """One pinned link of a locked chain."""

    tool_id: str
    version: str
    integrity: str
    executor: str | None
    definition_hash: str | None = None

    def to_dict(self) -> dict[str, Any]:
        entry = {"tool_id": self.tool_id, "version": self.version,
                 "integrity": self.integrity, "executor": self.executor}
        if self.definition_hash is not None:
            entry["definition_hash"] = self.definition_hash
        return entry


@dataclass(frozen=True, slots=True)
class Lockfile:
    """A parsed, structurally valid lockfile. `chain` is ordered leaf..primitive."""

    chain: tuple[LockEntry, ...]
    generated_at: str
    registry_url: str
    fetched_at: str
    lockfile_version: int = LOCKFILE_VERSION

    @property
    def root(self) -> LockEntry:
        return self.chain[0]


def freeze(chain: ResolvedChain, *, generated_at: str, registry_url: str,
           definitions: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The lockfile (a JSON-ready dict) of a resolved chain. The caller resolves,
    verifies and validates the chain first; time comes in as `generated_at`.
    `definitions` maps an mcp_tool's tool_id to the definition hash to pin."""
    links = chain.links
    pinned = definitions or {}
    entries = [
        LockEntry(tv.tool_id, tv.version, tv.integrity,
                  links[i + 1].tool_id if i + 1 < len(links) else None,
                  pinned.get(tv.tool_id)).to_dict()
        for i, tv in enumerate(links)
    ]
    root = {k: entries[0][k] for k in ("tool_id", "version", "integrity")}
    return {
        "lockfile_version": LOCKFILE_VERSION,
        "generated_at": generated_at,
        "root": root,
        "resolved_chain": entries,
        "registry": {"url": registry_url, "fetched_at": generated_at},
    }


def parse_lockfile(data: Mapping[str, Any]) -> Lockfile:
    """Check a lockfile's structure and return it; LockfileError (E3105) names the
    first problem and its JSON path in `details["path"]`."""
    if not isinstance(data, Mapping):
        raise _bad("$", "a lockfile must be a JSON object")
    if data.get("lockfile_version") != LOCKFILE_VERSION:
        raise _bad("$.lockfile_version", f"unsupported lockfile_version "
                                         f"{data.get('lockfile_version')!r}; expected 1")
    raw_chain = data.get("resolved_chain")
    if not isinstance(raw_chain, list) or not raw_chain:
        raise _bad("$.resolved_chain", "resolved_chain must be a non-empty list")
    if len(raw_chain) > MAX_CHAIN_DEPTH:
        raise _bad("$.resolved_chain", f"resolved_chain has {len(raw_chain)} entries; "
                                       f"at most {MAX_CHAIN_DEPTH} are allowed")
    chain = tuple(_entry(raw, f"$.resolved_chain[{i}]") for i, raw in enumerate(raw_chain))
    _check_links(chain)
    _check_root(data.get("root"), chain[0])
    registry = data.get("registry", {})
    if not isinstance(registry, Mapping):
        raise _bad("$.registry", "registry must be an object")
    return Lockfile(
        chain=chain,
        generated_at=_text(data, "generated_at", "$", required=False),
        registry_url=_text(registry, "url", "$.registry", required=False),
        fetched_at=_text(registry, "fetched_at", "$.registry", required=False),
    )


def pins(lock: Lockfile) -> dict[str, str]:
    """tool_id -> exact version, for `resolve_chain(..., pins=...)`."""
    return {entry.tool_id: entry.version for entry in lock.chain}


def locked_definition(data: Mapping[str, Any]) -> str | None:
    """The definition hash a lockfile (checked at resolution) pins for its root tool."""
    return parse_lockfile(data).root.definition_hash


def verify_lockfile(lock: Lockfile, registry: RegistryView) -> ResolvedChain:
    """The locked chain, read from the registry at the exact locked versions.

    Raises ToolNotFound / VersionNotFound when an entry is missing, VersionRemoved
    (E3104) when it was removed,
    IntegrityMismatch when the registry's integrity differs from the locked one (both
    in details), LockfileError when the registry's manifests no longer link the entries
    in lock order or a locked executor is not the one its child was published with
    (its executor pin). Warnings are given for deprecated or sunset versions.
    """
    links: list[ToolVersion] = []
    warnings: list[str] = []
    for entry in lock.chain:
        tv = _locked_version(entry, registry)
        if tv.lifecycle in ("deprecated", "sunset"):
            warnings.append(lifecycle_warning(tv))
        links.append(tv)
    _check_registry_links(links)
    return ResolvedChain(links=tuple(links), warnings=tuple(warnings))


def _locked_version(entry: LockEntry, registry: RegistryView) -> ToolVersion:
    known = registry.versions(entry.tool_id)
    if not known:
        raise ToolNotFound(f"locked tool {entry.tool_id!r} not found in the registry",
                           details={"tool_id": entry.tool_id, "version": entry.version})
    tv = registry.get(entry.tool_id, entry.version)
    available = [v.version for v in known if v.lifecycle != "removed"]
    if tv is not None and tv.lifecycle == "removed":
        raise removed_error(entry.tool_id, entry.version, [tv], available, pinned=True)
    if tv is None:
        raise VersionNotFound(
            f"locked version {entry.tool_id}@{entry.version} is not found in the registry",
            details={"tool_id": entry.tool_id, "version": entry.version, "available": available},
        )
    if tv.integrity != entry.integrity:
        raise IntegrityMismatch(
            f"integrity drift for {entry.tool_id}@{entry.version}: lockfile "
            f"{entry.integrity[:19]}, registry {tv.integrity[:19]}",
            details={"tool_id": entry.tool_id, "version": entry.version,
                     "expected": entry.integrity, "actual": tv.integrity},
        )
    return tv


def _check_registry_links(links: list[ToolVersion]) -> None:
    for child, parent in zip(links, links[1:], strict=False):
        executor = parse_executor(child)[0] if child.executor else None
        if executor != parent.tool_id:
            raise LockfileError(
                f"{child.tool_id}@{child.version} runs on {executor!r}, but the lockfile "
                f"puts {parent.tool_id} after it",
                details={"tool_id": child.tool_id, "executor": executor,
                         "locked_next": parent.tool_id},
            )
        pin = child.executor_pin
        if pin is not None and (pin.version, pin.integrity) != (parent.version, parent.integrity):
            raise LockfileError(
                f"{child.tool_id}@{child.version} runs on {pin} (it was published with it), "
                f"but the lockfile puts {parent.tool_id}@{parent.version} after it: lock it "
                "again",
                details={"tool_id": child.tool_id, "executor_pin": str(pin),
                         "locked_next": f"{parent.tool_id}@{parent.version}"},
            )
    last = links[-1]
    if last.executor is not None or last.tool_type != "primitive" or last.tool_id not in PRIMITIVES:
        raise LockfileError(f"locked chain ends at {last.tool_id}, which is not a primitive",
                            details={"tool_id": last.tool_id, "executor": last.executor})


def _entry(raw: Any, path: str) -> LockEntry:
    if not isinstance(raw, Mapping):
        raise _bad(path, "each resolved_chain entry must be an object")
    tool_id = _text(raw, "tool_id", path)
    version = _text(raw, "version", path)
    if not is_valid_version(version):
        raise _bad(f"{path}.version", f"{version!r} is not a semantic version")
    integrity = _text(raw, "integrity", path)
    if not _INTEGRITY.match(integrity):
        raise _bad(f"{path}.integrity", "integrity must be 'sha256:' + 64 lowercase hex digits")
    executor = raw.get("executor")
    if executor is not None and (not isinstance(executor, str) or not executor):
        raise _bad(f"{path}.executor", "executor must be a tool_id or null")
    definition = raw.get("definition_hash")
    if definition is not None and (not isinstance(definition, str)
                                   or not _INTEGRITY.match(definition)):
        raise _bad(f"{path}.definition_hash",
                   "definition_hash must be 'sha256:' + 64 lowercase hex digits")
    return LockEntry(tool_id, version, integrity, executor, definition)


def _check_links(chain: tuple[LockEntry, ...]) -> None:
    seen: set[str] = set()
    for i, entry in enumerate(chain):
        if entry.tool_id in seen:
            raise _bad(f"$.resolved_chain[{i}].tool_id", f"{entry.tool_id} appears twice")
        seen.add(entry.tool_id)
        expected = chain[i + 1].tool_id if i + 1 < len(chain) else None
        if entry.executor != expected:
            raise _bad(f"$.resolved_chain[{i}].executor",
                       f"executor {entry.executor!r} does not name the next entry "
                       f"({expected!r})")


def _check_root(root: Any, first: LockEntry) -> None:
    if root is None:
        return
    if not isinstance(root, Mapping):
        raise _bad("$.root", "root must be an object")
    for key in ("tool_id", "version", "integrity"):
        if root.get(key) != getattr(first, key):
            raise _bad(f"$.root.{key}", f"root.{key} {root.get(key)!r} differs from the "
                                        f"first resolved_chain entry ({getattr(first, key)!r})")


def _text(data: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> str:
    value = data.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value:
        raise _bad(f"{path}.{key}", f"{key} must be a non-empty string")
    return value


def _bad(path: str, message: str) -> LockfileError:
    return LockfileError(f"invalid lockfile: {path}: {message}", details={"path": path})
