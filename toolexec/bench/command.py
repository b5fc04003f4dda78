"""`toolexec bench`: performance figures, each with a baseline measured in the same run.

Starts its own embedded stack (Tansu broker + pipeline in a child process, a local
HTTP server in another, state under a fresh temp dir; `toolexec up` itself for the
gateway and idle scenarios), runs the scenarios and prints a table (or --json). Targets are information: a missed target still exits
0. All load stays on 127.0.0.1 and is bounded in count and time.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from toolexec.bench.report import ScenarioResult

# The scenarios and the report are imported when the bench runs: registering the
# command imports nothing of the bench but this module.

SCENARIOS = ("overhead", "gateway-overhead", "throughput", "script-throughput", "idle",
             "hot-path", "replay", "sandbox", "search", "checkpoints")
NEEDS_STACK = frozenset({"overhead", "gateway-overhead", "throughput", "script-throughput",
                         "idle"})
REAL_TIME_SAFE = frozenset({"sandbox", "hot-path"})
"""Scenarios that start no server: the only ones run under a real-time policy (`chrt`).
The others start a broker, PostgreSQL or `toolexec up`, which would inherit it: one
real-time server busy in a loop (a CREATE INDEX) starves what it waits for and spins
every core."""


@dataclass(frozen=True)
class Sizes:
    """How much load each scenario applies."""

    overhead_calls: int
    overhead_warmup: int
    producers: int
    throughput_seconds: float
    script_in_flight: int
    script_seconds: float
    hot_path_iterations: int
    replay_events: int
    idle_seconds: float
    checkpoint_steps: int
    checkpoint_rounds: int


FULL = Sizes(overhead_calls=200, overhead_warmup=20, producers=50, throughput_seconds=20.0,
             script_in_flight=10, script_seconds=10.0, hot_path_iterations=10_000,
             replay_events=100_000, idle_seconds=30.0, checkpoint_steps=40,
             checkpoint_rounds=5)
QUICK = Sizes(overhead_calls=20, overhead_warmup=3, producers=50, throughput_seconds=3.0,
              script_in_flight=10, script_seconds=3.0, hot_path_iterations=500,
              replay_events=10_000, idle_seconds=3.0, checkpoint_steps=8,
              checkpoint_rounds=1)

err = Console(stderr=True)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)


def bench(
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="small sizes (a smoke run)")] = False,
    scenario: Annotated[list[str], typer.Option(
        "--scenario", help=f"run only these ({', '.join(SCENARIOS)}); repeatable")] = [],  # noqa: B006
) -> None:
    """Performance figures with same-run baselines (exit 0 even when a target is missed)."""
    import asyncio

    from toolexec.bench.report import machine_info, render, report_document

    unknown = [name for name in scenario if name not in SCENARIOS]
    if unknown:
        err.print(f"[red]bad usage:[/] unknown scenario(s) {', '.join(unknown)}; "
                  f"choose from {', '.join(SCENARIOS)}")
        raise typer.Exit(2)
    chosen = [name for name in SCENARIOS if not scenario or name in scenario]
    servers = [name for name in chosen if name not in REAL_TIME_SAFE]
    if servers and os.sched_getscheduler(0) in (os.SCHED_FIFO, os.SCHED_RR):
        err.print(f"[red]bad usage:[/] {', '.join(servers)} would start servers under this "
                  "real-time policy (one busy real-time server can starve every core); "
                  "run them without `chrt`, or choose only "
                  f"{', '.join(f'--scenario {name}' for name in sorted(REAL_TIME_SAFE))}")
        raise typer.Exit(2)
    try:
        results = asyncio.run(_stopped_by_sigterm(run_bench(chosen, QUICK if quick else FULL)))
    except asyncio.CancelledError:
        err.print("bench: terminated; its stacks and brokers are stopped")
        raise typer.Exit(143) from None
    document = report_document(machine_info(), results, command=_command_line(quick, scenario, as_json),
                               quick=quick)
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        render(Console(width=None if sys.stdout.isatty() else 140), document)
    failed = any(result.figures.get("error") for result in results)
    raise typer.Exit(1 if failed else 0)


async def _stopped_by_sigterm(bench_run: Awaitable[list[ScenarioResult]]) -> list[ScenarioResult]:
    """Run the bench; SIGTERM cancels it, as Ctrl-C does, so that every stack, `up`
    and broker it started is stopped and its folders removed on the way out (the
    default SIGTERM ends the process at once and leaves them running)."""
    import asyncio

    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await bench_run


async def run_bench(chosen: list[str], sizes: Sizes) -> list[ScenarioResult]:
    """Run `chosen` scenarios in the issue's order; a stack is started only if needed."""
    from toolexec.bench.hotpath import hot_path

    results: list[ScenarioResult] = []
    if "hot-path" in chosen:
        with tempfile.TemporaryDirectory(prefix="toolexec-bench-") as root:
            results.append(await _guarded("hot-path", lambda: _now(
                hot_path(Path(root), iterations=sizes.hot_path_iterations))))
    if "replay" in chosen:
        results.append(await _guarded("replay", lambda: _replay(sizes)))
    if "sandbox" in chosen:
        results.append(await _guarded("sandbox", lambda: _sandbox(sizes)))
    if "search" in chosen:
        from toolexec.bench import search as bench_search

        results.append(await _guarded("search", lambda: bench_search.run(
            quick=sizes is QUICK)))
    if "checkpoints" in chosen:
        results.append(await _guarded("checkpoints", lambda: _checkpoints(sizes)))
    if NEEDS_STACK.intersection(chosen):
        results.extend(await _with_stack(chosen, sizes))
    return sorted(results, key=lambda r: SCENARIOS.index(r.name))


