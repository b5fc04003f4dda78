"""Request and response bodies of the HTTP gateway (they make its OpenAPI document)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from contracts.events import PublisherSignature

InvocationStatus = Literal["requested", "resolved", "authorized", "running", "completed",
                           "failed", "cancelled"]


class InvokeRequest(BaseModel):
    """`POST /v1/tools/invoke`: which tool, with what, and whether to wait."""

    model_config = ConfigDict(extra="forbid")

    tool_id: str = Field(min_length=1, max_length=200, description="Tool to run.")
    tool_version: str = Field(default="*", min_length=1, max_length=200,
                              description="Semver range or exact version; ignored with a lockfile.")
    parameters: dict[str, JsonValue] = Field(default_factory=dict,
                                             description="Tool parameters (a JSON object).")
    lockfile: dict[str, JsonValue] | None = Field(
        default=None, description="A lockfile (`toolexec lock`) pinning the chain.")
    execution_mode: Literal["sync", "async"] = Field(
        default="sync", description="sync: answer with the result; async: answer 202 at once.")
    timeout_seconds: float | None = Field(
        default=None, gt=0, le=3600,
        description="Longest a sync call waits (default: the tool's timeout and retries).")
    callback_url: str | None = Field(
        default=None, max_length=2000,
        description="Also POST the terminal result there once, signed (HMAC-SHA256 header "
        "`Toolexec-Signature`); only hosts the operator allows (E3406), an http(s) URL "
        "without credentials (E3004).")


class InvokeResult(BaseModel):
    """A completed invocation's result (sync mode)."""

    invocation_id: str
    status: Literal["completed"] = "completed"
    tool_id: str
    version: str
    result: JsonValue = Field(description="Validated, redacted result.")
    duration_ms: float = Field(description="Wall time of the final attempt.")
    attempts: int
    execution_time_ms: float = Field(description="Wall time seen by the gateway.")


class InvokeAccepted(BaseModel):
    """An invocation accepted in async mode: poll `status_url`."""

    invocation_id: str
    status: Literal["requested"] = "requested"
    status_url: str


class CancelRequest(BaseModel):
    """`POST /v1/invocations/{id}/cancel`: an optional reason, kept in the event."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=500, description="Why.")


class ApprovalDecisionRequest(BaseModel):
    """`POST /v1/invocations/{id}/approval`: approve or deny the call waiting."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "deny"] = Field(description="The approver's answer.")
    reason: str | None = Field(default=None, max_length=500, description="Why.")
    approved_hash: str | None = Field(
        default=None, max_length=100, description="The call hash approved (`sha256:<hex>`); "
        "default: the hash of the call waiting, as `GET /v1/approvals` lists it.")


class ApprovalDecisionAnswer(BaseModel):
    """The decision sent (`decided`; the first decision of an approver with the approve
    scope counts), or nothing sent: the invocation has ended (`already_ended`)."""

    invocation_id: str
    status: Literal["decided", "already_ended"]
    decision: Literal["approve", "deny"] | None = None
    approved_hash: str | None = None
    decided_by: str | None = None
    event_id: str | None = Field(default=None, description="Id of the tool.approval.decided.")
    ended_as: str | None = None
    status_url: str


class PendingApproval(BaseModel):
    """A call waiting for an approver."""

    invocation_id: str
    tool_id: str | None
    version: str | None
    integrity: str | None = Field(description="Integrity of the tool version called.")
    subject: str | None = Field(description="The agent that made the call.")
    policy_version: str | None
    call_hash: str | None = Field(description="What an approver approves.")
    parameters: Any = Field(description="The call's parameters (redacted).")
    reasons: list[str] | None = Field(description="What requires the approval.")
    requested_at: str | None
    expires_at: str | None
    decision: str | None = Field(description="The first decision sent, not applied yet.")
    decided_by: str | None


class ApprovalList(BaseModel):
    approvals: list[PendingApproval]
    count: int


class CancelAccepted(BaseModel):
    """A cancel request on the log (the invocation ends as cancelled unless it ends
    first), or nothing to do: the invocation had already ended (`ended_as`)."""

    invocation_id: str
    status: Literal["cancel_requested", "already_ended"] = "cancel_requested"
    event_id: str | None = Field(
        default=None, description="Id of the tool.invoke.cancel.requested event; None when "
        "the invocation had already ended and nothing was written.")
    ended_as: str | None = Field(
        default=None, description="How it ended (completed, failed, cancelled) when it "
        "had already ended.")
    status_url: str


class InvocationError(BaseModel):
    code: str
    message: str
    stage: str | None = None


class InvocationProgress(BaseModel):
    """The newest `tool.execution.progressed` of an invocation."""

    sequence: int = Field(description="Report number within the invocation, from 0.")
    fraction: float | None = Field(description="Share of the work done, 0..1, when known.")
    message: str = Field(description="What the tool is doing (scrubbed, redacted).")
    at: str | None = Field(description="When it was reported.")


class CheckpointTotals(BaseModel):
    """The `tool.execution.checkpointed` events of an invocation, summed."""

    count: int = 0
    bytes: int = Field(default=0, description="Canonical JSON bytes of every state.")
    stored_bytes: int = Field(default=0, description="Bytes stored (compressed, delta).")
    last_state_hash: str | None = None


