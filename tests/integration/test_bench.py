"""`toolexec bench --quick` as a smoke test: it runs and reports every scenario.

Timings are never asserted: the figures are information, measured on whatever the
test machine happens to be doing. Nor are they waited for with a fixed bound: a bench
fails as hung only when it has reported no progress (a line on stderr) for `STALL`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import pytest

from tests.waiting import WAIT, process_gone, until, until_progressing
from toolexec.bench.command import SCENARIOS

STALL = 600.0
"""How long a bench may report nothing before it counts as hung (a quick scenario
takes seconds on a quiet machine; the whole run is bounded in count and time)."""

# the bench's own progress decides when it is hung; this only stops one that keeps
# talking without ever ending
pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]


class Bench:
    """`toolexec bench ARGS` in a process of its own (it configures global logging);
    the lines it writes to stderr (each stage it begins, its logs) are its progress."""

    def __init__(self, *args: str, stdout: IO[Any] | int = subprocess.DEVNULL,
                 env: Mapping[str, str] | None = None) -> None:
        self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "toolexec.cli", "bench", *args], stdout=stdout,
            stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def until(self, predicate: Any, what: str) -> Any:
        """`predicate()` once true, while the bench runs and keeps reporting."""
        def running_and(predicate: Any = predicate) -> Any:
            value = predicate()
            assert value or self.process.poll() is None, f"the bench ended: {self.tail()}"
            return value
        return until_progressing(running_and, what, lambda: len(self.lines), STALL)

    def exit_code(self) -> int:
        """Its exit code, once it has ended (however long that takes while it reports)."""
        until_progressing(lambda: self.process.poll() is not None, "the bench to end",
                          lambda: len(self.lines), STALL)
        self._reader.join(timeout=WAIT)
        return self.process.returncode

    def tail(self) -> str:
        return "\n".join(self.lines)[-3000:]

    def stop(self) -> None:
        """End it if it still runs: SIGTERM first, so that it stops what it started."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    document = tmp_path_factory.mktemp("bench") / "quick.json"
    with document.open("w") as stdout:
        bench = Bench("--quick", "--json", stdout=stdout)
    try:
        assert bench.exit_code() == 0, bench.tail()
    finally:
        bench.stop()
    yield json.loads(document.read_text())


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


def test_quick_bench_reports_the_cpu_of_the_stack_and_of_the_whole_broker(
        quick_report: dict) -> None:
    # the broker is its supervisor's process tree (Tansu, the gate): never left out
    figures = {s["name"]: s["figures"] for s in quick_report["scenarios"]}
    for name in ("overhead", "throughput", "script-throughput"):
        assert figures[name]["stack CPU ms/invocation"] > 0, name
        assert figures[name]["broker CPU ms/invocation"] > 0, name
    assert figures["gateway-overhead"]["broker CPU ms/invocation"] > 0
    assert figures["idle"]["broker % of a core"] >= 0


def test_quick_bench_invocations_all_complete(quick_report: dict) -> None:
    for scenario in quick_report["scenarios"]:
        assert scenario["figures"].get("errors", 0) == 0, scenario


def test_unknown_scenario_is_bad_usage() -> None:
    bench = Bench("--scenario", "nope")
    try:
        assert bench.exit_code() == 2
    finally:
        bench.stop()
    assert "unknown scenario" in bench.tail()


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
    bench = Bench("--scenario", "gateway-overhead", env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        # `up` and its broker supervisor (which outlives `up` by design) are running
        bench.until(lambda: any(b"up-state" in cmdline for cmdline in _processes_under(tmp_path)),
                    "the broker of the bench's `up`")
        bench.process.send_signal(signal.SIGTERM)
        assert bench.exit_code() == 143, bench.tail()
    finally:
        bench.stop()
    until(lambda: not _processes_under(tmp_path), "every process the bench started to end")
