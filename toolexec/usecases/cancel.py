"""Cancelling an invocation: a `tool.invoke.cancel.requested` when it has not ended
(it then ends with E3703 unless it ends first); a no-op answered `already_ended` when
it has, so asking twice, or racing its end, is never an error."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from contracts.events import TERMINAL_STATUSES
from domain.errors import JobCancelled

if TYPE_CHECKING:
    from toolexec.client import InvocationClient


@dataclass(frozen=True)
class CancelOutcome:
    """What a cancel did: `cancel_requested` (with the event's id) or `already_ended`
    (with how it ended: completed, failed, cancelled)."""

    invocation_id: str
    status: Literal["cancel_requested", "already_ended"]
    event_id: str | None = None
    ended_as: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def shown_status(row: Mapping[str, Any]) -> str:
    """The status an invocations row is shown with: "cancelled" is a failure with E3703."""
    status = str(row["status"])
    return ("cancelled" if status == "failed" and row.get("error_code") == JobCancelled.code
            else status)


async def cancel_invocation(client: InvocationClient, invocation_id: str,
                            row: Mapping[str, Any] | None, reason: str | None,
                            requested_by: str) -> CancelOutcome:
    """Cancel `invocation_id`, whose invocations read-model row is `row` (None when no
    read model is at hand: the request is sent, and the pipeline ignores it if the
    invocation has ended). Raises InvocationNotDelivered (E3001)."""
    if row is not None and row["status"] in TERMINAL_STATUSES:
        return CancelOutcome(invocation_id, "already_ended", ended_as=shown_status(row))
    event = await client.cancel(invocation_id, reason, requested_by=requested_by)
    return CancelOutcome(invocation_id, "cancel_requested", event_id=event.id)
