"""Wire contracts: one frozen pydantic model per CloudEvent type (the event catalog: contracts/schemas/).

Each model is the `data` of a CloudEvent whose `type` is the model's `EVENT_TYPE`.
Contracts are versioned: a model's shape is fixed once released. A compatible
addition (a new optional field) keeps the type and bumps nothing; any other change
(renaming, removing, retyping or making a field required) is a new version — either
a new type name (``tool.published.v2``) or a new `SCHEMA_VERSION`, which changes the
CloudEvent ``dataschema`` (``urn:toolexec:schema:<type>:v<version>``) and the exported
JSON Schema's ``$id``. Exported schemas in ``contracts/schemas/`` must match these
models (a test fails on drift; regenerate with ``python -m contracts.export``).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue

from contracts.errors import ErrorInfo

NonEmpty = Annotated[str, Field(min_length=1)]
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Integrity = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
JsonObject = dict[str, JsonValue]

ToolType = Literal[
    "primitive", "runtime", "script", "api", "mcp_server", "mcp_tool", "knowledge", "directive"
]
Lifecycle = Literal["active", "deprecated", "sunset", "removed"]
CircuitState = Literal["closed", "open", "half_open"]


def dataschema_uri(event_type: str, version: str) -> str:
    """The CloudEvent ``dataschema`` / JSON Schema ``$id`` of one contract version."""
    return f"urn:toolexec:schema:{event_type}:v{version}"


class EventData(BaseModel):
    """Base of every contract: frozen, unknown fields rejected, type name attached."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    EVENT_TYPE: ClassVar[str]
    SCHEMA_VERSION: ClassVar[str] = "1"
    READABLE_SCHEMA_VERSIONS: ClassVar[tuple[str, ...]] = ()
    """Earlier versions whose records this model still reads (logs outlive releases)."""


# --- toolexec.registry ---------------------------------------------------------------


class PublishedFile(BaseModel):
    """One file of a published tool, content included (gzip, then base64)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: NonEmpty = Field(description="Relative POSIX path inside the tool.")
    sha256: Sha256Hex = Field(description="Lower-case hex sha256 of the uncompressed bytes.")
    is_executable: bool = Field(description="Whether the file carries the executable bit.")
    size: int = Field(ge=0, description="Size in bytes of the uncompressed content.")
    content_b64gz: str = Field(description="Standard base64 of the gzip-compressed bytes.")


class ExecutorPin(BaseModel):
    """The exact executor version a tool version runs on, fixed when it was published."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool_id: NonEmpty = Field(description="tool_id of the executor.")
    version: NonEmpty = Field(description="Exact version of the executor.")
    integrity: Integrity = Field(description="Integrity of that executor version.")


class PublisherSignature(BaseModel):
    """A publisher's Ed25519 signature over a version's integrity."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str = Field(pattern=r"^ed25519:[A-Za-z0-9_-]{43}$",
                        description="`ed25519:` + the publisher's raw public key, unpadded "
                                    "base64url.")
    signature: str = Field(pattern=r"^[A-Za-z0-9_-]{86}$",
                           description="Ed25519 signature over `toolexec.tool.published/v1\\n` "
                                       "+ integrity, unpadded base64url.")


class ToolPublished(EventData):
    """A tool version entered the registry; the log alone can rebuild it and its files.

    v2 adds `executor_pin`; v1 records (no pin) are still read: their executor is
    resolved by its range at each invocation, as before pins existed. v3 adds
    `publisher_signature`; v1 and v2 records read as unsigned."""

    EVENT_TYPE: ClassVar[str] = "tool.published"
    SCHEMA_VERSION: ClassVar[str] = "3"
    READABLE_SCHEMA_VERSIONS: ClassVar[tuple[str, ...]] = ("1", "2")

    tool_id: NonEmpty = Field(description="Registry id of the tool.")
    version: NonEmpty = Field(description="Semantic version of this publication.")
    tool_type: ToolType = Field(description="Tool type (manifest-driven validation seed).")
    executor: str | None = Field(description="tool_id of the parent executor; None for primitives.")
    executor_pin: ExecutorPin | None = Field(
        default=None,
        description="The executor version (and integrity) active when this version was "
                    "published; it runs on exactly that one. None for primitives and for "
                    "records written before pins existed.")
    manifest: JsonObject = Field(description="The normalised manifest as published.")
    files: list[PublishedFile] = Field(description="Every file of the tool, sorted by path.")
    integrity: Integrity = Field(
        description="sha256 over RFC 8785 JSON of {tool_id, version, manifest, files}."
    )
    published_by: str | None = Field(default=None, description="Who published (subject).")
    source: str | None = Field(default=None, description="Where it came from (path, URL).")
    publisher_signature: PublisherSignature | None = Field(
        default=None, description="The publisher's signature over `integrity`; None when "
                                  "published unsigned.")


class ValidationIssue(BaseModel):
    """One validation finding: JSON path into the manifest or file tree, and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(description="JSON path of the offending element, e.g. '$.parameters'.")
    message: str = Field(description="What is wrong.")
    severity: Literal["error", "warning"] = Field(default="error", description="Finding level.")


