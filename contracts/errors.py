"""The E3xxx error registry (spec section 11.5) and the error value carried on the wire.

Every failure event carries an `ErrorInfo` (`{code, message, details}`); gateways map
the code to an HTTP status with `http_status_for`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, JsonValue


@dataclass(frozen=True, slots=True)
class ErrorCodeInfo:
    """One row of the registry: code, short title, HTTP status and what to do about it."""

    code: str
    title: str
    http_status: int
    resolution: str

    @property
    def family(self) -> str:
        """The family the code belongs to, e.g. ``"registry"`` for E3101."""
        return family_of(self.code)


_FAMILIES: Final[tuple[tuple[int, int, str], ...]] = (
    (3000, 3099, "general"),
    (3100, 3149, "registry"),
    (3200, 3249, "permission"),
    (3300, 3349, "validation"),
    (3400, 3449, "execution"),
    (3500, 3549, "circuit_breaker"),
    (3600, 3649, "secrets"),
    (3700, 3749, "async_execution"),
    (3800, 3849, "audit"),
    (3850, 3899, "mcp_document_bridge"),
    (3900, 3949, "mcp_state_bridge"),
)

_ROWS: Final[tuple[tuple[str, str, int, str], ...]] = (
    ("E3000", "Internal server error", 500, "Retry with exponential backoff"),
    ("E3001", "Service temporarily unavailable", 503, "Wait and retry"),
    ("E3002", "Request timeout", 504, "Increase timeout or optimize tool"),
    ("E3003", "Rate limit exceeded", 429, "Slow down request rate"),
    ("E3004", "Invalid request format", 400, "Check request schema"),
    ("E3101", "Tool not found", 404, "Verify tool_id exists in registry"),
    ("E3102", "Tool version not found", 404, "Check available versions"),
    ("E3103", "Tool version conflict", 409, "Resolve version range constraints"),
    ("E3104", "Tool deprecated", 410, "Use recommended replacement tool"),
    ("E3105", "Tool manifest invalid", 422, "Fix manifest schema"),
    ("E3106", "Semantic search failed", 500, "Check Ollama service availability"),
    ("E3107", "Publisher signature missing or untrusted", 403,
     "Publish the version signed (`toolexec publish --sign-key`) by a key the trust store "
     "lists for its tool id"),
    ("E3108", "Tool definition changed since it was approved", 409,
     "Review the drift (`toolexec definitions list`), then approve the new hash "
     "(`toolexec definitions approve SERVER HASH`) or lock again"),
    ("E3201", "Token expired", 401, "Obtain new capability token"),
    ("E3202", "Invalid token signature", 401, "Verify token signing key"),
    ("E3203", "Malformed token", 401, "Check JWT format"),
    ("E3204", "Tool not in capability token", 403, "Request token with tool permission"),
    ("E3205", "ABAC engine error", 503, "Check ABAC service health"),
    ("E3206", "Permission denied", 403, "Request additional permissions"),
    ("E3207", "DID not found", 404, "Verify agent DID registration"),
    ("E3208", "Approval denied", 403, "Ask an approver again, or call with other parameters"),
    ("E3209", "Approval expired", 403,
     "Invoke again and have it approved before it expires (TOOLEXEC_APPROVAL_TTL_SECONDS)"),
    ("E3210", "Approval does not match the call", 403,
     "Approve the hash of the call that waits (`toolexec approvals` lists it)"),
    ("E3301", "Schema validation failed", 400, "Fix parameters to match schema"),
    ("E3302", "Type coercion failed", 400, "Provide correct parameter types"),
    ("E3303", "Result validation failed", 500, "Tool returned invalid output"),
    ("E3304", "PII sanitization error", 500, "Check sanitization rules"),
    ("E3305", "Injection attack detected", 400, "Remove malicious input"),
    ("E3401", "Tool execution failed", 500, "Check tool logs"),
    ("E3402", "Tool timeout", 504, "Increase timeout or optimize tool"),
    ("E3403", "Tool OOM killed", 500, "Increase memory limit"),
    ("E3404", "Tool crashed", 500, "Check tool stability"),
    ("E3405", "Sandbox creation failed", 500, "Check Kubernetes cluster health"),
    ("E3406", "Network policy violation", 403, "Verify allowed domains"),
    ("E3407", "Resource limit exceeded", 429, "Reduce resource usage"),
    ("E3501", "Circuit breaker open", 503, "Wait for timeout period"),
    ("E3502", "External service unavailable", 503, "Check service health"),
    ("E3503", "External service timeout", 504, "Increase timeout or check service"),
    ("E3504", "Rate limit exceeded (external)", 429, "Reduce request rate"),
    ("E3601", "Vault unavailable", 503, "Check Vault service"),
    ("E3602", "Credential not found", 404, "Provision credentials in Vault"),
    ("E3603", "Credential expired", 401, "Rotate credentials"),
    ("E3604", "Credential decryption failed", 500, "Verify encryption keys"),
    ("E3701", "Job queue full", 503, "Wait and retry"),
    ("E3702", "Job not found", 404, "Verify invocation_id"),
    ("E3703", "Job cancelled", 499, "Resubmit if needed"),
    ("E3704", "Webhook delivery failed", 500, "Check webhook endpoint"),
    ("E3801", "Kafka unavailable", 503, "Check Kafka cluster"),
    ("E3802", "Event serialization failed", 500, "Check event schema"),
    ("E3803", "Audit backpressure", 503, "Reduce event rate"),
    ("E3804", "Fact not signed by the pipeline", 403,
     "Only the pipeline writes facts: find who produces to the facts topic"),
    ("E3805", "Audit export signing key unavailable", 500,
     "Set TOOLEXEC_FACT_SIGNING_KEY to the pipeline's Ed25519 key (PEM)"),
    ("E3806", "Audit chain broken", 500,
     "Run `toolexec audit verify` to name the record, then rebuild the audit model"),
    ("E3851", "MCP server unavailable", 503, "Check document-consolidator service"),
    ("E3852", "Document not found", 404, "Verify document exists"),
    ("E3853", "Document query timeout", 504, "Simplify query or increase timeout"),
    ("E3854", "Document cache miss", 200, "Normal, query will hit database"),
    ("E3855", "Document permission denied", 403, "Request document access"),
    ("E3856", "MCP protocol error", 500, "Check MCP server logs"),
    ("E3901", "MCP server unavailable", 503, "Check context-orchestrator service"),
    ("E3902", "Checkpoint creation failed", 500, "Check PostgreSQL/Redis health"),
    ("E3903", "Checkpoint not found", 404, "Verify checkpoint_id"),
    ("E3904", "Checkpoint corrupted", 500, "Use earlier checkpoint"),
    ("E3905", "Resume failed", 500, "Restart from scratch"),
    ("E3906", "State serialization failed", 500, "Reduce state size"),
    ("E3907", "MCP protocol error", 500, "Check MCP server logs"),
)

ERROR_CODES: Final[dict[str, ErrorCodeInfo]] = {
    code: ErrorCodeInfo(code, title, status, resolution)
    for code, title, status, resolution in _ROWS
}
"""Every code of spec section 11.5, by code."""

ERROR_CODE_PATTERN: Final = r"^E3\d{3}$"

UNKNOWN_CODE_STATUS: Final = 500
"""Status given to a well-formed code missing from the registry (treated as internal)."""


def http_status_for(code: str) -> int:
    """HTTP status of `code` per the registry; 500 for a code the registry lacks."""
    info = ERROR_CODES.get(code)
    return UNKNOWN_CODE_STATUS if info is None else info.http_status


def family_of(code: str) -> str:
    """Family name of an E3xxx code (``"general"``, ``"registry"``, ...), or ``"unknown"``."""
    number = int(code[1:]) if len(code) == 5 and code[1:].isdigit() else -1
    for low, high, name in _FAMILIES:
        if low <= number <= high:
            return name
    return "unknown"


class ErrorInfo(BaseModel):
    """An error as a value on the wire: E3xxx code, human message, structured details."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: Annotated[str, Field(pattern=ERROR_CODE_PATTERN)] = Field(
        description="E3xxx code from the error registry (spec section 11.5)."
    )
    message: str = Field(description="Human-readable explanation; never contains secrets.")
    details: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="Machine-readable context (offending paths, limits, ids...).",
    )
