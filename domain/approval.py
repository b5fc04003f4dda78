"""Approvals: a call that a policy or its manifest marks as needing a person's yes.

An approval is bound to the exact call: the hash of (the leaf tool version's
integrity, the parameters, the agent, the policy version) in RFC 8785 canonical JSON.
An approver approves that hash; the invocation runs only when the hash they approved
is the hash of the call waiting, before the approval expires.

Who may require approval: the operator, through a Cedar `permit` annotated
`@approval("required")` (any such permit that matches the request makes its call need
approval), and a tool's manifest (`approval: {required: true}`), which can only make a
call stricter: nothing here lifts a requirement.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from domain.canonical_json import canonical_json
from domain.errors import ApprovalDenied, ApprovalExpired, ApprovalMismatch
from domain.integrity import sha256_ref

ANNOTATION = "approval"
"""The Cedar annotation a permit carries to require approval: `@approval("required")`."""
REQUIRED = "required"
MANIFEST_REASON = "the tool's manifest requires approval"

Verdict = Literal["approve", "deny"]


def call_hash(*, integrity: str, parameters: Mapping[str, Any], agent: str | None,
              policy_version: str | None) -> str:
    """`sha256:<hex>` of the call's canonical JSON: what an approver approves."""
    document = {"integrity": integrity, "parameters": dict(parameters), "agent": agent,
                "policy_version": policy_version}
    return sha256_ref(canonical_json(document))


def manifest_requires_approval(manifest: Mapping[str, Any]) -> bool:
    """Whether the manifest asks for approval (`approval: {required: true}`)."""
    approval = manifest.get("approval")
    return isinstance(approval, Mapping) and approval.get("required") is True


def requires_approval(annotations: Mapping[str, str]) -> bool:
    """Whether a Cedar policy's annotations require approval."""
    return annotations.get(ANNOTATION) == REQUIRED


def approval_reasons(policy_reasons: Iterable[str],
                     manifest: Mapping[str, Any]) -> tuple[str, ...]:
    """Why the call needs approval: the requiring policies (named by the evaluator),
    then the manifest; empty when it needs none."""
    reasons = tuple(policy_reasons)
    if manifest_requires_approval(manifest):
        reasons += (MANIFEST_REASON,)
    return reasons


def expiry(now: datetime, seconds: float) -> datetime:
    """When an approval requested at `now` expires."""
    return now + timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class Decision:
    """An approver's answer, as the pipeline read it."""

    verdict: Verdict
    approved_hash: str
    decided_by: str
    decided_at: datetime
    reason: str | None = None


def check_approval(expected_hash: str, expires_at: datetime, decision: Decision | None,
                   now: datetime) -> bool:
    """Whether the waiting call may run now: True when approved for exactly this call
    in time, False when it still waits. Raises ApprovalDenied, ApprovalExpired (no
    decision made before the expiry, and the expiry passed) or ApprovalMismatch."""
    in_time = decision is not None and decision.decided_at < expires_at
    if decision is None or not in_time:
        if now >= expires_at:
            raise ApprovalExpired("Approval expired", details={
                "expires_at": expires_at.isoformat(),
                "late_decision": decision is not None})
        return False
    details: dict[str, Any] = {"decided_by": decision.decided_by}
    if decision.reason:
        details["reason"] = decision.reason
    if decision.verdict == "deny":
        raise ApprovalDenied("Approval denied", details=details)
    if decision.approved_hash != expected_hash:
        raise ApprovalMismatch("Approval does not match the call", details={
            **details, "approved_hash": decision.approved_hash, "call_hash": expected_hash})
    return True
