"""Authoring use cases that need no running system: the integrity of a tool source and
the lockfile of a tool's verified chain."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from domain.chain import resolve_chain
from domain.child_validation import ensure_chain_valid
from domain.errors import InvalidRequest, ToolexecError
from domain.integrity import compute_integrity, seal, verify_chain
from domain.lockfile import freeze
from domain.model import LOCAL_REGISTRY_URL, Issue, ResolvedChain, ToolSource
from domain.publication import plan_publication
from domain.registry import InMemoryRegistry
from domain.validation import validate_source
from toolexec.sources import (
    SourceError,
    bash_syntax_check,
    discover,
    load_builtin_sources,
    load_source,
)


def known_tools(sources: Iterable[ToolSource]) -> dict[str, str]:
    """tool_id -> tool_type of `sources` (what validation checks executors against)."""
    return {str(s.manifest.get("tool_id")): str(s.manifest.get("tool_type")) for s in sources}


def errors_of(issues: Iterable[Issue]) -> list[Issue]:
    """The issues of severity "error"."""
    return [issue for issue in issues if issue.severity == "error"]


def source_integrity(path: Path) -> tuple[str, str, str]:
    """(tool_id, version, `sha256:<hex>` integrity) of the tool source at `path`.
    Raises ToolexecError (SourceError) when it cannot be read."""
    source = load_source(path)
    tool_id, version = source.manifest.get("tool_id"), source.manifest.get("version")
    if not isinstance(tool_id, str) or not isinstance(version, str):
        raise SourceError(f"{source.origin}: the manifest needs tool_id and version "
                          "to compute an integrity", details={"origin": source.origin})
    return tool_id, version, compute_integrity(tool_id, version, source.manifest, source.files)


def lock_chain(tool_id: str, version_range: str, tool_dirs: Sequence[Path], *,
               strict: bool = False, registry_url: str = LOCAL_REGISTRY_URL,
               definitions: Mapping[tuple[str, str], str] | None = None,
               definition_hash: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The lockfile of `tool_id@version_range` resolved from the built-in tools and
    `tool_dirs` (every link verified, parent -> child schemas checked), and the
    warnings met, sources left out included. An mcp_tool's entry pins
    `definition_hash` when given, else its pinned definition in `definitions`
    ((server tool id, MCP tool name) -> hash, as `toolexec definitions list` shows).
    Raises ToolexecError (E31xx) when it cannot be resolved."""
    registry, skipped = local_registry(tool_dirs)
    chain = resolve_chain(registry, tool_id, version_range)
    verify_chain(chain)
    warnings = [*skipped, *chain.warnings, *ensure_chain_valid(chain, strict=strict)]
    pinned = _definition_pin(chain, definitions or {}, definition_hash, warnings)
    lockfile = freeze(chain, generated_at=_now(), registry_url=registry_url,
                      definitions=pinned)
    return lockfile, list(dict.fromkeys(warnings))


_HASH = re.compile(r"^sha256:[0-9a-f]{64}$")


def _definition_pin(chain: ResolvedChain, definitions: Mapping[tuple[str, str], str],
                    given: str | None, warnings: list[str]) -> dict[str, str]:
    """{leaf tool id: definition hash} for an mcp_tool leaf whose hash is known."""
    leaf = chain.leaf
    if given is not None and not _HASH.match(given):
        raise InvalidRequest(f"--definition-hash must be sha256:<64 hex digits>, got "
                             f"{given[:80]!r}", details={"definition_hash": given[:80]})
    if leaf.tool_type != "mcp_tool" or len(chain.links) < 2:
        if given is not None:
            raise InvalidRequest(f"{leaf.tool_id} is no mcp_tool: it has no definition hash",
                                 details={"tool_id": leaf.tool_id})
        return {}
    config = leaf.manifest.get("config") or {}
    known = given or definitions.get((chain.links[1].tool_id, str(config.get("mcp_tool_name"))))
    if known is None:
        warnings.append(f"no definition of {leaf.tool_id} was pinned yet (call it once, or "
                        "pass --definition-hash): the lockfile does not pin it")
        return {}
    return {leaf.tool_id: known}


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def local_registry(tool_dirs: Sequence[Path]) -> tuple[InMemoryRegistry, list[str]]:
    """Built-in tools plus every valid source under `tool_dirs`, sealed and pinned to
    their executors as publishing them would, and why each source left out was
    (unreadable, invalid, or refused by the publication plan)."""
    found = discover([d for d in tool_dirs if d.exists()])
    skipped = [f"skipped: {error}" for error in found if isinstance(error, SourceError)]
    sources = [*load_builtin_sources(), *(i for i in found if isinstance(i, ToolSource))]
    known = known_tools(sources)
    sealed = []
    for source in sources:
        problems = errors_of(validate_source(source, bash_syntax=bash_syntax_check,
                                             known_tools=known))
        if problems:
            skipped.append(f"skipped: {source.origin}: {len(problems)} validation error(s), "
                           f"first: {problems[0].path} {problems[0].message}")
            continue
        try:
            sealed.append(seal(source))
        except ToolexecError as error:
            skipped.append(f"skipped: {source.origin}: {error}")
    registry = InMemoryRegistry()
    for plan in plan_publication(sealed, InMemoryRegistry()):
        if plan.outcome == "new":
            registry.add(plan.version)
        elif plan.error is not None:
            skipped.append(f"skipped: {plan.version.tool_id}@{plan.version.version}: "
                           f"{plan.error}")
    return registry, skipped
