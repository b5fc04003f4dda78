"""`toolexec bench --quick` as a smoke test: it runs and reports every scenario.

Timings are never asserted: the figures are information, measured on whatever the
test machine happens to be doing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import process_gone, until
from toolexec.bench.command import SCENARIOS

pytestmark = pytest.mark.integration


def _toolexec(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """The real command in a process of its own (it configures global logging)."""
    return subprocess.run([sys.executable, "-m", "toolexec.cli", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def quick_report() -> dict:
    result = _toolexec("bench", "--quick", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_quick_bench_reports_the_machine(quick_report: dict) -> None:
    machine = quick_report["machine"]
    assert machine["cores"] >= 1
    assert machine["python"].startswith("CPython 3.")
    assert machine["broker"].startswith("Tansu ")


def test_quick_bench_reports_every_scenario_with_a_target(quick_report: dict) -> None:
    assert [s["name"] for s in quick_report["scenarios"]] == list(SCENARIOS)
    for scenario in quick_report["scenarios"]:
        assert "error" not in scenario["figures"], scenario
        assert scenario["target"]
        assert scenario["holds"] in (True, False, None)


def test_quick_bench_pairs_each_figure_with_a_same_run_baseline(quick_report: dict) -> None:
    figures = {s["name"]: s["figures"] for s in quick_report["scenarios"]}
    assert {"pipeline p50 ms", "direct spawn p50 ms", "overhead p50 ms"} <= set(
        figures["overhead"])
    assert figures["overhead"]["hop breakdown invocations"] == figures["overhead"][
        "calls (each)"]
    assert abs(figures["overhead"]["hop p50 ms: primitive run"]
               - figures["overhead"]["primitive run p50 ms"]) < 0.01
    assert {"pipeline invocations/s", "httpx direct calls/s", "ratio"} <= set(
        figures["throughput"])
    assert {"pipeline calls/s", "direct spawn calls/s", "ratio"} <= set(
        figures["script-throughput"])
    assert {"total p50 us", "baseline: integrity uncached us"} <= set(figures["hot-path"])
    assert {"rebuild events/s", "raw aiokafka events/s", "ratio"} <= set(figures["replay"])


def test_quick_bench_invocations_all_complete(quick_report: dict) -> None:
    for scenario in quick_report["scenarios"]:
        assert scenario["figures"].get("errors", 0) == 0, scenario


def test_unknown_scenario_is_bad_usage() -> None:
    result = _toolexec("bench", "--scenario", "nope", timeout=60)
    assert result.returncode == 2
    assert "unknown scenario" in result.stderr


def test_quick_bench_compares_each_sandbox_with_a_bare_spawn(quick_report: dict) -> None:
    figures = {s["name"]: s["figures"] for s in quick_report["scenarios"]}["sandbox"]
    assert {"bare spawn p50 ms", "rlimits p50 ms", "rlimits over bare p50 ms",
            "default sandbox"} <= set(figures)
    assert f"{figures['default sandbox']} over bare p50 ms" in figures


def test_quick_bench_pairs_checkpointing_with_the_same_tool_without(quick_report: dict) -> None:
    figures = {s["name"]: s["figures"] for s in quick_report["scenarios"]}["checkpoints"]
    assert {"with checkpoints ms/step p50", "without ms/step p50", "overhead ms/step p50",
            "executor ms/checkpoint p50", "compression ratio", "deltas %"} <= set(figures)
    assert figures["checkpoints"] >= 1 and figures["errors"] == 0
    assert figures["compression ratio"] > 1  # what the store keeps is smaller than the state


def _processes_under(folder: Path) -> list[bytes]:
    """The command lines of the live processes that name a path under `folder`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(folder).encode() in cmdline and not process_gone(int(entry.name)):
                found.append(cmdline)
    return found


def test_a_terminated_bench_stops_the_stacks_and_brokers_it_started(tmp_path: Path) -> None:
    bench = subprocess.Popen([sys.executable, "-m", "toolexec.cli", "bench",
                              "--scenario", "gateway-overhead"],
                             env={**os.environ, "TMPDIR": str(tmp_path)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # `up` and its broker supervisor (which outlives `up` by design) are running
        until(lambda: any(b"up-state" in cmdline for cmdline in _processes_under(tmp_path)),
              "the broker of the bench's `up`")
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=120) == 143, bench.stderr.read().decode()[-2000:]
    finally:
        if bench.poll() is None:
            bench.kill()
    until(lambda: not _processes_under(tmp_path), "every process the bench started to end")
