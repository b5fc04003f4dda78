"""Kafka topic names and which topic carries each event type.

Topics are per aggregate and keyed by the aggregate id (see docs/architecture.md,
"Topics"), so every event of one invocation, tool, circuit or policy set lands in one
partition, in order.
"""

from __future__ import annotations

from typing import Final

REGISTRY: Final = "toolexec.registry"
"""Tool publications, lifecycle changes and pinned MCP tool definitions; key =
tool_id (the server's for definitions)."""
REQUESTS: Final = "toolexec.requests"
"""Commands to the pipeline (invoke, cancel, approval decisions); key = invocation_id. Producers write
here and only here."""
INVOCATIONS: Final = "toolexec.invocations"
"""Facts of the invocation pipeline, written by the pipeline alone; key =
invocation_id, in the partition of the invocation's request."""
CIRCUITS: Final = "toolexec.circuits"
"""Circuit-breaker transitions; key = service_id."""
POLICIES: Final = "toolexec.policies"
"""Authorization policy sets; key = policy_set_id."""
DEADLETTER: Final = "toolexec.deadletter"
"""Undecodable or poison records with their error; key = the original record's key."""
CALLBACKS: Final = "toolexec.callbacks"
"""Deliveries of terminal results to callback URLs (delivered, failed); key =
invocation_id."""

ALL_TOPICS: Final[tuple[str, ...]] = (REGISTRY, REQUESTS, INVOCATIONS, CIRCUITS, POLICIES,
                                      DEADLETTER, CALLBACKS)

TOPIC_OF_TYPE: Final[dict[str, str]] = {
    "tool.published": REGISTRY,
    "tool.publish.rejected": REGISTRY,
    "tool.lifecycle.changed": REGISTRY,
    "tool.definition.pinned": REGISTRY,
    "tool.definition.drifted": REGISTRY,
    "tool.definition.approved": REGISTRY,
    "tool.invoke.requested": REQUESTS,
    "tool.chain.resolved": INVOCATIONS,
    "tool.permission.decided": INVOCATIONS,
    "tool.execution.started": INVOCATIONS,
    "tool.execution.progressed": INVOCATIONS,
    "tool.execution.checkpointed": INVOCATIONS,
    "tool.execution.finished": INVOCATIONS,
    "tool.invoke.completed": INVOCATIONS,
    "tool.invoke.failed": INVOCATIONS,
    "tool.invoke.cancel.requested": REQUESTS,
    "tool.approval.requested": INVOCATIONS,
    "tool.approval.decided": REQUESTS,
    "tool.approval.received": INVOCATIONS,
    "circuit.state.changed": CIRCUITS,
    "policy.updated": POLICIES,
    "deadletter.recorded": DEADLETTER,
    "callback.delivered": CALLBACKS,
    "callback.failed": CALLBACKS,
}
"""Event type -> the topic it is published on (the one place that decides it)."""

COMMAND_TYPES: Final = frozenset(
    t for t, topic in TOPIC_OF_TYPE.items() if topic == REQUESTS)
"""Event types that are commands (requests), not facts."""
