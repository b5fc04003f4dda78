"""Step 1 — resolve: tool.invoke.requested -> tool.chain.resolved | tool.invoke.failed.

Reads the registry view, follows executors to a primitive (or takes the lockfile's
pins), recomputes every link's integrity, checks each link's publisher signature
against the trust store and lets each parent validate its child.
The step returns its fact; the pipeline appends it to the log (consumers.runtime.invocation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from consumers.ports import Clock, RegistryReader
from consumers.steps.derived_events import derive, failed
from contracts.envelope import Envelope
from contracts.events import ChainLink, ChainResolved, InvokeRequested
from domain.chain import ChainCache
from domain.child_validation import ensure_chain_valid
from domain.errors import IntegrityMismatch, RegistryError, ToolexecError, VersionNotFound
from domain.integrity import verify_chain
from domain.lockfile import parse_lockfile, verify_lockfile
from domain.model import ResolvedChain
from domain.publisher_signature import NO_TRUST_STORE, TrustStore, check_chain_publishers
from domain.request_limits import (
    DEFAULT_MAX_PARAMETER_BYTES,
    PayloadRejected,
    check_request_payload,
)


@dataclass(frozen=True)
class ResolveDeps:
    registry: RegistryReader
    clock: Clock
    strict_chain: bool = True
    registry_wait_seconds: float = 5.0
    chains: ChainCache = field(default_factory=ChainCache)
    max_parameter_bytes: int = DEFAULT_MAX_PARAMETER_BYTES
    trust: TrustStore = NO_TRUST_STORE


@dataclass(frozen=True)
class Resolved:
    """The verified chain and the `tool.chain.resolved` fact recording it."""

    chain: ResolvedChain
    event: Envelope


async def resolve_request(event: Envelope, deps: ResolveDeps) -> Resolved | Envelope:
    """The request's chain, or its terminal `tool.invoke.failed`: E3004 for a request
    that is not strict JSON within the size bound (any Kafka producer may write one),
    E31xx for the registry, integrity and publisher trust (E3107)."""
    request: InvokeRequested = event.data
    try:
        check_request_payload(request.parameters, lockfile=request.lockfile,
                              max_bytes=deps.max_parameter_bytes)
    except PayloadRejected as error:
        return failed(event, error, stage="request", invocation_id=request.invocation_id,
                      tool_id=request.tool_id, version=None, now=deps.clock())
    try:
        chain = await _resolve_with_catch_up(request, deps)
        verify_chain(chain)
        check_chain_publishers(chain.links, deps.trust)
        warnings = list(chain.warnings) + ensure_chain_valid(chain, strict=deps.strict_chain)
    except ToolexecError as error:
        return failed(event, error, stage="resolve", invocation_id=request.invocation_id,
                      tool_id=request.tool_id, version=None, now=deps.clock())
    resolved = ChainResolved(
        invocation_id=request.invocation_id,
        tool_id=chain.leaf.tool_id,
        version=chain.leaf.version,
        chain=chain_links(chain),
        warnings=warnings,
        parameters=request.parameters,
        lockfile_used=request.lockfile is not None,
        deadline=request.deadline,
    )
    return Resolved(chain, derive(event, resolved, step="resolve", now=deps.clock()))


def chain_links(chain: ResolvedChain) -> list[ChainLink]:
    """`chain` as the links a fact records (leaf first)."""
    return [ChainLink(tool_id=link.tool_id, version=link.version, integrity=link.integrity,
                      tool_type=link.tool_type, executor=link.executor)
            for link in chain.links]


def chain_from_links(links: list[ChainLink], registry: RegistryReader) -> ResolvedChain:
    """The chain a fact on the log names, rebuilt from the registry view and verified
    against the recorded integrities (an invocation resumed after a restart)."""
    versions = []
    for link in links:
        version = registry.get(link.tool_id, link.version)
        if version is None:
            raise VersionNotFound(f"{link.tool_id}@{link.version} is not in the registry view",
                                  details={"tool_id": link.tool_id, "version": link.version})
        if version.integrity != link.integrity:
            raise IntegrityMismatch(
                f"{link.tool_id}@{link.version} changed since it was resolved",
                details={"tool_id": link.tool_id, "version": link.version,
                         "expected": link.integrity, "actual": version.integrity},
            )
        versions.append(version)
    chain = ResolvedChain(tuple(versions))
    verify_chain(chain)
    return chain


async def _resolve_with_catch_up(request: InvokeRequested, deps: ResolveDeps) -> ResolvedChain:
    """Resolve; on a miss, wait (bounded) for the registry view to reach the end of
    the registry topic as it is now, then try once more (read-your-writes). A request
    naming the registry offset its producer wrote up to is resolved once the view
    holds that much (the producer's own publications and lifecycle changes)."""
    if request.registry_offset is not None:
        await deps.registry.reach(request.registry_offset, deps.registry_wait_seconds)
    try:
        return _resolve(request, deps.registry, deps.chains)
    except RegistryError as miss:
        if miss.code not in ("E3101", "E3102", "E3104"):
            raise
        if not await deps.registry.catch_up(deps.registry_wait_seconds):
            raise
        return _resolve(request, deps.registry, deps.chains)


def _resolve(request: InvokeRequested, registry: RegistryReader,
             chains: ChainCache) -> ResolvedChain:
    if request.lockfile is not None:
        lock = parse_lockfile(request.lockfile)
        chain = verify_lockfile(lock, registry)
        if chain.leaf.tool_id != request.tool_id:
            raise RegistryError(
                f"lockfile is for {chain.leaf.tool_id}, not {request.tool_id}",
                details={"lockfile_root": chain.leaf.tool_id},
            )
        return chain
    return chains.resolve(registry, request.tool_id, request.version_range or "*",
                          revision=registry.revision)
