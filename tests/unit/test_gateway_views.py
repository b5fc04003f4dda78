"""Pure parts of the gateway: the invocation view, the sync wait bound, step metrics
folded from the pipeline's events, and the status page's escaping."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY

from contracts.envelope import new_envelope
from contracts.errors import ErrorInfo
from contracts.events import InvokeCompleted, InvokeFailed
from domain.retry import RetryPolicy
from projections.invocations import new_invocation
from toolexec.gateway.http import invocation_view, wait_bound
from toolexec.gateway.status_page import AuditFilters, invocation_page, render
from toolexec.metrics import PipelineMetrics
from toolexec.usecases.status import invocation_summary

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def row(**changes: object) -> dict:
    return {**new_invocation("inv-1", "2026-11-23T12:00:00.000000Z"), **changes}


def test_a_failure_with_E3703_reads_as_cancelled() -> None:
    view = invocation_view(row(status="failed", error_code="E3703", error_message="cancelled",
                               failed_stage="execute"))
    assert view.status == "cancelled" and view.error.code == "E3703"


def test_a_completed_row_carries_its_result_parsed_from_the_summary() -> None:
    view = invocation_view(row(status="completed", result_summary='{"greeting": "hi"}'))
    assert view.result == {"greeting": "hi"} and view.error is None


def test_a_truncated_summary_is_kept_as_text_only() -> None:
    view = invocation_view(row(status="completed", result_summary='{"long": "abc…'))
    assert view.result is None and view.result_summary == '{"long": "abc…'


def test_the_sync_wait_covers_every_attempt_and_backoff_plus_slack() -> None:
    manifest = {"timeout_default": 10, "retry_policy": {"max_attempts": 3}}
    backoffs = 0.1 + 0.2  # the longest full-jitter delays before retries 2 and 3
    assert wait_bound(manifest, registry_wait=5) == pytest.approx(10 * 3 + backoffs + 5 + 10)
    assert wait_bound({"config": {"timeout": 2}}, registry_wait=0) == 2 + 10
    assert wait_bound(None, registry_wait=0) == 30 + 10
    assert wait_bound({"timeout_default": "soon"}, registry_wait=0) == 30 + 10


def test_the_sync_wait_counts_the_attempts_the_executor_makes() -> None:
    """A retry_policy without max_attempts means 3 attempts (domain.retry), not 1."""
    manifest = {"timeout_default": 10, "retry_policy": {}}
    assert RetryPolicy.from_manifest(manifest).max_attempts == 3
    assert wait_bound(manifest, registry_wait=0) > 10 * 3


@dataclass
class Seen:
    """What the metrics read of an event: its type, time, invocation and data."""

    type: str
    time: datetime
    correlationid: str
    data: object


def record(data: object, at: datetime, event_type: str | None = None) -> Seen:
    envelope = new_envelope(data, source="urn:test", partitionkey="inv-m", correlationid="inv-m",
                            id=f"id-{at.timestamp()}", time=at)
    # Progress events only need their type and time here.
    return Seen(event_type or envelope.type, envelope.time, envelope.correlationid, data)


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_step_latencies_and_outcomes_are_folded_from_event_times() -> None:
    metrics = PipelineMetrics()
    done = InvokeCompleted(invocation_id="inv-m", tool_id="metered_tool", version="1.0.0",
                           result={}, duration_ms=1.0, attempts=1)
    before = {step: sample("toolexec_pipeline_step_seconds_sum", {"step": step})
              for step in ("resolve", "total")}
    count = sample("toolexec_invocations_total",
                   {"tool_id": "metered_tool", "outcome": "completed", "code": ""})
    steps = ["tool.invoke.requested", "tool.chain.resolved", "tool.permission.decided",
             "tool.execution.finished"]
    for i, event_type in enumerate(steps):
        metrics.observe(record(done, T0 + timedelta(seconds=i), event_type))
    metrics.observe(record(done, T0 + timedelta(seconds=10)))

    assert sample("toolexec_pipeline_step_seconds_sum", {"step": "resolve"}) - \
        before["resolve"] == 1.0
    assert sample("toolexec_pipeline_step_seconds_sum", {"step": "total"}) - \
        before["total"] == 10.0
    assert sample("toolexec_invocations_total", {"tool_id": "metered_tool",
                                                 "outcome": "completed", "code": ""}) == count + 1


def test_a_failure_is_counted_with_its_code() -> None:
    metrics = PipelineMetrics()
    failed = InvokeFailed(invocation_id="inv-f", tool_id="failing_tool", stage="resolve",
                          error=ErrorInfo(code="E3101", message="not found"))
    labels = {"tool_id": "failing_tool", "outcome": "failed", "code": "E3101"}
    before = sample("toolexec_invocations_total", labels)
    metrics.observe(record(failed, T0))
    assert sample("toolexec_invocations_total", labels) == before + 1


def test_the_status_page_escapes_every_value() -> None:
    hostile = "<img src=x onerror=alert(1)>"
    summary = invocation_summary(row(tool_id=hostile, invocation_id=hostile))
    page = render(snapshot={"generated_at": hostile, "invocations": [summary],
                            "pending": {"count": 1, "invocations": [summary]},
                            "approvals": [{"invocation_id": hostile, "tool_id": hostile,
                                           "version": "1.0.0", "subject": hostile,
                                           "call_hash": hostile, "requested_at": "t",
                                           "expires_at": hostile}],
                            "circuits": [{"service_id": hostile, "state": "open",
                                          "failure_count": 1, "since": "t",
                                          "reason": hostile}]},
                  tools=[{"tool_id": hostile, "current_version": "1.0.0",
                          "latest_version": "1.0.0", "tool_type": "script",
                          "lifecycle": "active", "description": hostile}],
                  filters=AuditFilters(tool=hostile), audit_rows=[])
    assert hostile not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert 'href="/invocations/%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E"' in page


def test_the_invocation_page_escapes_its_timeline() -> None:
    hostile = "</pre><script>alert(1)</script>"
    view = invocation_view(row(tool_id=hostile, status="completed", result_summary=hostile))
    record = {"event_id": hostile, "time": "2026-11-23T12:00:00.000000Z", "type": "tool.invoke.completed",
              "topic": "toolexec.invocations", "partition": 0, "offset": 7,
              "event": {"data": {"output": hostile}}}
    page = invocation_page(view, [record])
    assert "<script>" not in page and "&lt;/pre&gt;&lt;script&gt;" in page
    assert "toolexec.invocations/0@7" in page


def test_the_view_carries_the_latest_progress_and_the_checkpoints() -> None:
    view = invocation_view(row(status="running", progress_sequence=7, progress_fraction=0.4,
                               progress_message="step 8 of 20",
                               progress_at="2026-11-23T12:00:01.000000Z", checkpoints=8,
                               checkpoint_bytes=800, checkpoint_stored_bytes=300,
                               last_checkpoint_hash="sha256:" + "a" * 64))
    assert view.progress is not None and view.progress.fraction == 0.4
    assert view.progress.message == "step 8 of 20"
    assert (view.checkpoints.count, view.checkpoints.stored_bytes) == (8, 300)
    quiet = invocation_view(row(status="running"))
    assert quiet.progress is None and quiet.checkpoints.count == 0


def test_the_status_page_shows_a_running_invocation_s_progress_as_text() -> None:
    summary = invocation_summary(row(status="running", tool_id="<b>t</b>", progress_sequence=0,
                                     progress_fraction=0.25, progress_message="<i>x</i>"))
    assert summary["progress"]["fraction"] == 0.25
    from toolexec.gateway.status_page import invocations_table

    html = invocations_table([summary])
    assert '<progress max="1" value="0.2500"></progress> 25% &lt;i&gt;x&lt;/i&gt;' in html
    assert "<i>" not in html