class InvocationView(BaseModel):
    """One invocation as the invocations read model holds it."""

    invocation_id: str
    status: InvocationStatus
    tool_id: str | None = None
    version_range: str | None = None
    version: str | None = None
    subject: str | None = None
    requested_by: str | None = None
    attempts: int = 0
    duration_ms: float | None = None
    requested_at: str | None = None
    updated_at: str | None = None
    finished_at: str | None = None
    cancel_requested: bool = False
    result: JsonValue = Field(default=None, description="The (redacted) result when completed "
                              "and it fits the read model's summary.")
    result_summary: str | None = Field(default=None, description="Redacted result text, "
                                       "truncated to 500 characters.")
    error: InvocationError | None = None
    timeline: list[dict[str, JsonValue]] = Field(default_factory=list,
                                                 description="Every event, in log order.")
    progress: InvocationProgress | None = Field(
        default=None, description="The latest progress report of a running tool (None "
        "before any).")
    checkpoints: CheckpointTotals = Field(
        default_factory=lambda: CheckpointTotals(),
        description="The checkpoints the tool saved so far.")


class RegisterFile(BaseModel):
    """One file of a tool: text in `content`, or bytes in `content_base64`."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, max_length=500, description="Relative POSIX path.")
    content: str | None = Field(default=None, description="UTF-8 text content.")
    content_base64: str | None = Field(default=None, description="Standard base64 content.")
    is_executable: bool = False


class RegisterRequest(BaseModel):
    """`POST /v1/tools/register`: a tool source, validated and published like
    `toolexec publish`."""

    model_config = ConfigDict(extra="forbid")

    manifest: dict[str, JsonValue] = Field(description="The manifest (tool.yaml as JSON).")
    files: list[RegisterFile] = Field(default_factory=list, description="The tool's files "
                                      "(at most TOOLEXEC_MAX_TOOL_FILES, E3105 past it).")
    publisher_signature: PublisherSignature | None = Field(
        default=None, description="The publisher's signature over the version's integrity, "
        "made client-side (`toolexec integrity PATH --sign-key KEY --json`); recorded in "
        "tool.published. 403 E3107 when it does not verify against the integrity.")


class RegisterResult(BaseModel):
    tool_id: str
    version: str
    integrity: str
    event_id: str = Field(description="The tool.published event (the first one when the "
                          "version was already published with these contents).")
    status: Literal["published", "unchanged"] = Field(
        default="published", description="unchanged: already published with these contents.")
    executor_pin: str | None = Field(
        default=None, description="The executor version this version runs on (tool@version).")


class LifecycleRequest(BaseModel):
    """`POST /v1/tools/{tool_id}/lifecycle`: move one version (or every one) to a state."""

    model_config = ConfigDict(extra="forbid")

    version: str | None = Field(default=None, min_length=1, max_length=200,
                                description="Exact version; null = every version "
                                            "(not allowed with removed).")
    state: Literal["active", "deprecated", "sunset", "removed"] = Field(
        description="deprecated/sunset still run with a warning; removed fails with E3104.")
    reason: str | None = Field(default=None, max_length=2000, description="Why.")
    replacement: str | None = Field(default=None, min_length=1, max_length=200,
                                    description="Tool to use instead (TOOL or TOOL@RANGE).")


class LifecycleResult(BaseModel):
    tool_id: str
    version: str | None
    state: str
    reason: str | None
    replacement: str | None
    event_ids: list[str] = Field(description="tool.lifecycle.changed events emitted (one per "
                                             "version when some were removed before).")


class DefinitionList(BaseModel):
    definitions: list[dict[str, Any]] = Field(
        description="Pinned MCP tool definitions: server, tool, state (pinned, drifted), "
                    "hash, definition, and the drifts waiting for approval with their diff.")


class DefinitionApproval(BaseModel):
    """`POST /v1/definitions/{target}/approve`: approve one drifted definition."""

    model_config = ConfigDict(extra="forbid")

    definition_hash: str = Field(min_length=1, max_length=200,
                                 description="The drifted definition's hash (sha256:...).")
    reason: str | None = Field(default=None, max_length=2000, description="Why.")


class DefinitionApproved(BaseModel):
    status: Literal["approved", "already_approved"]
    event_id: str | None = Field(description="The tool.definition.approved event (None when "
                                             "the hash was the approved one already).")
    applied: bool = Field(description="Whether the read model showed the new pin in time.")
    definition: dict[str, Any] = Field(description="The tool's pin, as GET /v1/definitions "
                                                   "shows it.")


class ToolList(BaseModel):
    tools: list[dict[str, Any]]
    mode: str | None = Field(default=None, description="How the tools were ranked: list "
                             "(no query, by id), lexical (full text) or hybrid (full text "
                             "and vectors).")
    total: int | None = Field(default=None, description="Matches in all (paging).")
    warning: str | None = Field(default=None, description="Why the ranking is not the one "
                                "asked for (E3106: the embeddings endpoint failed).")


class ToolDetail(BaseModel):
    tool: dict[str, Any]


class InvocationList(BaseModel):
    invocations: list[InvocationView]
    count: int
    limit: int


class AuditPage(BaseModel):
    records: list[dict[str, Any]] = Field(description="Redacted CloudEvent documents with "
                                          "their position in the log and hash chain.")
    count: int
    limit: int


class CircuitList(BaseModel):
    circuits: list[dict[str, Any]]


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    checks: dict[str, dict[str, Any]]