class ToolPublishRejected(EventData):
    """A publication attempt failed validation (E3105) or sealing."""

    EVENT_TYPE: ClassVar[str] = "tool.publish.rejected"

    tool_id: str | None = Field(description="tool_id from the manifest, if it had one.")
    version: str | None = Field(description="version from the manifest, if it had one.")
    origin: str = Field(description="Where the rejected source came from (path, URL).")
    issues: list[ValidationIssue] = Field(description="Every finding that blocked publishing.")
    error: ErrorInfo = Field(description="The failure, usually E3105.")


class ToolLifecycleChanged(EventData):
    """A tool (one version or all) moved to another lifecycle state."""

    EVENT_TYPE: ClassVar[str] = "tool.lifecycle.changed"

    tool_id: NonEmpty = Field(description="Registry id of the tool.")
    version: str | None = Field(default=None, description="Version affected; None = all.")
    lifecycle: Lifecycle = Field(description="The new lifecycle state.")
    reason: str | None = Field(default=None, description="Why it changed.")
    replacement_tool_id: str | None = Field(default=None, description="Tool to use instead.")


class DefinitionChange(BaseModel):
    """One changed leaf of an MCP tool definition (objects compared key by key)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(description="JSON Pointer into the definition, e.g. '/description'.")
    change: Literal["added", "removed", "changed", "truncated"] = Field(
        description="What happened there ('truncated': more changes were left out).")
    old: JsonValue = Field(default=None, description="The value before (None when added).")
    new: JsonValue = Field(default=None, description="The value now (None when removed).")


class _AnnouncedBy(EventData):
    """Fields of a definition event that name the server and tool that announced it."""

    server_tool_id: NonEmpty = Field(description="tool_id of the mcp_server; the partition key.")
    server_version: NonEmpty = Field(description="Version of the server that announced it.")
    server_integrity: Integrity = Field(description="Integrity of that server version.")
    mcp_tool_name: NonEmpty = Field(description="The tool's name on the server.")


class ToolDefinitionPinned(_AnnouncedBy):
    """An MCP server's definition of one of its tools, seen for the first time, is
    pinned (trust on first use): later calls run only while it announces this hash.
    When several are written for one tool, the first in the log is the pin."""

    EVENT_TYPE: ClassVar[str] = "tool.definition.pinned"

    definition_hash: Integrity = Field(description="sha256 of the definition's RFC 8785 JSON.")
    definition: JsonObject = Field(description="name, title, description, inputSchema, "
                                   "outputSchema, annotations as announced.")


class ToolDefinitionDrifted(_AnnouncedBy):
    """A server announces another definition of a pinned tool: calls to it are refused
    (E3108) until a person approves the new hash."""

    EVENT_TYPE: ClassVar[str] = "tool.definition.drifted"

    previous_hash: Integrity = Field(description="The pinned (approved) definition's hash.")
    definition_hash: Integrity = Field(description="The announced definition's hash.")
    definition: JsonObject = Field(description="The announced definition.")
    diff: list[DefinitionChange] = Field(description="What changed from the pinned one.")


class ToolDefinitionApproved(EventData):
    """A person approved a drifted definition: it becomes the tool's pin."""

    EVENT_TYPE: ClassVar[str] = "tool.definition.approved"

    server_tool_id: NonEmpty = Field(description="tool_id of the mcp_server; the partition key.")
    mcp_tool_name: NonEmpty = Field(description="The tool's name on the server.")
    previous_hash: Integrity | None = Field(description="The pin it replaces.")
    definition_hash: Integrity = Field(description="The approved definition's hash.")
    definition: JsonObject = Field(description="The approved definition (as it drifted).")
    approved_by: str | None = Field(default=None, description="Token subject of the approver; "
                                    "None when authorization is off (the operator).")
    reason: str | None = Field(default=None, description="Why, in words.")


