"""Scenario 1's hop breakdown: each hop is the difference of two marks on one time line."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from toolexec.bench.hops import HOPS, Sent, hop_figures


def _event(kind: str, invocation_id: str, at: float, **data: Any) -> Any:
    return SimpleNamespace(type=kind, correlationid=invocation_id,
                           time=datetime.fromtimestamp(at, UTC), data=SimpleNamespace(**data))


def _line(invocation_id: str, base: float) -> list[Any]:
    return [_event("tool.invoke.requested", invocation_id, base + 0.0005),
            _event("tool.chain.resolved", invocation_id, base + 0.003),
            _event("tool.permission.decided", invocation_id, base + 0.0031),
            _event("tool.execution.started", invocation_id, base + 0.004),
            _event("tool.execution.finished", invocation_id, base + 0.030, duration_ms=20.0),
            _event("tool.invoke.completed", invocation_id, base + 0.031)]


def test_each_hop_is_measured_between_its_marks() -> None:
    sent = {"a": Sent(100.0, 100.035), "b": Sent(200.0, 200.035)}
    figures = hop_figures(sent, _line("a", 100.0) + _line("b", 200.0))
    assert figures["hop breakdown invocations"] == 2
    expected = {"request produced -> chain resolved": 3.0,
                "chain resolved -> execution started stamped": 1.0,
                "execution started stamped -> run begins (write-ahead)": 6.0,
                "primitive run": 20.0,
                "run ends -> terminal stamped": 1.0,
                "terminal stamped -> producer has it": 4.0}
    assert set(expected) == {label for label, _, _ in HOPS}
    for label, ms in expected.items():
        assert abs(figures[f"hop p50 ms: {label}"] - ms) < 0.01, label


def test_a_retried_invocation_is_timed_by_its_first_marks() -> None:
    events = [*_line("a", 100.0),
              _event("tool.execution.started", "a", 100.040),
              _event("tool.execution.finished", "a", 100.060, duration_ms=5.0)]
    figures = hop_figures({"a": Sent(100.0, 100.035)}, events)
    assert abs(figures["hop p50 ms: primitive run"] - 20.0) < 0.01


def test_invocations_without_a_whole_time_line_are_left_out() -> None:
    sent = {"a": Sent(100.0, 100.035), "lost": Sent(300.0, 300.1)}
    partial = [_event("tool.chain.resolved", "lost", 300.002)]
    others = _line("someone-else", 400.0)
    figures = hop_figures(sent, _line("a", 100.0) + partial + others)
    assert figures["hop breakdown invocations"] == 1
    assert hop_figures({"lost": Sent(300.0, 300.1)}, partial) == {}
