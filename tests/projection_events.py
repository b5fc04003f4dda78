"""Event builders for the projection tests: a small, realistic log."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from contracts.envelope import Envelope, derived_event_id, new_envelope
from contracts.errors import ErrorInfo
from contracts.events import (
    ApprovalDecided,
    ApprovalReceived,
    ApprovalRequested,
    ChainLink,
    ChainResolved,
    CircuitStateChanged,
    DefinitionChange,
    EventData,
    ExecutionCheckpointed,
    ExecutionFinished,
    ExecutionProgressed,
    ExecutionStarted,
    InvokeCompleted,
    InvokeFailed,
    InvokeRequested,
    PermissionDecided,
    PublishedFile,
    ToolDefinitionApproved,
    ToolDefinitionDrifted,
    ToolDefinitionPinned,
    ToolLifecycleChanged,
    ToolPublished,
)

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
INTEGRITY = "sha256:" + "ab" * 32


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def envelope(data: EventData, key: str, *, when: datetime = T0, id: str | None = None,
             cause: str | None = None, extensions: dict[str, str] | None = None) -> Envelope:
    return new_envelope(data, source="urn:test", partitionkey=key, correlationid=key, time=when,
                        id=id or derived_event_id(f"{key}:{cause}:{when}", data.EVENT_TYPE),
                        causationid=cause, extensions=extensions)


def published(tool_id: str, version: str, *, tags: list[str] | None = None,
              description: str = "A tool", when: datetime = T0,
              integrity: str = INTEGRITY) -> Envelope:
    manifest: dict[str, Any] = {"tool_id": tool_id, "version": version, "tool_type": "script",
                                "executor": "python_runtime", "description": description}
    if tags is not None:
        manifest["tags"] = tags
    files = [PublishedFile(path="main.py", sha256="cd" * 32, is_executable=False, size=3,
                           content_b64gz=base64.b64encode(b"gz-bytes").decode())]
    data = ToolPublished(tool_id=tool_id, version=version, tool_type="script",
                         executor="python_runtime", manifest=manifest, files=files,
                         integrity=integrity, published_by="alice")
    return envelope(data, tool_id, when=when, id=f"pub-{tool_id}-{version}-{integrity[-4:]}")


def lifecycle(tool_id: str, state: str, version: str | None = None, *,
              when: datetime = T0) -> Envelope:
    data = ToolLifecycleChanged(tool_id=tool_id, version=version, lifecycle=state,
                                reason="superseded")
    return envelope(data, tool_id, when=when, id=f"life-{tool_id}-{version}-{state}-{when}")


def captoken(sub: str, jti: str) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part({'sub': sub, 'jti': jti})}.c2ln"


def invocation(invocation_id: str, tool_id: str = "py_echo", *, outcome: str = "completed",
               start: float = 0.0, token: str | None = None,
               parameters: dict[str, Any] | None = None,
               subject: str = "bob", reports: int = 0,
               approval: str | None = None, received: bool = True) -> list[Envelope]:
    """The events of one invocation, from request to its terminal event; a running
    attempt makes `reports` progress reports, each followed by a checkpoint; with
    `approval` ("approve" or "deny") its call waits for an approver who answers so,
    and the pipeline notes the decision it received unless `received` is false."""
    link = ChainLink(tool_id=tool_id, version="1.0.0", integrity=INTEGRITY, tool_type="script",
                     executor=None)
    params = parameters or {"text": "hi"}
    extensions = {"captoken": token} if token else None
    requested = envelope(InvokeRequested(invocation_id=invocation_id, tool_id=tool_id,
                                         parameters=params, requested_by="agent-7"),
                         invocation_id, when=at(start), id=f"req-{invocation_id}",
                         extensions=extensions)
    events = [requested]

    def follow(data: EventData, dt: float) -> None:
        events.append(envelope(data, invocation_id, when=at(start + dt), cause=events[-1].id))

    follow(ChainResolved(invocation_id=invocation_id, tool_id=tool_id, version="1.0.0",
                         chain=[link], parameters=params), 0.01)
    if outcome == "denied":
        follow(PermissionDecided(invocation_id=invocation_id, tool_id=tool_id, version="1.0.0",
                                 decision="deny", reason="no", enforced=True, chain=[link],
                                 error=ErrorInfo(code="E3204", message="not in token")), 0.02)
        follow(InvokeFailed(invocation_id=invocation_id, tool_id=tool_id, version="1.0.0",
                            error=ErrorInfo(code="E3204", message="not in token"),
                            stage="authorize"), 0.03)
        return events
    follow(PermissionDecided(invocation_id=invocation_id, tool_id=tool_id, version="1.0.0",
                             decision="allow", reason="ok", enforced=True, subject=subject,
                             token_jti="j1", chain=[link], parameters=params), 0.02)
    if approval is not None:
        follow(ApprovalRequested(invocation_id=invocation_id, tool_id=tool_id, version="1.0.0",
                                 integrity=INTEGRITY, parameters=params, subject=subject,
                                 call_hash="sha256:" + "77" * 32, reasons=["needs-approval"],
                                 expires_at=at(start + 3600)), 0.025)
        events.append(envelope(ApprovalDecided(invocation_id=invocation_id, decision=approval,
                                               approved_hash="sha256:" + "77" * 32,
                                               decided_by="did:example:ops"),
                               invocation_id, when=at(start + 0.027),
                               id=f"decided-{invocation_id}"))
        if received:
            follow(ApprovalReceived(invocation_id=invocation_id, decision_id=events[-1].id,
                                    decision=approval, approved_hash="sha256:" + "77" * 32,
                                    decided_by="did:example:ops"), 0.028)
    if approval == "deny":
        follow(InvokeFailed(invocation_id=invocation_id, tool_id=tool_id, version="1.0.0",
                            error=ErrorInfo(code="E3208", message="Approval denied"),
                            stage="authorize"), 0.03)
        return events
    follow(ExecutionStarted(invocation_id=invocation_id, attempt=1, tool_id=tool_id,
                            version="1.0.0", primitive="subprocess", sandbox="none",
                            plan_summary={"argv": ["python3", "main.py"]}), 0.03)
    for step in range(reports):
        follow(ExecutionProgressed(invocation_id=invocation_id, attempt=1, sequence=step,
                                   fraction=(step + 1) / reports,
                                   message=f"step {step + 1} of {reports}"), 0.031 + step / 1000)
        follow(ExecutionCheckpointed(invocation_id=invocation_id, attempt=1, sequence=step,
                                     state_hash=f"sha256:{step:064x}", size=100 + step,
                                     stored_size=40 + step, compression="gzip"),
               0.0315 + step / 1000)
    ok = outcome == "completed"
    follow(ExecutionFinished(invocation_id=invocation_id, attempt=1, tool_id=tool_id,
                             version="1.0.0", outcome="success" if ok else "failure",
                             duration_ms=12.5,
                             error=None if ok else ErrorInfo(code="E3401", message="exit 1")),
           0.05)
    if ok:
        follow(InvokeCompleted(invocation_id=invocation_id, tool_id=tool_id, version="1.0.0",
                               result={"echo": "hi", "contact": "bob@example.com"},
                               duration_ms=12.5, attempts=1), 0.06)
    else:
        follow(InvokeFailed(invocation_id=invocation_id, tool_id=tool_id, version="1.0.0",
                            error=ErrorInfo(code="E3401", message="exit 1"), stage="execute"),
               0.06)
    return events


def circuit(service_id: str, from_state: str, to_state: str, *, failures: int = 0,
            when: datetime = T0) -> Envelope:
    data = CircuitStateChanged(service_id=service_id, from_state=from_state, to_state=to_state,
                               failure_count=failures, success_count=0, since=when,
                               reason="threshold")
    return envelope(data, service_id, when=when, id=f"cb-{service_id}-{when}-{to_state}")


def definition_log(server_tool_id: str, tool: str = "echo", *,
                   start: float = 0.0) -> list[Envelope]:
    """A server's tool pinned on first use, a racing executor's later pin (which loses),
    a drift, the same drift seen again, its approval, and a second drift."""
    first, second, third = (f"sha256:{c * 64}" for c in "abc")

    def pinned(digest: str, seconds: float) -> Envelope:
        data = ToolDefinitionPinned(server_tool_id=server_tool_id, server_version="1.0.0",
                                    server_integrity=INTEGRITY, mcp_tool_name=tool,
                                    definition_hash=digest,
                                    definition={"name": tool, "description": digest[-4:]})
        return envelope(data, server_tool_id, when=at(start + seconds),
                        id=f"pin-{server_tool_id}-{digest[-4:]}")

    def drifted(previous: str, digest: str, seconds: float) -> Envelope:
        data = ToolDefinitionDrifted(
            server_tool_id=server_tool_id, server_version="1.0.1", server_integrity=INTEGRITY,
            mcp_tool_name=tool, previous_hash=previous, definition_hash=digest,
            definition={"name": tool, "description": digest[-4:]},
            diff=[DefinitionChange(path="/description", change="changed",
                                   old=previous[-4:], new=digest[-4:])])
        return envelope(data, server_tool_id, when=at(start + seconds),
                        id=f"drift-{server_tool_id}-{previous[-4:]}-{digest[-4:]}")

    approval = envelope(ToolDefinitionApproved(
        server_tool_id=server_tool_id, mcp_tool_name=tool, previous_hash=first,
        definition_hash=second, definition={"name": tool, "description": second[-4:]},
        approved_by="did:example:ops"), server_tool_id, when=at(start + 3),
        id=f"approve-{server_tool_id}-{second[-4:]}")
    drift = drifted(first, second, 2)
    return [pinned(first, 0), pinned(second, 0.5), drift, drift, approval,
            drifted(second, third, 4)]