# --- toolexec.invocations ------------------------------------------------------------


class InvokeRequested(EventData):
    """A producer asks for a tool to run. The capability token, when any, travels as
    the CloudEvent extension ``captoken``, never in the data."""

    EVENT_TYPE: ClassVar[str] = "tool.invoke.requested"

    invocation_id: NonEmpty = Field(description="Id of the invocation; the partition key.")
    tool_id: NonEmpty = Field(description="Tool to run.")
    version_range: str = Field(default="*", description="Semver range; ignored with a lockfile.")
    parameters: JsonObject = Field(default_factory=dict, description="Tool parameters.")
    lockfile: JsonObject | None = Field(default=None, description="Pinned chain to use, if any.")
    requested_by: str | None = Field(default=None, description="Producer identity, if known.")
    deadline: AwareDatetime | None = Field(default=None, description="Give up after this time.")
    registry_offset: int | None = Field(
        default=None, ge=0,
        description="End offset of the registry topic (one partition) that the producer "
        "wrote up to; the tool is resolved once the registry view holds that much "
        "(read-your-writes).",
    )
    execution_mode: Literal["sync", "async"] = Field(
        default="sync", description="Whether the producer waits for the terminal event."
    )
    idempotency_key: str | None = Field(default=None, description="Producer's dedupe key.")
    callback_url: str | None = Field(
        default=None, max_length=2000,
        description="An https/http URL that receives the terminal result once, signed "
        "(HMAC-SHA256); only hosts the operator allows. Compatible addition: absent = none.")


class ChainLink(BaseModel):
    """One tool of a resolved chain, pinned by version and integrity."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool_id: NonEmpty = Field(description="Registry id of the tool.")
    version: NonEmpty = Field(description="Exact version pinned.")
    integrity: Integrity = Field(description="Integrity recomputed at resolution.")
    tool_type: ToolType = Field(description="Tool type.")
    executor: str | None = Field(description="Next link's tool_id; None for the primitive.")


class ChainResolved(EventData):
    """The request's tool resolved to a verified chain [leaf .. primitive]."""

    EVENT_TYPE: ClassVar[str] = "tool.chain.resolved"

    invocation_id: NonEmpty = Field(description="Id of the invocation.")
    tool_id: NonEmpty = Field(description="The leaf tool.")
    version: NonEmpty = Field(description="The leaf's resolved version.")
    chain: list[ChainLink] = Field(min_length=1, description="Links from leaf to primitive.")
    warnings: list[str] = Field(default_factory=list, description="Non-fatal findings.")
    parameters: JsonObject = Field(default_factory=dict, description="Carried from the request.")
    lockfile_used: bool = Field(default=False, description="Pinned by a lockfile, not a range.")
    deadline: AwareDatetime | None = Field(default=None, description="Carried from the request.")


class PermissionDecided(EventData):
    """Authorization outcome; on allow it carries everything the execute step needs."""

    EVENT_TYPE: ClassVar[str] = "tool.permission.decided"

    invocation_id: NonEmpty = Field(description="Id of the invocation.")
    tool_id: NonEmpty = Field(description="The leaf tool.")
    version: NonEmpty = Field(description="The leaf's resolved version.")
    decision: Literal["allow", "deny"] = Field(description="The decision.")
    reason: str = Field(description="Why, in words.")
    subject: str | None = Field(default=None, description="Token subject (the caller).")
    token_jti: str | None = Field(default=None, description="Token id; the token itself is never kept.")
    policy_version: str | None = Field(default=None, description="Policy set version applied.")
    enforced: bool = Field(description="Whether authorization was required at all.")
    error: ErrorInfo | None = Field(default=None, description="E320x on deny.")
    chain: list[ChainLink] = Field(min_length=1, description="Carried from tool.chain.resolved.")
    parameters: JsonObject = Field(default_factory=dict, description="Carried from the request.")
    deadline: AwareDatetime | None = Field(default=None, description="Carried from the request.")


class ExecutionStarted(EventData):
    """One attempt of running the chain's primitive began."""

    EVENT_TYPE: ClassVar[str] = "tool.execution.started"

    invocation_id: NonEmpty = Field(description="Id of the invocation.")
    attempt: int = Field(ge=1, description="Attempt number, from 1.")
    tool_id: NonEmpty = Field(description="The leaf tool.")
    version: NonEmpty = Field(description="The leaf's version.")
    primitive: Literal["subprocess", "http_client"] = Field(description="Primitive that runs it.")
    sandbox: str = Field(description="Isolation used (e.g. 'bwrap', 'rlimits', 'none').")
    plan_summary: JsonObject = Field(
        description="argv, or method and URL template; never secret values."
    )


