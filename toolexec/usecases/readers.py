"""Who may read an invocation: the one rights check of every front end that shows one
(HTTP `GET /v1/invocations/{id}` and the status page, MCP `execute` `status`).

With authorization on, a reader is a verified token (toolexec.rights.caller): it reads
its own invocations (its subject's) unless it has the audit scope, which reads every
caller's. With authorization off (no capability) every invocation may be read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from domain.capability import Capability
from domain.errors import AuthorizationError


def reader_subject(capability: Capability | None) -> str | None:
    """The subject whose invocations `capability` is limited to; None = every one."""
    if capability is None or capability.reads_everything:
        return None
    return capability.subject


def check_reader(capability: Capability | None, row: Mapping[str, Any]) -> None:
    """Raise AuthorizationError (E3206) unless `capability` may read the invocation
    whose read-model row is `row`."""
    subject = reader_subject(capability)
    if subject is not None and row["subject"] != subject:
        raise AuthorizationError(
            "permission denied: the invocation belongs to another subject (reading every "
            "caller's invocations needs the audit scope)", code="E3206",
            details={"invocation_id": row["invocation_id"]})
