"""Step 2 — authorize: tool.chain.resolved -> tool.permission.decided (+ failure on deny).

The capability token rides only on tool.invoke.requested (extension `captoken`) and
is never copied into derived events, so this step remembers tokens of requests it
has seen, in log order, until the matching chain.resolved arrives (same partition,
same consumer group, so the request is always seen first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from consumers.events import derive, error_info, failed
from consumers.ports import Clock, Publish
from contracts.envelope import Envelope
from contracts.events import ChainResolved, InvokeRequested, PermissionDecided
from domain.capability import authorise
from domain.errors import AuthorizationError

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


@dataclass(frozen=True)
class AuthorizeDeps:
    publish: Publish
    clock: Clock
    require_auth: bool
    public_keys: Callable[[], Sequence[Any]]
    pending: PendingTokens


async def on_invoke_requested(event: Envelope, deps: AuthorizeDeps) -> None:
    request: InvokeRequested = event.data
    if deps.require_auth:
        deps.pending.remember(request.invocation_id, event.extensions.get("captoken"))


async def on_chain_resolved(event: Envelope, deps: AuthorizeDeps) -> None:
    resolved: ChainResolved = event.data
    now = deps.clock()
    common = dict(
        invocation_id=resolved.invocation_id, tool_id=resolved.tool_id,
        version=resolved.version, chain=resolved.chain, parameters=resolved.parameters,
    )
    if not deps.require_auth:
        decision = PermissionDecided(decision="allow", reason=NOT_REQUIRED, enforced=False, **common)
        await deps.publish(derive(event, decision, step="authorize", now=now))
        return
    seen, token = deps.pending.take(resolved.invocation_id)
    try:
        if not seen:
            raise AuthorizationError(
                "the request's capability token is no longer available to this consumer "
                "(restarted between request and resolution); resubmit the invocation",
                code="E3203",
            )
        capability = authorise(token, deps.public_keys(), tool_id=resolved.tool_id,
                               version=resolved.version, now=int(now.timestamp()))
    except AuthorizationError as error:
        decision = PermissionDecided(decision="deny", reason=error.message, enforced=True,
                                     error=error_info(error), **common)
        await deps.publish(derive(event, decision, step="authorize", now=now))
        await deps.publish(failed(event, error, stage="authorize",
                                  invocation_id=resolved.invocation_id,
                                  tool_id=resolved.tool_id, version=resolved.version, now=now))
        return
    decision = PermissionDecided(
        decision="allow", reason="capability token grants the tool", enforced=True,
        subject=capability.subject, token_jti=capability.jti, **common,
    )
    await deps.publish(derive(event, decision, step="authorize", now=now))