class ExecutionProgressed(EventData):
    """A running attempt reported how far it has got (the tool-side progress protocol)."""

    EVENT_TYPE: ClassVar[str] = "tool.execution.progressed"

    invocation_id: NonEmpty = Field(description="Id of the invocation.")
    attempt: int = Field(ge=1, description="Attempt number, from 1.")
    sequence: int = Field(ge=0, description="Report number within the invocation, from 0, "
                          "increasing across attempts.")
    fraction: float | None = Field(default=None, ge=0, le=1,
                                   description="Share of the work done, 0..1, when known.")
    message: str = Field(default="", max_length=1000,
                         description="What the tool is doing, in words (secrets scrubbed).")


class ExecutionCheckpointed(EventData):
    """A running attempt saved resumable state. The state itself is stored
    content-addressed beside the log; the event carries its hash and sizes."""

    EVENT_TYPE: ClassVar[str] = "tool.execution.checkpointed"
    SCHEMA_VERSION: ClassVar[str] = "2"

    invocation_id: NonEmpty = Field(description="Id of the invocation.")
    attempt: int = Field(ge=1, description="Attempt number, from 1.")
    sequence: int = Field(ge=0, description="Checkpoint number within the invocation, from 0, "
                          "increasing across attempts.")
    state_hash: Integrity = Field(description="sha256 of the state's canonical JSON (RFC 8785): "
                                  "its address in the checkpoint store.")
    size: int = Field(ge=0, description="Bytes of the state's canonical JSON.")
    stored_size: int = Field(ge=0, description="Bytes kept in the store (after compression "
                             "and delta).")
    compression: Literal["none", "gzip"] = Field(description="How the stored bytes are encoded.")
    delta_of: Integrity | None = Field(
        default=None, description="state_hash of the checkpoint this one is stored as a "
        "delta against, if any.")


class ExecutionFinished(EventData):
    """One attempt ended; `final` says whether more attempts follow."""

    EVENT_TYPE: ClassVar[str] = "tool.execution.finished"

    invocation_id: NonEmpty = Field(description="Id of the invocation.")
    attempt: int = Field(ge=1, description="Attempt number, from 1.")
    tool_id: NonEmpty = Field(description="The leaf tool.")
    version: NonEmpty = Field(description="The leaf's version.")
    outcome: Literal["success", "failure", "unknown"] = Field(description="How it ended.")
    exit_code: int | None = Field(default=None, description="Process exit code (subprocess).")
    status_code: int | None = Field(default=None, description="HTTP status (http_client).")
    duration_ms: float = Field(ge=0, description="Wall time of the attempt.")
    stdout: str = Field(default="", description="Standard output (text, capped, secrets scrubbed).")
    stdout_truncated: bool = Field(default=False, description="stdout exceeded the cap.")
    stderr_tail: str = Field(default="", description="Last part of standard error.")
    stderr_truncated: bool = Field(default=False, description="stderr_tail is not all of it.")
    result: JsonValue = Field(default=None, description="Parsed result, if already parsed.")
    error: ErrorInfo | None = Field(default=None, description="E34xx/E35xx on failure.")
    external_service: str | None = Field(default=None, description="Circuit-breaker service id.")
    result_schema: JsonObject | None = Field(default=None, description="Carried from the manifest.")
    output_format: Literal["json", "text"] = Field(
        default="json", description="Carried from the manifest's output.format: what stdout "
        "holds (one JSON value, or text that is the result).")
    final: bool = Field(default=True, description="False when a retry follows this attempt.")


class InvokeCompleted(EventData):
    """Terminal success: the validated result, secrets removed."""

    EVENT_TYPE: ClassVar[str] = "tool.invoke.completed"

    invocation_id: NonEmpty = Field(description="Id of the invocation.")
    tool_id: NonEmpty = Field(description="The leaf tool.")
    version: NonEmpty = Field(description="The leaf's version.")
    result: JsonValue = Field(description="The result, validated against result_schema; "
                              "secrets removed, nothing else changed.")
    duration_ms: float = Field(ge=0, description="Wall time of the final attempt.")
    attempts: int = Field(ge=1, description="Attempts made.")
    coerced: bool = Field(default=False, description="The result needed type coercion.")
    redactions: int = Field(default=0, ge=0, description="Secret values removed from the "
                            "result.")


