"""Approving or denying a call that waits for an approver, and listing those calls.

The one producer of `tool.approval.decided`, for the CLI, the HTTP gateway and the MCP
server alike. The decision names the call hash the approver approves — by default the
hash of the call waiting, as the approvals read model shows it — and is sent to the
requests topic keyed by the invocation id, where the pipeline that owns the invocation
reads it. With authorization on, the approver's token needs the `approve` scope for the
tool (E3206 otherwise), its subject is who decided, and it rides on the decision as its
`captoken` (as on a request): the pipeline checks it again, since anyone who can write
the requests topic could write a decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts.events import ApprovalDecided
from domain.approval import Verdict
from domain.capability import Capability
from domain.errors import InvalidRequest, ToolexecError
from domain.scopes import approve_need, missing
from projections.queries import approval_of, pending_approvals
from toolexec import rights

if TYPE_CHECKING:
    from toolexec.client import InvocationClient

PENDING_LIMIT = 100


@dataclass(frozen=True)
class ApprovalOutcome:
    """What a decision did: `decided` (the event was sent; the pipeline takes the
    first decision whose approver may decide) or `already_ended` (nothing sent)."""

    invocation_id: str
    status: Literal["decided", "already_ended"]
    decision: Verdict | None = None
    approved_hash: str | None = None
    decided_by: str | None = None
    event_id: str | None = None
    ended_as: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def waiting_call(engine: AsyncEngine, invocation_id: str) -> dict[str, Any]:
    """The approvals read-model row of `invocation_id`; E3702 when its call never
    needed approval (or the read model has not folded it yet)."""
    async with engine.connect() as conn:
        row = await approval_of(conn, invocation_id)
    if row is None:
        raise _nothing_waits(invocation_id)
    return row


def _nothing_waits(invocation_id: str) -> ToolexecError:
    return ToolexecError("no call waiting for approval with this invocation id",
                         code="E3702", details={"invocation_id": invocation_id})


async def decide_approval(client: InvocationClient, invocation_id: str,
                          row: Mapping[str, Any] | None, *, verdict: Verdict,
                          capability: Capability | None, token: str | None,
                          front_end: str, reason: str | None = None,
                          approved_hash: str | None = None) -> ApprovalOutcome:
    """Approve or deny the waiting call of `invocation_id`, whose approvals row is `row`
    (None when no read model is at hand: then `approved_hash` is required and the
    pipeline ignores the decision if nothing waits). `approved_hash` defaults to the
    row's call hash. Who decided: the capability's subject (verified from `token`),
    else `front_end`.

    Raises E3702 (nothing waits for approval under that id), E3206 (no approve scope
    for the tool), E3004 (a malformed hash), InvocationNotDelivered (E3001)."""
    if row is None:
        if approved_hash is None:
            raise _nothing_waits(invocation_id)
    else:
        rights.demand(capability, [approve_need(str(row["tool_id"]))])
        if row["outcome"] is not None:
            return ApprovalOutcome(invocation_id, "already_ended", ended_as=row["error_code"]
                                   or row["outcome"])
    chosen = approved_hash if approved_hash is not None else str(row["call_hash"])  # type: ignore[index]
    decided_by = capability.subject if capability is not None else front_end
    try:
        data = ApprovalDecided(invocation_id=invocation_id, decision=verdict,
                               approved_hash=chosen, decided_by=decided_by, reason=reason)
    except ValidationError as error:
        raise InvalidRequest("the approved hash must be sha256:<64 hex digits>",
                             details={"approved_hash": chosen,
                                      "errors": error.errors(include_url=False,
                                                             include_context=False)}
                             ) from error
    event = await client.command(data, token=token if capability is not None else None)
    return ApprovalOutcome(invocation_id, "decided", decision=verdict, approved_hash=chosen,
                           decided_by=decided_by, event_id=event.id)


async def list_pending(engine: AsyncEngine, capability: Capability | None, *,
                       limit: int = PENDING_LIMIT) -> list[dict[str, Any]]:
    """The calls waiting for an approver (oldest first) that `capability` may decide,
    or made as its subject; every one with authorization off (None)."""
    async with engine.connect() as conn:
        rows = await pending_approvals(conn, limit=limit)
    return [_shown(row) for row in rows if _visible(row, capability)]


def _visible(row: Mapping[str, Any], capability: Capability | None) -> bool:
    if capability is None or row["subject"] == capability.subject:
        return True
    return missing(capability.scopes, approve_need(str(row["tool_id"]))) is None


def _shown(row: Mapping[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in (
        "invocation_id", "tool_id", "version", "integrity", "subject", "policy_version", "call_hash",
        "parameters", "reasons", "requested_at", "expires_at", "decision", "decided_by")}
