"""Canonical, content-addressed integrity of tool versions.

A tool version's integrity is `sha256:` + the hex sha256 of the RFC 8785 canonical JSON
of `{tool_id, version, manifest, files: [{path, sha256, is_executable}] sorted by path}`.
It changes when any execution-relevant byte changes: a manifest value, a file's bytes
(through its sha256) or a file's executable bit. Key order of the manifest and the order
the files come in do not matter.

Verification recomputes every link of a chain; an `IntegrityCache` remembers tool
versions already verified so the hot path (the same immutable registry objects, again
and again) costs one dictionary lookup per link.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import rfc8785

from domain.bounded import remember
from domain.errors import IntegrityMismatch, RegistryError
from domain.model import ResolvedChain, ToolFile, ToolSource, ToolVersion

INTEGRITY_PREFIX = "sha256:"


def sha256_ref(canonical: bytes) -> str:
    """`sha256:<hex>` of canonical bytes: the form of every content address and hash
    toolexec records (integrity, call hashes, checkpoint states, MCP definitions)."""
    return INTEGRITY_PREFIX + hashlib.sha256(canonical).hexdigest()


def file_sha256(content: bytes) -> str:
    """Lowercase hex sha256 digest of a file's bytes."""
    return hashlib.sha256(content).hexdigest()


def compute_integrity(
    tool_id: str, version: str, manifest: Mapping[str, Any], files: Iterable[ToolFile]
) -> str:
    """The canonical integrity `sha256:<hex>` of a tool version (see module docstring).

    Raises RegistryError (E3105) when the manifest holds values JSON cannot carry.
    """
    payload = {
        "tool_id": tool_id,
        "version": version,
        "manifest": _json_value(manifest, "$.manifest"),
        "files": [
            {"path": f.path, "sha256": f.sha256, "is_executable": bool(f.is_executable)}
            for f in sorted(files, key=lambda f: f.path)
        ],
    }
    try:
        canonical = rfc8785.dumps(payload)
    except rfc8785.CanonicalizationError as error:
        raise RegistryError(f"{tool_id}@{version} cannot be canonicalised: {error}",
                            details={"tool_id": tool_id, "version": version}) from error
    return sha256_ref(canonical)


def seal(source: ToolSource) -> ToolVersion:
    """Turn a tool source into an immutable ToolVersion with its integrity.

    tool_id and version come from the manifest; every file whose content is present
    must hash to its declared sha256 (IntegrityMismatch otherwise). The lifecycle is the
    manifest's `lifecycle_state` (default "active").
    """
    manifest = source.manifest
    tool_id, version = manifest.get("tool_id"), manifest.get("version")
    if not isinstance(tool_id, str) or not tool_id or not isinstance(version, str) or not version:
        raise RegistryError(
            "a manifest needs string tool_id and version to be sealed",
            details={"origin": source.origin, "tool_id": tool_id, "version": version},
        )
    _check_unique_paths(tool_id, version, source.files)
    for file in source.files:
        _verify_file(tool_id, version, file)
    integrity = compute_integrity(tool_id, version, manifest, source.files)
    lifecycle = manifest.get("lifecycle_state") or "active"
    return ToolVersion(tool_id=tool_id, version=version, manifest=manifest,
                       files=tuple(source.files), integrity=integrity, lifecycle=str(lifecycle))


class IntegrityCache:
    """Tool versions already verified in this process, by object identity.

    ToolVersion, ToolFile and bytes are immutable, so a version verified once stays
    verified; the cache holds a strong reference to each entry, so an id cannot be
    reused while its entry lives, and an identity check guards every hit. Contract: a
    ToolVersion's manifest mapping must not be mutated in place after verification
    (build a new ToolVersion instead, as the registry does). Bounded, LRU eviction.
    """

    def __init__(self, max_entries: int = 4096) -> None:
        self._max_entries = max_entries
        self._entries: OrderedDict[int, ToolVersion] = OrderedDict()

    def __contains__(self, tv: object) -> bool:
        hit = self._entries.get(id(tv))
        if hit is tv:
            self._entries.move_to_end(id(tv))
            return True
        return False

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, tv: ToolVersion) -> None:
        """Remember `tv` as verified."""
        remember(self._entries, id(tv), tv, self._max_entries)

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()


DEFAULT_CACHE = IntegrityCache()


def verify_tool(tv: ToolVersion, *, cache: IntegrityCache | None = DEFAULT_CACHE) -> None:
    """Recompute `tv`'s integrity (and each present file content's sha256).

    Raises IntegrityMismatch with details {tool_id, version, expected, actual, file?}.
    Pass `cache=None` to force a full recomputation.
    """
    if cache is not None and tv in cache:
        return
    for file in tv.files:
        _verify_file(tv.tool_id, tv.version, file)
    actual = compute_integrity(tv.tool_id, tv.version, tv.manifest, tv.files)
    if actual != tv.integrity:
        raise IntegrityMismatch(
            f"integrity mismatch for {tv.tool_id}@{tv.version}: recorded "
            f"{_short(tv.integrity)}, recomputed {_short(actual)}",
            details={"tool_id": tv.tool_id, "version": tv.version,
                     "expected": tv.integrity, "actual": actual},
        )
    if cache is not None:
        cache.add(tv)


def verify_chain(
    chain: ResolvedChain | Sequence[ToolVersion], *, cache: IntegrityCache | None = DEFAULT_CACHE
) -> None:
    """Verify every link of a chain, leaf first; the first mismatching tool is named."""
    links = chain.links if isinstance(chain, ResolvedChain) else chain
    for tv in links:
        verify_tool(tv, cache=cache)


def _verify_file(tool_id: str, version: str, file: ToolFile) -> None:
    if file.content is None:
        return
    actual = file_sha256(file.content)
    if actual != file.sha256:
        raise IntegrityMismatch(
            f"file {file.path!r} of {tool_id}@{version} does not match its sha256: "
            f"recorded {file.sha256[:12]}, content hashes to {actual[:12]}",
            details={"tool_id": tool_id, "version": version, "file": file.path,
                     "expected": file.sha256, "actual": actual},
        )


def _check_unique_paths(tool_id: str, version: str, files: Sequence[ToolFile]) -> None:
    seen: set[str] = set()
    for file in files:
        if file.path in seen:
            raise RegistryError(f"{tool_id}@{version} lists file {file.path!r} twice",
                                details={"tool_id": tool_id, "version": version,
                                         "file": file.path})
        seen.add(file.path)


def _json_value(value: Any, path: str) -> Any:
    """A plain JSON value (dict/list/str/int/float/bool/None) equal to `value`."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _not_json(path, value)
        return value
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise _not_json(path, value)
        return {k: _json_value(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v, f"{path}[{i}]") for i, v in enumerate(value)]
    raise _not_json(path, value)


def _not_json(path: str, value: Any) -> RegistryError:
    return RegistryError(f"{path} holds a value JSON cannot carry ({type(value).__name__})",
                         details={"path": path})


def _short(integrity: str) -> str:
    return integrity[: len(INTEGRITY_PREFIX) + 12]