InvocationStage = Literal["resolve", "authorize", "execute", "finalize", "request"]


class InvokeFailed(EventData):
    """Terminal failure, from whichever stage failed."""

    EVENT_TYPE: ClassVar[str] = "tool.invoke.failed"

    invocation_id: NonEmpty = Field(description="Id of the invocation.")
    tool_id: str | None = Field(default=None, description="The tool, when known.")
    version: str | None = Field(default=None, description="The resolved version, when known.")
    error: ErrorInfo = Field(description="Why it failed.")
    stage: InvocationStage = Field(description="Pipeline stage that failed.")


class InvokeCancelRequested(EventData):
    """Someone asked for an invocation to be cancelled (ends as E3703 if it applies)."""

    EVENT_TYPE: ClassVar[str] = "tool.invoke.cancel.requested"

    invocation_id: NonEmpty = Field(description="Id of the invocation.")
    reason: str | None = Field(default=None, description="Why.")
    requested_by: str | None = Field(default=None, description="Who asked, if known.")


# --- toolexec.callbacks -----------------------------------------------------------------


class CallbackDelivered(EventData):
    """The terminal result of an invocation was POSTed to its callback URL and the
    receiver answered 2xx: a restarted deliverer does not send it again."""

    EVENT_TYPE: ClassVar[str] = "callback.delivered"

    invocation_id: NonEmpty = Field(description="Id of the invocation; the partition key.")
    terminal_event_id: NonEmpty = Field(description="Id of the terminal event sent (the "
                                        "`Toolexec-Event-Id` header the receiver dedupes on).")
    host: NonEmpty = Field(description="Host of the callback URL (the URL itself is not "
                           "kept: it may carry the caller's secrets).")
    status_code: int = Field(ge=200, le=299, description="The receiver's answer.")
    attempts: int = Field(ge=1, description="POSTs made.")


class CallbackFailed(EventData):
    """The terminal result could not be delivered: refused by the operator's callback
    hosts (E3406) or the receiver never answered 2xx within the retries (E3704). It is
    not tried again."""

    EVENT_TYPE: ClassVar[str] = "callback.failed"

    invocation_id: NonEmpty = Field(description="Id of the invocation; the partition key.")
    terminal_event_id: NonEmpty = Field(description="Id of the terminal event not delivered.")
    host: str | None = Field(default=None, description="Host of the callback URL, if any.")
    attempts: int = Field(ge=0, description="POSTs made (0 when refused before any).")
    error: ErrorInfo = Field(description="E3704; E3406 for a host not allowed, E3004 for a "
                             "malformed URL (a request written to the log directly).")
CallHash = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


class ApprovalRequested(EventData):
    """The allowed call waits for an approver: a policy or the tool's manifest requires
    it. `call_hash` binds an approval to exactly this call (domain.approval.call_hash)."""

    EVENT_TYPE: ClassVar[str] = "tool.approval.requested"

    invocation_id: NonEmpty = Field(description="Id of the invocation.")
    tool_id: NonEmpty = Field(description="The leaf tool.")
    version: NonEmpty = Field(description="The leaf's resolved version.")
    integrity: Integrity = Field(description="Integrity of the leaf tool version.")
    parameters: JsonObject = Field(default_factory=dict, description="The call's parameters.")
    subject: str | None = Field(default=None, description="Token subject (the agent), if any.")
    policy_version: str | None = Field(default=None, description="Policy version that allowed it.")
    call_hash: CallHash = Field(description="sha256 of the RFC 8785 JSON of (integrity, "
                                "parameters, agent, policy_version): what is approved.")
    reasons: list[str] = Field(min_length=1, description="The policies (and/or the manifest) "
                               "requiring approval.")
    expires_at: AwareDatetime = Field(description="Without an approval by then the "
                                      "invocation fails with E3209.")


class _ApprovalAnswer(EventData):
    """An approver's answer on a waiting call (the fields both approval answers share)."""

    invocation_id: NonEmpty = Field(description="Id of the invocation.")
    decision: Literal["approve", "deny"] = Field(description="The approver's answer.")
    approved_hash: CallHash = Field(description="The call hash the approver saw and decided on.")
    decided_by: NonEmpty = Field(description="Who decided: the approver's token subject (or "
                                 "the front end's name with authorization off).")
    reason: str | None = Field(default=None, description="Why, in words.")


