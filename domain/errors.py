"""Domain errors: each carries an E3xxx code from the spec's error registry (11.5).

Inside a process these are exceptions; at a boundary they become failure events
(`{code, message, details}`) on the wire.
"""

from __future__ import annotations

from typing import Any


class ToolexecError(Exception):
    """Base of every domain error. `code` is the E3xxx code, `details` is JSON-safe."""

    code: str = "E3000"

    def __init__(self, message: str, *, code: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details: dict[str, Any] = details or {}

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class RequestError(ToolexecError):
    """E3000-E3099: general / request errors."""

    code = "E3004"


class InvalidRequest(RequestError):
    """A malformed request (E3004): the caller must change it; at the CLI, bad usage."""


class RegistryError(ToolexecError):
    """E3100-E3149: tool not found (E3101), version not found (E3102), conflict
    (E3103), deprecated (E3104), manifest or chain invalid (E3105), publisher not
    trusted (E3107), MCP tool definition changed (E3108)."""

    code = "E3105"


class ToolNotFound(RegistryError):
    code = "E3101"


class VersionNotFound(RegistryError):
    code = "E3102"


class VersionConflict(RegistryError):
    """A published version is offered again with other contents (versions are immutable)."""

    code = "E3103"


class VersionRemoved(RegistryError):
    """The only versions that match were removed from the registry (HTTP 410)."""

    code = "E3104"


class IntegrityMismatch(RegistryError):
    """A chain link's recomputed integrity differs from the recorded one."""

    code = "E3105"


class PublisherNotTrusted(RegistryError):
    """A version the trust store requires signed is unsigned, wrongly signed or signed
    by an untrusted key (E3107)."""

    code = "E3107"


class DefinitionChanged(RegistryError):
    """E3108: an MCP server announces another definition of a tool than the one
    pinned (first seen or approved) or locked; calls are refused until a person
    approves the new hash (domain.definitions)."""

    code = "E3108"


class ChainInvalid(RegistryError):
    """Cycle, depth > 16, bad executor link, or a parent rejecting its child."""

    code = "E3105"


class LockfileError(RegistryError):
    code = "E3105"


class AuthorizationError(ToolexecError):
    """E3200-E3249: capability token and policy failures."""

    code = "E3206"


class ApprovalDenied(AuthorizationError):
    """E3208: an approver denied the call."""

    code = "E3208"


class ApprovalExpired(AuthorizationError):
    """E3209: nobody approved the call before its approval expired."""

    code = "E3209"


class ApprovalMismatch(AuthorizationError):
    """E3210: the approval names another call than the one waiting."""

    code = "E3210"


class ValidationFailed(ToolexecError):
    """E3300-E3349: parameters (E3301), coercion (E3302), result (E3303)."""

    code = "E3301"


class ExecutionError(ToolexecError):
    """E3400-E3449: failed (E3401), timeout (E3402), OOM (E3403), crashed (E3404),
    sandbox (E3405), network policy (E3406), resource limit (E3407)."""

    code = "E3401"


class NetworkPolicyViolation(ExecutionError):
    code = "E3406"


class CircuitOpen(ToolexecError):
    code = "E3501"


class JobNotFound(ToolexecError):
    """E3702: no invocation of that id is known (to the read model)."""

    code = "E3702"


class JobCancelled(ToolexecError):
    """E3703: the invocation was cancelled on request (an invocation that failed with
    this code is shown as "cancelled" and is not an error of its tool)."""

    code = "E3703"
