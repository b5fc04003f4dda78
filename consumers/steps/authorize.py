"""Step 2 — authorize: the request and its resolved chain -> tool.permission.decided
(+ tool.invoke.failed on deny, + tool.approval.requested when an allowed call needs an
approver: a matching permit annotated `@approval("required")`, or the leaf's manifest).

The capability token rides only on tool.invoke.requested (extension `captoken`, sealed
to this pipeline and bound to the request when the producer knows the pipeline's key:
contracts.token_seal) and is checked right where it arrives, in the same step that
resolved the chain: it is never copied into a derived event nor kept anywhere else.

With a valid token, ABAC policies (domain.policy) decide next: the leaf's manifest
attributes come from the resolved chain, the policy bundle from the policy view
port, the evaluation from the evaluator port (Cedar), through the decision store
port (in-process, or Redis shared by the replicas: consumers.adapters.decision_cache).
A deny is E3206 carrying the deciding policies' ids and reasons.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from consumers.ports import Clock, DecisionStore
from consumers.steps.derived_events import derive, error_info, failed
from contracts.envelope import Envelope
from contracts.events import ApprovalRequested, ChainResolved, PermissionDecided
from contracts.token_seal import SealBroken, TokenOpener, is_sealed
from domain.approval import approval_reasons, call_hash, expiry
from domain.capability import (
    DEFAULT_LIFETIME,
    Capability,
    VerifiedTokens,
    authorise,
    authorise_action,
)
from domain.errors import AuthorizationError
from domain.model import ResolvedChain
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
from domain.scopes import approve_need

NOT_REQUIRED = "authorization not required (TOOLEXEC_REQUIRE_AUTH=false)"


class ExternalEngine(Protocol):
    """An external ABAC engine (consumers.adapters.abac_client.HttpAbac)."""

    async def evaluate(self, request: AccessRequest) -> PolicyDecision: ...


class PolicySource(Protocol):
    """The policy view: every policy set in force (folded from `policy.updated`)."""

    def current(self) -> PolicyBundle | None: ...

    async def ready(self, timeout: float) -> bool: ...


@dataclass(frozen=True)
class AuthorizeDeps:
    """Ports of the authorize step. Without `policies` and `evaluator` only the
    capability token is checked."""

    clock: Clock
    require_auth: bool
    public_keys: Callable[[], Sequence[Any]]
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
    approval_ttl_seconds: float = 3600.0
    """How long a call that needs approval waits for one (then E3209)."""
    opener: TokenOpener | None = None
    """Opens the tokens producers sealed to this pipeline (contracts.token_seal)."""


async def authorize_request(request: Envelope, resolved: Envelope, chain: ResolvedChain,
                            deps: AuthorizeDeps) -> tuple[Envelope, ...]:
    """The decision on `request` (whose chain `resolved` recorded), caused by
    `resolved`: `(allow,)`, `(allow, tool.approval.requested)` or
    `(deny, tool.invoke.failed)`."""
    data: ChainResolved = resolved.data
    now = deps.clock()
    common = dict(
        invocation_id=data.invocation_id, tool_id=data.tool_id, version=data.version,
        chain=data.chain, parameters=data.parameters, deadline=data.deadline,
    )
    if not deps.require_auth:
        decision = PermissionDecided(decision="allow", reason=NOT_REQUIRED, enforced=False,
                                     **common)
        allowed = derive(resolved, decision, step="authorize", now=now)
        return _with_approval(allowed, chain, (), deps)
    try:
        capability = authorise(presented_token(request, deps), deps.public_keys(),
                               tool_id=data.tool_id, version=data.version,
                               now=int(now.timestamp()), verified=deps.verified)
        if deps.external is not None:
            policy = await _external_decision(capability, data, chain, deps,
                                              now=now.timestamp())
        else:
            if deps.policies is not None and not await deps.policies.ready(
                    deps.policy_wait_seconds):
                raise AuthorizationError("the policy view has not loaded the policies yet",
                                         code="E3205")
            policy = await _policy_decision(capability, data, chain, deps, now=now.timestamp())
    except AuthorizationError as error:
        subject = error.details.get("subject")  # known once the token was accepted
        denied = PermissionDecided(decision="deny", reason=error.message, enforced=True,
                                   error=error_info(error),
                                   subject=subject if isinstance(subject, str) else None,
                                   policy_version=error.details.get("policy_version"),
                                   **common)
        decision = derive(resolved, denied, step="authorize", now=now)
        return decision, denial_failure(decision, denied, now=now)
    reason = "capability token grants the tool"
    if policy is not None:
        reason += f"; {policy.reason}"
    allowed = PermissionDecided(
        decision="allow", reason=reason, enforced=True,
        subject=capability.subject, token_jti=capability.jti,
        policy_version=None if policy is None else policy.policy_version, **common,
    )
    return _with_approval(derive(resolved, allowed, step="authorize", now=now), chain,
                          () if policy is None else policy.approval, deps)


def _with_approval(allowed: Envelope, chain: ResolvedChain, policy_reasons: Sequence[str],
                   deps: AuthorizeDeps) -> tuple[Envelope, ...]:
    """The allow decision, followed by its approval request when the call needs one."""
    reasons = approval_reasons(policy_reasons, chain.leaf.manifest)
    if not reasons:
        return (allowed,)
    data: PermissionDecided = allowed.data
    integrity = data.chain[0].integrity
    requested = ApprovalRequested(
        invocation_id=data.invocation_id, tool_id=data.tool_id, version=data.version,
        integrity=integrity, parameters=data.parameters, subject=data.subject,
        policy_version=data.policy_version,
        call_hash=approval_hash_of(data), reasons=list(reasons),
        expires_at=expiry(allowed.time, deps.approval_ttl_seconds))
    return allowed, derive(allowed, requested, step="approval", now=allowed.time)


def approval_hash_of(decision: PermissionDecided) -> str:
    """The call hash of an allowed decision: what its approver must approve."""
    return call_hash(integrity=decision.chain[0].integrity, parameters=decision.parameters,
                     agent=decision.subject, policy_version=decision.policy_version)


def check_approver(decided: Envelope, tool_id: str, deps: AuthorizeDeps) -> None:
    """Check a `tool.approval.decided` may count for an invocation of `tool_id`: with
    authorization on, its `captoken` must grant the approve scope for `tool_id` to the
    subject it names as `decided_by`, checked as of the pipeline's clock, never the
    event's own `time` (which its producer chose: a backdated decision must not revive
    an expired token). Raises AuthorizationError (E3201-E3203 for the token, E3206 for
    the scope or another approver named). The token is read here and kept nowhere."""
    if not deps.require_auth:
        return
    lifetime = deps.verified.lifetime if deps.verified is not None else DEFAULT_LIFETIME
    capability = authorise_action(
        presented_token(decided, deps), deps.public_keys(), approve_need(tool_id),
        now=int(deps.clock().timestamp()), verified=deps.verified, lifetime=lifetime)
    if capability.subject != decided.data.decided_by:
        raise AuthorizationError(
            "the decision names another approver than its token's subject", code="E3206",
            details={"decided_by": decided.data.decided_by, "subject": capability.subject})


def presented_token(command: Envelope, deps: AuthorizeDeps) -> str | None:
    """The capability token on `command`: its `captoken`, opened when it is sealed to
    this pipeline. A sealed token that does not open for this very command (sealed for
    another one, as a token read off the topic and copied would be, or to another key)
    is E3203, as is one this pipeline holds no key for."""
    value = command.extensions.get("captoken")
    if value is None or not is_sealed(value):
        return value
    if deps.opener is None:
        raise AuthorizationError("the capability token is sealed, but this pipeline holds "
                                 "no token-sealing key (TOOLEXEC_TOKEN_SEAL_KEY)", code="E3203")
    try:
        return deps.opener.open(value, command)
    except SealBroken as broken:
        raise AuthorizationError(f"the sealed capability token does not open: {broken}",
                                 code="E3203") from None


def denial_failure(decision: Envelope, denied: PermissionDecided, *, now: Any) -> Envelope:
    """The terminal failure caused by the deny `decision` (the same id whenever it is
    derived again, e.g. by a run resumed between the two)."""
    assert denied.error is not None
    return failed(decision, denied.error, stage="authorize", invocation_id=denied.invocation_id,
                  tool_id=denied.tool_id, version=denied.version, now=now)


async def _policy_decision(capability: Capability, resolved: ChainResolved,
                           chain: ResolvedChain, deps: AuthorizeDeps, *,
                           now: float) -> PolicyDecision | None:
    """ABAC after the token; None when no policy engine is wired. Raises E3206 on deny."""
    if deps.policies is None or deps.evaluator is None:
        return None
    evaluator = deps.evaluator
    bundle = deps.policies.current()
    request = AccessRequest.build(capability.subject, _resource(chain), resolved.parameters,
                                  now=int(now))

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
                             chain: ResolvedChain, deps: AuthorizeDeps, *,
                             now: float) -> PolicyDecision:
    """The external engine's decision, through the decision cache; E3206 on deny."""
    assert deps.external is not None
    request = AccessRequest.build(capability.subject, _resource(chain), resolved.parameters,
                                  now=int(now))
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


def _resource(chain: ResolvedChain) -> ToolResource:
    leaf = chain.leaf
    return ToolResource.from_manifest(leaf.tool_id, leaf.version, leaf.manifest)
