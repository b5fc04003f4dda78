"""The operator's ceilings: a manifest can only narrow them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.model import HttpPlan, McpPlan, ResourceLimits, SubprocessPlan
from domain.sandbox_policy import (
    GIB,
    MIB,
    SandboxPolicy,
    disk_quota,
    narrow_plan,
    narrow_subprocess,
)

POLICY = SandboxPolicy(max_memory_bytes=GIB, max_cpu_seconds=60, max_processes=64,
                       max_disk_bytes=256 * MIB, max_wall_seconds=120)


def _plan(timeout: float = 30, **limits: object) -> SubprocessPlan:
    return SubprocessPlan(argv=("tool",), timeout_seconds=timeout,
                          limits=ResourceLimits(**limits))  # type: ignore[arg-type]


def test_asking_more_than_the_ceiling_gets_the_ceiling_and_says_so() -> None:
    plan, cuts = narrow_subprocess(_plan(3600, memory_bytes=64 * GIB, cpu_seconds=10_000,
                                         max_processes=100_000, max_file_bytes=100 * GIB),
                                   POLICY)
    assert plan.timeout_seconds == 120
    assert plan.limits.memory_bytes == GIB and plan.limits.cpu_seconds == 60
    assert plan.limits.max_processes == 64 and plan.limits.max_file_bytes == 256 * MIB
    assert {cut.limit for cut in cuts} == {"timeout_seconds", "memory_bytes", "cpu_seconds",
                                           "max_processes", "max_file_bytes"}
    assert {"limit": "memory_bytes", "asked": 64 * GIB, "granted": GIB} in [
        cut.to_dict() for cut in cuts]


def test_asking_less_keeps_what_was_asked() -> None:
    plan, cuts = narrow_subprocess(_plan(10, memory_bytes=64 * MIB, cpu_seconds=5,
                                         max_processes=8, max_file_bytes=MIB), POLICY)
    assert plan.limits == ResourceLimits(memory_bytes=64 * MIB, cpu_seconds=5,
                                         max_processes=8, max_file_bytes=MIB)
    assert cuts == ()


def test_without_a_cpu_limit_one_core_for_the_wall_time_applies() -> None:
    assert narrow_subprocess(_plan(45), POLICY)[0].limits.cpu_seconds == 45
    assert narrow_subprocess(_plan(0.2), POLICY)[0].limits.cpu_seconds == 1
    assert narrow_subprocess(_plan(3600), POLICY)[0].limits.cpu_seconds == 60


def test_an_unlimited_ask_is_above_any_ceiling() -> None:
    plan, _ = narrow_subprocess(_plan(memory_bytes=None, max_file_bytes=None), POLICY)
    assert plan.limits.memory_bytes == GIB and plan.limits.max_file_bytes == 256 * MIB


def test_the_process_count_is_left_to_the_sandbox_when_not_asked() -> None:
    assert narrow_subprocess(_plan(), POLICY)[0].limits.max_processes is None


def test_the_disk_quota_is_the_smaller_of_ask_and_ceiling() -> None:
    assert disk_quota(ResourceLimits(max_file_bytes=16 * MIB), POLICY) == 16 * MIB
    assert disk_quota(ResourceLimits(max_file_bytes=None), POLICY) == 256 * MIB


def test_http_and_mcp_calls_get_the_wall_time_ceiling() -> None:
    http, cuts = narrow_plan(HttpPlan(method="GET", url_template="https://x",
                                      timeout_seconds=999), POLICY)
    assert http.timeout_seconds == 120 and len(cuts) == 1
    mcp, _ = narrow_plan(McpPlan(server_key="s", tool_name="t", transport="stdio",
                                 timeout_seconds=999, server=_plan()), POLICY)
    assert mcp.timeout_seconds == 120


@pytest.mark.parametrize("field", ["max_memory_bytes", "max_cpu_seconds", "max_wall_seconds"])
def test_a_policy_needs_positive_ceilings(field: str) -> None:
    with pytest.raises(ValueError):
        SandboxPolicy(**{field: 0})


@given(memory=st.integers(0, 2**40), cpu=st.integers(1, 10**6), timeout=st.floats(0.01, 10**5))
def test_narrowing_never_raises_a_limit_above_the_ceiling(memory: int, cpu: int,
                                                         timeout: float) -> None:
    plan, _ = narrow_subprocess(_plan(timeout, memory_bytes=memory, cpu_seconds=cpu), POLICY)
    assert plan.limits.memory_bytes <= POLICY.max_memory_bytes
    assert plan.limits.cpu_seconds <= POLICY.max_cpu_seconds
    assert plan.timeout_seconds <= POLICY.max_wall_seconds
    assert plan.limits.memory_bytes == min(memory, POLICY.max_memory_bytes)
