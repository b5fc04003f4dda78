"""Step 2 — authorize: tool.chain.resolved -> tool.permission.decided (+ failure on deny).

The capability token rides only on tool.invoke.requested (extension `captoken`) and
is never copied into derived events, so this step remembers tokens of requests it
has seen, in log order, until the matching chain.resolved arrives (same partition,
same consumer group, so the request is always seen first). After a restart or a
rebalance the request may have been consumed (and committed) by an earlier consumer:
then the token is read back from the log itself, where the request still is (the
request log port: same partition, before the resolution, id = its causation id).
Nothing stores the token anywhere else.

With a valid token, ABAC policies (domain.policy) decide next: the leaf's manifest
attributes come from the registry view port, the policy bundle from the policy view
port, the evaluation from the evaluator port (Cedar), through the decision store
port (in-process, or Redis shared by the replicas: consumers.decision_cache).
A deny is E3206 carrying the deciding policies' ids and reasons.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from consumers.decision_cache import DecisionStore
from consumers.events import derive, error_info, failed
from consumers.ports import Clock, LogPosition, Publish, RegistryReader, RequestLog
from contracts.envelope import Envelope, derived_event_id
from contracts.events import ChainResolved, InvokeRequested, PermissionDecided
from domain.capability import Capability, VerifiedTokens, authorise
from domain.errors import AuthorizationError
from domain.policy import (
    EXTERNAL_VERSION,
    AccessRequest,
    CacheKey,
    DefaultDecision,
    PolicyBundle,
    PolicyDecision,
    PolicyEvaluator,
    ToolResource,
    cache_key,
    decide,
)

NOT_REQUIRED = "authorization not required (TOOLEXEC_REQUIRE_AUTH=false)"


@dataclass
class PendingTokens:
    """Tokens of requests awaiting their decision, bounded (oldest evicted first)."""

    limit: int = 100_000
    _tokens: OrderedDict[str, str | None] = field(default_factory=OrderedDict)

    def remember(self, invocation_id: str, token: str | None) -> None:
        self._tokens[invocation_id] = token
        while len(self._tokens) > self.limit:
            self._tokens.popitem(last=False)

    def take(self, invocation_id: str) -> tuple[bool, str | None]:
        if invocation_id not in self._tokens:
            return False, None
        return True, self._tokens.pop(invocation_id)


class ExternalEngine(Protocol):
    """An external ABAC engine (consumers.abac_client.HttpAbac)."""

    async def evaluate(self, request: AccessRequest) -> PolicyDecision: ...


class PolicySource(Protocol):
    """The policy view: every policy set in force (folded from `policy.updated`)."""

    def current(self) -> PolicyBundle | None: ...

    async def ready(self, timeout: float) -> bool: ...


@dataclass(frozen=True)
class AuthorizeDeps:
    """Ports of the authorize step. Without `policies` and `evaluator` only the
    capability token is checked; `registry` supplies the leaf's manifest attributes."""

    publish: Publish
    clock: Clock
    require_auth: bool
    public_keys: Callable[[], Sequence[Any]]
    pending: PendingTokens
    registry: RegistryReader | None = None
    policies: PolicySource | None = None
    evaluator: PolicyEvaluator | None = None
    cache: DecisionStore | None = None
    default_decision: DefaultDecision = "allow"
    policy_wait_seconds: float = 10.0
    """Bound on waiting for the policy view to load before the first decision."""
    external: ExternalEngine | None = None
    """When set, this engine decides instead of the in-process policies."""
    verified: VerifiedTokens | None = None
    """Tokens already verified (repeated tokens skip the RSA verification)."""
    requests: RequestLog | None = None
    """Reads a request back from the log when its token is not in `pending`."""


async def on_invoke_requested(event: Envelope, deps: AuthorizeDeps) -> None:
    request: InvokeRequested = event.data
    if deps.require_auth:
        deps.pending.remember(request.invocation_id, event.extensions.get("captoken"))


async def on_chain_resolved(event: Envelope, deps: AuthorizeDeps,
                            at: LogPosition | None = None) -> None:
    """Decide on `event`, the chain.resolved record at `at` in the log."""
    resolved: ChainResolved = event.data
    now = deps.clock()
    common = dict(
        invocation_id=resolved.invocation_id, tool_id=resolved.tool_id,
        version=resolved.version, chain=resolved.chain, parameters=resolved.parameters,
        deadline=resolved.deadline,
    )
    if not deps.require_auth:
        decision = PermissionDecided(decision="allow", reason=NOT_REQUIRED, enforced=False, **common)
        await deps.publish(derive(event, decision, step="authorize", now=now))
        return
    seen, token = deps.pending.take(resolved.invocation_id)
    if not seen and await _earlier_decision_replayed(event, deps, at):
        return
    try:
        if not seen:
            token = await _token_from_log(event, deps, at)
        capability = authorise(token, deps.public_keys(), tool_id=resolved.tool_id,
                               version=resolved.version, now=int(now.timestamp()),
                               verified=deps.verified)
        if deps.external is not None:
            policy = await _external_decision(capability, resolved, deps, now=now.timestamp())
        else:
            if deps.policies is not None and not await deps.policies.ready(
                    deps.policy_wait_seconds):
                raise AuthorizationError("the policy view has not loaded the policies yet",
                                         code="E3205")
            policy = await _policy_decision(capability, resolved, deps, now=now.timestamp())
    except AuthorizationError as error:
        decision = PermissionDecided(decision="deny", reason=error.message, enforced=True,
                                     error=error_info(error),
                                     policy_version=error.details.get("policy_version"),
                                     **common)
        await deps.publish(derive(event, decision, step="authorize", now=now))
        await deps.publish(failed(event, error, stage="authorize",
                                  invocation_id=resolved.invocation_id,
                                  tool_id=resolved.tool_id, version=resolved.version, now=now))
        return
    reason = "capability token grants the tool"
    if policy is not None:
        reason += f"; {policy.reason}"
    decision = PermissionDecided(
        decision="allow", reason=reason, enforced=True,
        subject=capability.subject, token_jti=capability.jti,
        policy_version=None if policy is None else policy.policy_version, **common,
    )
    await deps.publish(derive(event, decision, step="authorize", now=now))


