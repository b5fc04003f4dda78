"""Step 4 — finalize: tool.execution.finished -> tool.invoke.completed | tool.invoke.failed.

Only the final attempt's outcome is finalised; the result is validated against the
manifest's result_schema with coercion (E3303) and cleared of secrets (not of PII: the
caller gets the tool's result; the audit trail redacts PII). The step returns the
terminal fact; the pipeline appends it to the log together with the execution.finished
it follows from (consumers.runtime.invocation).
"""

from __future__ import annotations

from dataclasses import dataclass

from consumers.ports import Clock
from consumers.steps.derived_events import derive, failed
from contracts.envelope import Envelope
from contracts.errors import ErrorInfo
from contracts.events import ExecutionFinished, InvokeCompleted
from domain.errors import ValidationFailed
from domain.result import finalise


@dataclass(frozen=True)
class FinalizeDeps:
    clock: Clock


def finalize_execution(event: Envelope, deps: FinalizeDeps) -> Envelope:
    """The terminal event that the final `tool.execution.finished` `event` leads to."""
    finished: ExecutionFinished = event.data
    assert finished.final, "only the final attempt is finalised"
    now = deps.clock()
    common = dict(invocation_id=finished.invocation_id, tool_id=finished.tool_id,
                  version=finished.version, now=now)
    if finished.outcome != "success" or finished.error is not None:
        error = finished.error or ErrorInfo(
            code="E3404" if finished.outcome == "unknown" else "E3401",
            message=f"tool execution ended with outcome {finished.outcome}",
        )
        return failed(event, error, stage="execute", **common)
    try:
        if finished.stdout_truncated:
            raise ValidationFailed("tool output exceeded the output cap", code="E3303",
                                   details={"truncated": True})
        result = finalise(finished.stdout, finished.result_schema,
                          output_format=finished.output_format)
    except ValidationFailed as error:
        return failed(event, error, stage="finalize", **common)
    completed = InvokeCompleted(
        invocation_id=finished.invocation_id, tool_id=finished.tool_id, version=finished.version,
        result=result.value, duration_ms=finished.duration_ms, attempts=finished.attempt,
        coerced=result.coerced, redactions=result.redactions,
    )
    return derive(event, completed, step="finalize", now=now)
