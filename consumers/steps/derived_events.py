"""Building derived events: ids, correlation and causation come from the input event."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from contracts.envelope import Envelope, derived_event_id, new_envelope
from contracts.errors import ErrorInfo
from contracts.events import InvokeFailed
from domain.errors import ToolexecError

SOURCE = "urn:toolexec:pipeline"

# Extensions that may travel from an input event to the events it causes. The
# capability token (`captoken`) is deliberately absent: it is never copied.
_PROPAGATED = ("traceparent",)


def derive(cause: Envelope, data: BaseModel, *, step: str, now: Any) -> Envelope:
    """An event caused by `cause`: same partition key and correlation id, causation
    = cause.id, id = uuid5(cause.id, step) so a redelivered input yields the same id."""
    extensions = {k: v for k, v in cause.extensions.items() if k in _PROPAGATED}
    return new_envelope(
        data,
        source=SOURCE,
        partitionkey=cause.partitionkey,
        correlationid=cause.correlationid,
        causationid=cause.id,
        id=derived_event_id(cause.id, step),
        time=now,
        extensions=extensions,
    )


def error_info(error: ToolexecError) -> ErrorInfo:
    return ErrorInfo(code=error.code, message=error.message, details=error.details)


def failed(
    cause: Envelope,
    error: ToolexecError | ErrorInfo,
    *,
    stage: str,
    invocation_id: str,
    tool_id: str | None,
    version: str | None,
    now: Any,
) -> Envelope:
    """The terminal failure event for an invocation."""
    info = error if isinstance(error, ErrorInfo) else error_info(error)
    data = InvokeFailed(
        invocation_id=invocation_id, tool_id=tool_id, version=version, error=info, stage=stage
    )
    return derive(cause, data, step=f"{stage}.failed", now=now)