async def _earlier_decision_replayed(event: Envelope, deps: AuthorizeDeps,
                                     at: LogPosition | None) -> bool:
    """A resolution met again after a restart (its record was not committed) may have
    been decided already: that decision stands, whatever the clock or the policies say
    now (a token expired meanwhile must not add a second outcome). A deny's failure
    event is published again (same id), in case the restart fell between the two."""
    if deps.requests is None or at is None:
        return False
    earlier = await deps.requests.find_after(at, derived_event_id(event.id, "authorize"),
                                             "tool.permission.decided")
    if earlier is None:
        return False
    decision: PermissionDecided = earlier.data
    if decision.decision == "deny" and decision.error is not None:
        await deps.publish(failed(event, decision.error, stage="authorize",
                                  invocation_id=decision.invocation_id, tool_id=decision.tool_id,
                                  version=decision.version, now=deps.clock()))
    return True


async def _token_from_log(event: Envelope, deps: AuthorizeDeps,
                          at: LogPosition | None) -> str | None:
    """The captoken of the request that `event` resolved, read back from the log (the
    request was consumed before a restart or rebalance). E3203 when it is not there."""
    if deps.requests is not None and at is not None and event.causationid is not None:
        request = await deps.requests.find(at, event.causationid)
        if (request is not None and request.type == "tool.invoke.requested"
                and request.correlationid == event.correlationid):
            return request.extensions.get("captoken")
    raise AuthorizationError(
        "the request of this invocation is no longer in the log, so its capability token "
        "cannot be checked; resubmit the invocation", code="E3203",
        details={"request_event_id": event.causationid})


async def _policy_decision(capability: Capability, resolved: ChainResolved,
                           deps: AuthorizeDeps, *, now: float) -> PolicyDecision | None:
    """ABAC after the token; None when no policy engine is wired. Raises E3206 on deny."""
    if deps.policies is None or deps.evaluator is None:
        return None
    evaluator = deps.evaluator
    bundle = deps.policies.current()
    request = AccessRequest.build(capability.subject, _resource(resolved, deps, bundle),
                                  resolved.parameters, now=int(now))

    async def evaluate() -> PolicyDecision:
        return decide(request, bundle, evaluator, None, clock=now,
                      default=deps.default_decision)

    if bundle is None or not bundle.sets:  # the default decision: nothing to cache
        decision = await evaluate()
    else:
        decision = await _through_cache(deps, cache_key(request, bundle.version), now, evaluate)
    if not decision.allowed:
        raise AuthorizationError(
            f"denied by policy: {decision.reason}", code="E3206",
            details={"policy_version": decision.policy_version,
                     "policy_ids": list(decision.policy_ids), "subject": capability.subject})
    return decision


async def _external_decision(capability: Capability, resolved: ChainResolved,
                             deps: AuthorizeDeps, *, now: float) -> PolicyDecision:
    """The external engine's decision, through the decision cache; E3206 on deny."""
    assert deps.external is not None
    request = AccessRequest.build(capability.subject, _resource(resolved, deps, None),
                                  resolved.parameters, now=int(now))
    external = deps.external

    async def evaluate() -> PolicyDecision:
        return await external.evaluate(request)

    decision = await _through_cache(deps, cache_key(request, EXTERNAL_VERSION), now, evaluate)
    if not decision.allowed:
        raise AuthorizationError(
            f"denied by the ABAC engine: {decision.reason}", code="E3206",
            details={"policy_version": EXTERNAL_VERSION, "subject": capability.subject})
    return decision


async def _through_cache(deps: AuthorizeDeps, key: CacheKey, now: float,
                         evaluate: Callable[[], Awaitable[PolicyDecision]]) -> PolicyDecision:
    """The cached decision for `key`, else `evaluate()` (then cached)."""
    if deps.cache is None:
        return await evaluate()
    decision = await deps.cache.get(key, now=now)
    if decision is None:
        decision = await evaluate()
        await deps.cache.put(key, decision, now=now)
    return decision


def _resource(resolved: ChainResolved, deps: AuthorizeDeps,
              bundle: PolicyBundle | None) -> ToolResource:
    leaf = deps.registry.get(resolved.tool_id, resolved.version) if deps.registry else None
    if leaf is None:
        if bundle is not None and bundle.sets:
            # Policies read the manifest's attributes: without them, fail closed.
            raise AuthorizationError(
                f"attributes of {resolved.tool_id}@{resolved.version} are not available "
                "to the policy check", code="E3206",
                details={"policy_version": bundle.version})
        return ToolResource(resolved.tool_id, resolved.version)
    return ToolResource.from_manifest(resolved.tool_id, resolved.version, leaf.manifest)