class ApprovalDecided(_ApprovalAnswer):
    """An approver approved or denied a waiting call (a command, on the requests topic)."""

    EVENT_TYPE: ClassVar[str] = "tool.approval.decided"


class ApprovalReceived(_ApprovalAnswer):
    """The pipeline read an approver's `tool.approval.decided` that may count (its token
    grants the approve scope for the tool to the approver it names). The event's time
    is when the pipeline read it, by its own clock: what "decided before the expiry"
    is judged by, also after a restart (never the decision's own, producer-chosen
    time). One per invocation: the first decision counts."""

    EVENT_TYPE: ClassVar[str] = "tool.approval.received"

    decision_id: NonEmpty = Field(description="Id of the tool.approval.decided read.")


# --- toolexec.circuits / toolexec.policies / toolexec.deadletter ---------------------


class CircuitStateChanged(EventData):
    """A circuit breaker for an external service changed state."""

    EVENT_TYPE: ClassVar[str] = "circuit.state.changed"

    service_id: NonEmpty = Field(description="External service id; the partition key.")
    from_state: CircuitState = Field(description="State before.")
    to_state: CircuitState = Field(description="State after.")
    failure_count: int = Field(ge=0, description="Consecutive failures counted.")
    success_count: int = Field(ge=0, description="Consecutive successes counted.")
    since: AwareDatetime = Field(description="When the new state began.")
    reason: str | None = Field(default=None, description="Why it changed.")


class PolicyUpdated(EventData):
    """A new version of an authorization policy set."""

    EVENT_TYPE: ClassVar[str] = "policy.updated"

    policy_set_id: NonEmpty = Field(description="Policy set id; the partition key.")
    version: NonEmpty = Field(description="Version of the policy set.")
    policies: str | list[JsonObject] = Field(
        description="Cedar policy text, or a list of policy documents (JSON objects)."
    )
    engine: Literal["cedar", "external"] = Field(default="cedar", description="Evaluator.")


class DeadLetterRecord(EventData):
    """A record a consumer could not decode or kept failing on, kept with the error."""

    EVENT_TYPE: ClassVar[str] = "deadletter.recorded"

    topic: str = Field(description="Topic of the original record.")
    partition: int = Field(ge=0, description="Partition of the original record.")
    offset: int = Field(ge=0, description="Offset of the original record.")
    key: str | None = Field(default=None, description="Original key as UTF-8 text, if any.")
    key_b64: str | None = Field(default=None, description="Original key bytes, base64 (exact).")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Original headers that decode as UTF-8."
    )
    value_b64: str = Field(description="Original value bytes, base64.")
    error: ErrorInfo = Field(description="Why it was dead-lettered.")
    consumer: str = Field(description="Consumer group (or component) that gave up.")
    failed_at: AwareDatetime = Field(description="When it gave up.")
    attempts: int = Field(ge=1, description="Attempts made before giving up.")


EVENT_MODELS: Final[dict[str, type[EventData]]] = {
    model.EVENT_TYPE: model
    for model in (
        ToolPublished, ToolPublishRejected, ToolLifecycleChanged,
        ToolDefinitionPinned, ToolDefinitionDrifted, ToolDefinitionApproved,
        InvokeRequested, ChainResolved, PermissionDecided,
        ExecutionStarted, ExecutionProgressed, ExecutionCheckpointed, ExecutionFinished,
        InvokeCompleted, InvokeFailed, InvokeCancelRequested,
        ApprovalRequested, ApprovalDecided, ApprovalReceived,
        CircuitStateChanged, PolicyUpdated, DeadLetterRecord,
        CallbackDelivered, CallbackFailed,
    )
}
"""Event type name -> its data model (the dead-letter record included)."""

SCHEMA_VERSION: Final[dict[str, str]] = {t: m.SCHEMA_VERSION for t, m in EVENT_MODELS.items()}
"""Event type name -> contract version; see the module docstring for when it changes."""

TERMINAL_TYPES: Final[frozenset[str]] = frozenset({InvokeCompleted.EVENT_TYPE,
                                                   InvokeFailed.EVENT_TYPE})
"""The events that end an invocation: every invocation has exactly one."""

TERMINAL_STATUSES: Final[frozenset[str]] = frozenset(
    t.rsplit(".", 1)[-1] for t in TERMINAL_TYPES)
"""The status of an invocation once it has ended ("completed", "failed"), as the
invocations read model records it (a cancelled one is "failed" with E3703)."""
