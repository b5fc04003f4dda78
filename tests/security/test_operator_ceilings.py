"""Issue 14, door 5: the operator's ceilings bound every run; a manifest only narrows them.

Repros of the hole: `resource_limits.memory: 64Gi` was honoured, no CPU limit existed
by default, one run wrote gigabytes to the host disk (a per-file limit only), and all
runs shared uid 65534, so one tool holding its processes made every other tool fail
(`setpriv: failed to execute python3: Resource temporarily unavailable`, E3401).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
import structlog

from consumers.primitives.file_store import ContentStore
from consumers.primitives.subprocess_primitive import run_subprocess
from domain.integrity import seal
from domain.model import PrimitiveOutcome, ResolvedChain, SubprocessPlan, ToolSource
from domain.plan import build_plan
from domain.sandbox_policy import GIB, SandboxPolicy
from tests.waiting import WAIT
from toolexec.sources import load_builtin_sources, load_source

pytestmark = [pytest.mark.security]

TOOLS = Path(__file__).parent / "tools"
WAIT_SECONDS = WAIT


def _plan(name: str, **manifest_changes: Any) -> SubprocessPlan:
    source = load_source(TOOLS / name)
    if manifest_changes:
        manifest = {k: v for k, v in {**source.manifest, **manifest_changes}.items()
                    if v is not None}
        source = ToolSource(manifest=manifest, files=source.files, origin="test")
    builtins = {s.manifest["tool_id"]: s for s in load_builtin_sources()}
    plan = build_plan(ResolvedChain((seal(source), seal(builtins["python_runtime"]),
                                     seal(builtins["subprocess"]))))
    assert isinstance(plan, SubprocessPlan)
    return plan


async def _run(sandbox: str, tmp_path: Path, plan: SubprocessPlan, params: dict[str, Any] | None = None,
               **options: Any) -> PrimitiveOutcome:
    return await run_subprocess(plan, params or {}, store=ContentStore(tmp_path / "cas"),
                                work_root=tmp_path / "work", sandbox=sandbox, **options)


async def test_limits_a_manifest_asks_above_the_ceilings_are_cut_down(tmp_path: Path, sandbox: str) -> None:
    with structlog.testing.capture_logs() as logs:
        outcome = await _run(sandbox, tmp_path, _plan("limits_reporter"))
    assert outcome.ok, (outcome.error, outcome.stderr)
    got = json.loads(outcome.stdout)
    ceilings = SandboxPolicy()
    assert got["memory"] <= ceilings.max_memory_bytes < 64 * GIB
    assert got["reserved_3gib"] is False
    assert got["cpu"] is not None and got["cpu"] <= ceilings.max_cpu_seconds
    assert got["processes"] is not None and got["processes"] <= ceilings.max_processes
    assert got["file"] is not None and got["file"] <= ceilings.max_disk_bytes
    narrowed = [entry for log in logs if log["event"] == "sandbox.limits_narrowed"
                for entry in log["narrowed"]]
    assert {"limit": "memory_bytes", "asked": 64 * GIB,
            "granted": ceilings.max_memory_bytes} in narrowed


async def test_a_tool_that_asks_for_nothing_still_has_a_cpu_limit(tmp_path: Path, sandbox: str) -> None:
    outcome = await _run(sandbox, tmp_path, _plan("limits_reporter", resource_limits=None,
                                         timeout_default=20))
    assert outcome.ok, (outcome.error, outcome.stderr)
    assert json.loads(outcome.stdout)["cpu"] == 20  # one core for its whole wall time


async def test_one_run_holding_its_processes_leaves_other_runs_theirs(tmp_path: Path, sandbox: str) -> None:
    marker = f"door5-{os.getpid()}-{id(tmp_path)}"
    hog = _plan("process_hog")
    hog = dataclasses.replace(hog, argv=(*hog.argv, marker))
    holding = asyncio.create_task(_run(sandbox, tmp_path, hog))
    try:
        await _until(lambda: _processes_with(marker) >= 30 or holding.done())
        assert not holding.done(), holding.result()
        other = await _run(sandbox, tmp_path, _plan("spawner"))
    finally:
        holding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await holding
    assert other.ok, other.error
    assert json.loads(other.stdout) == {"helper": "helper ran"}


async def test_the_operators_process_ceiling_holds_a_run_below_it(tmp_path: Path, sandbox: str) -> None:
    """process_hog asks for 40 processes; the operator allows 10. It prints how many it
    holds, then waits until the wall-time ceiling stops it."""
    outcome = await _run(sandbox, tmp_path, _plan("process_hog"),
                         policy=SandboxPolicy(max_processes=10, max_wall_seconds=5))
    assert outcome.error is not None and outcome.error["code"] == "E3402", outcome
    assert int(outcome.stdout.split()[0]) < 10


async def test_a_run_cannot_write_more_than_its_disk_quota(tmp_path: Path, sandbox: str) -> None:
    outcome = await _run(sandbox, tmp_path, _plan("disk_filler"), {"mib": 64})
    assert outcome.ok, (outcome.error, outcome.stderr)
    report = json.loads(outcome.stdout)
    assert report["written_mib"] <= 16  # ephemeral_storage: 16Mi, for the whole run
    assert report["refusal"] is not None


async def test_the_operators_wall_time_ceiling_stops_a_long_run(tmp_path: Path, sandbox: str) -> None:
    plan = _plan("process_hog")
    assert plan.timeout_seconds == 120
    outcome = await _run(sandbox, tmp_path, plan, policy=SandboxPolicy(max_wall_seconds=2))
    assert not outcome.ok and outcome.error["code"] == "E3402"
    assert outcome.error["details"]["timeout_seconds"] == 2


def _processes_with(marker: str) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in Path(entry.path, "cmdline").read_bytes():
                    count += 1
    return count


async def _until(condition: Any) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_SECONDS
    while not condition():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)
