"""Step 1 — resolve: tool.invoke.requested -> tool.chain.resolved | tool.invoke.failed.

Reads the registry view, follows executors to a primitive (or takes the lockfile's
pins), recomputes every link's integrity and lets each parent validate its child.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from consumers.events import derive, failed
from consumers.ports import Clock, Publish, RegistryReader
from contracts.envelope import Envelope
from contracts.events import ChainLink, ChainResolved, InvokeRequested
from domain.chain import ChainCache
from domain.child_validation import ensure_chain_valid
from domain.errors import RegistryError, ToolexecError
from domain.integrity import verify_chain
from domain.lockfile import parse_lockfile, verify_lockfile
from domain.model import ResolvedChain


@dataclass(frozen=True)
class ResolveDeps:
    registry: RegistryReader
    publish: Publish
    clock: Clock
    strict_chain: bool = True
    registry_wait_seconds: float = 5.0
    chains: ChainCache = field(default_factory=ChainCache)


async def on_invoke_requested(event: Envelope, deps: ResolveDeps) -> None:
    request: InvokeRequested = event.data
    try:
        chain = await _resolve_with_catch_up(request, deps)
        verify_chain(chain)
        warnings = list(chain.warnings) + ensure_chain_valid(chain, strict=deps.strict_chain)
    except ToolexecError as error:
        await deps.publish(
            failed(event, error, stage="resolve", invocation_id=request.invocation_id,
                   tool_id=request.tool_id, version=None, now=deps.clock())
        )
        return
    resolved = ChainResolved(
        invocation_id=request.invocation_id,
        tool_id=chain.leaf.tool_id,
        version=chain.leaf.version,
        chain=[
            ChainLink(tool_id=link.tool_id, version=link.version, integrity=link.integrity,
                      tool_type=link.tool_type, executor=link.executor)
            for link in chain.links
        ],
        warnings=warnings,
        parameters=request.parameters,
        lockfile_used=request.lockfile is not None,
        deadline=request.deadline,
    )
    await deps.publish(derive(event, resolved, step="resolve", now=deps.clock()))


async def _resolve_with_catch_up(request: InvokeRequested, deps: ResolveDeps) -> ResolvedChain:
    """Resolve; on a miss, wait (bounded) for the registry view to reach the end of
    the registry topic as it is now, then try once more (read-your-writes)."""
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
