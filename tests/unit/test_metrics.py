"""Pipeline metrics: requests started are counted once per invocation, by tool."""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client import REGISTRY

from contracts.envelope import new_envelope
from contracts.events import InvokeRequested
from toolexec.metrics import PipelineMetrics

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _request(invocation_id: str, tool_id: str):
    return new_envelope(InvokeRequested(invocation_id=invocation_id, tool_id=tool_id),
                        source="urn:test", partitionkey=invocation_id,
                        correlationid=invocation_id, id=f"req-{invocation_id}", time=T0)


def _started(tool_id: str) -> float:
    return REGISTRY.get_sample_value("toolexec_invocations_started_total",
                                     {"tool_id": tool_id}) or 0.0


def test_each_started_invocation_counts_once_for_its_tool() -> None:
    metrics = PipelineMetrics()
    before = _started("started_tool")
    metrics.observe(_request("inv-s1", "started_tool"))
    metrics.observe(_request("inv-s1", "started_tool"))  # the same request seen again
    metrics.observe(_request("inv-s2", "started_tool"))
    metrics.observe(_request("inv-s3", "other_started_tool"))
    assert _started("started_tool") == before + 2