async def _with_stack(chosen: list[str], sizes: Sizes) -> list[ScenarioResult]:
    from toolexec.bench import pipeline
    from toolexec.bench import up as bench_up
    from toolexec.bench.env import BenchEnvironment

    err.print("bench: starting the embedded stack (broker, pipeline, HTTP server)...")
    async with BenchEnvironment(execute_workers=sizes.producers) as env:
        runs: dict[str, Callable[[], Awaitable[ScenarioResult]]] = {
            "overhead": lambda: pipeline.invoke_overhead(
                env, calls=sizes.overhead_calls, warmup=sizes.overhead_warmup),
            "gateway-overhead": lambda: bench_up.gateway_overhead(
                env, calls=sizes.overhead_calls, warmup=sizes.overhead_warmup),
            "throughput": lambda: pipeline.api_throughput(
                env, concurrency=sizes.producers, seconds=sizes.throughput_seconds),
            "script-throughput": lambda: pipeline.script_throughput(
                env, concurrency=sizes.script_in_flight, seconds=sizes.script_seconds),
            "idle": lambda: bench_up.idle_cpu(env, seconds=sizes.idle_seconds),
        }
        return [await _guarded(name, run) for name, run in runs.items() if name in chosen]


async def _replay(sizes: Sizes) -> ScenarioResult:
    """Scenario 5 on a broker of its own: a rebuild reads a log, it needs no pipeline
    (an idle one polls and would take a share of the cores from both the rebuild and
    its raw baseline)."""
    from toolexec.bench.replay import REPLAY_TOPICS, replay
    from toolexec.embedded_broker import EmbeddedBroker

    with tempfile.TemporaryDirectory(prefix="toolexec-bench-") as root:
        async with EmbeddedBroker(REPLAY_TOPICS, log_dir=Path(root)) as broker:
            return await replay(broker.bootstrap, Path(root), events=sizes.replay_events)


async def _sandbox(sizes: Sizes) -> ScenarioResult:
    """Scenario 6 needs no stack: it runs the subprocess primitive in this process."""
    from toolexec.bench.sandbox import sandbox_entry

    with tempfile.TemporaryDirectory(prefix="toolexec-bench-") as root:
        return await sandbox_entry(Path(root), calls=sizes.overhead_calls,
                                   warmup=sizes.overhead_warmup)


async def _checkpoints(sizes: Sizes) -> ScenarioResult:
    """Scenario 10 needs no stack: it runs the primitive and the checkpoint store here."""
    from toolexec.bench.checkpoints import checkpoints_scenario

    with tempfile.TemporaryDirectory(prefix="toolexec-bench-") as root:
        return await checkpoints_scenario(Path(root), steps=sizes.checkpoint_steps,
                                          rounds=sizes.checkpoint_rounds)


async def _now(result: ScenarioResult) -> ScenarioResult:
    return result


async def _guarded(name: str, run: Callable[[], Awaitable[ScenarioResult]]) -> ScenarioResult:
    """Run one scenario; an exception becomes a row carrying the error."""
    import traceback

    from toolexec.bench.report import ScenarioResult

    err.print(f"bench: {name}...")
    try:
        return await run()
    except Exception as exc:  # boundary: one broken scenario must not hide the others
        return ScenarioResult(name, name, {"error": repr(exc)}, "-", None,
                              [traceback.format_exc(limit=3)[-600:]])


def _command_line(quick: bool, scenarios: list[str], as_json: bool) -> str:
    parts = ["toolexec", "bench", *(["--quick"] if quick else []),
             *[f"--scenario {name}" for name in scenarios], *(["--json"] if as_json else [])]
    return " ".join(parts)
