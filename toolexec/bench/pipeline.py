"""Scenarios 1-3 of `toolexec bench`: the whole pipeline against direct baselines.

Each pipeline figure has a baseline measured in the same run at the same concurrency:
spawning the tool's own argv directly (scenarios 1 and 3) or calling the HTTP server
directly with httpx (scenario 2). Load is closed-loop: N workers, each starting its
next call when the previous one ended, for a fixed time.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from domain.model import SubprocessPlan
from toolexec.bench.clients import ShardedClients
from toolexec.bench.env import (
    API_PARAMS,
    API_TOOL,
    HANG_SECONDS,
    SCRIPT_PARAMS,
    SCRIPT_TOOL,
    BenchEnvironment,
    CpuMeter,
)
from toolexec.bench.env import script_plan as build_script_plan
from toolexec.bench.hops import Sent, hop_figures, invocation_facts
from toolexec.bench.report import Figure, ScenarioResult, latency_figures, percentile

Call = Callable[[], Awaitable[bool]]
OVERHEAD_TARGET_MS = 5.0
THROUGHPUT_TARGET = 1000.0
THROUGHPUT_RATIO_TARGET = 0.5
SCRIPT_RATIO_TARGET = 0.90
READ_MODEL_LAG_TARGET_MS = 1000.0
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass
class Load:
    """What a closed-loop run observed."""

    calls: int = 0
    errors: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.calls / self.elapsed if self.elapsed else 0.0


async def closed_loop(call: Call, *, concurrency: int, seconds: float) -> Load:
    """`concurrency` workers calling `call` back to back until `seconds` have passed;
    calls in flight at the deadline are finished and counted."""
    load = Load()
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            ok = await call()
            load.latencies.append(time.perf_counter() - began)
            load.calls += 1
            load.errors += not ok

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    load.elapsed = time.perf_counter() - began
    return load


async def sequential(call: Call, count: int) -> Load:
    """`count` calls one after another."""
    load = Load()
    began = time.perf_counter()
    for _ in range(count):
        started = time.perf_counter()
        ok = await call()
        load.latencies.append(time.perf_counter() - started)
        load.calls += 1
        load.errors += not ok
    load.elapsed = time.perf_counter() - began
    return load


# ------------------------------------------------------------------ the direct baselines


class DirectSpawn:
    """Spawns the script tool's argv directly: its files written once to a directory,
    parameters on stdin, exit watched through a pidfd. The leanest correct way to run
    the same process, so the difference is what the pipeline adds."""

    def __init__(self, plan: SubprocessPlan, root: Path) -> None:
        self._argv = list(plan.argv)
        self._cwd = Path(tempfile.mkdtemp(prefix="direct-", dir=root))
        for tool_file in plan.files:
            target = self._cwd / tool_file.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tool_file.content or b"")
        self._env = {**plan.env, "PATH": plan.env.get("PATH", DEFAULT_PATH),
                     "HOME": str(self._cwd), "TMPDIR": str(self._cwd)}
        self._stdin = json.dumps(SCRIPT_PARAMS).encode()

    async def __call__(self) -> bool:
        process = subprocess.Popen(  # noqa: S603 - the tool's own argv list
            self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=self._cwd, env=self._env, bufsize=0)
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(self._stdin)
        process.stdin.close()
        await _exited(process.pid)
        # The trivial tool's output fits in the pipe buffer, so reading after exit is safe.
        output = process.stdout.read()
        process.stdout.close()
        if process.stderr is not None:
            process.stderr.close()
        status = os.waitpid(process.pid, 0)[1]
        process.returncode = os.waitstatus_to_exitcode(status)
        return process.returncode == 0 and b'"ok": true' in output


async def _exited(pid: int) -> None:
    loop = asyncio.get_running_loop()
    fd = os.pidfd_open(pid)
    done: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def pipeline_call(env: BenchEnvironment, tool_id: str, params: dict[str, Any],
                  durations: list[float] | None = None,
                  timeline: dict[str, Sent] | None = None) -> Call:
    """One invocation through the whole pipeline; True when it completed.
    `durations` collects each completed invocation's primitive run time (seconds),
    `timeline` when each was produced and answered (wall clock, for the hops)."""
    client = env.client
    assert client is not None

    async def call() -> bool:
        produced = time.time()
        terminal = await client.invoke(tool_id, params, timeout=HANG_SECONDS)
        ok = terminal.type == "tool.invoke.completed"
        if ok and durations is not None:
            durations.append(terminal.data.duration_ms / 1000)
        if ok and timeline is not None:
            timeline[terminal.correlationid] = Sent(produced, time.time())
        return ok

    return call


# ------------------------------------------------------------------------ the scenarios


async def invoke_overhead(env: BenchEnvironment, *, calls: int, warmup: int) -> ScenarioResult:
    """Scenario 1: sequential invocations of the trivial script tool vs direct spawns."""
    direct = DirectSpawn(build_script_plan(env.tools_dir), env.root)
    durations: list[float] = []
    timeline: dict[str, Sent] = {}
    pipeline = pipeline_call(env, SCRIPT_TOOL, SCRIPT_PARAMS, durations, timeline)
    await sequential(direct, warmup)
    await sequential(pipeline, warmup)
    durations.clear()
    timeline.clear()
    base = await sequential(direct, calls)
    meter = CpuMeter(env)
    meter.start()
    measured = await sequential(pipeline, calls)
    cpu = meter.figures(measured.calls)
    overhead_ms = (percentile(measured.latencies, 50) - percentile(base.latencies, 50)) * 1000
    figures: dict[str, Figure] = {
        **latency_figures("pipeline", measured.latencies),
        **latency_figures("direct spawn", base.latencies),
        "overhead p50 ms": round(overhead_ms, 3),
        "overhead p95 ms": round((percentile(measured.latencies, 95)
                                  - percentile(base.latencies, 95)) * 1000, 3),
        "overhead p99 ms": round((percentile(measured.latencies, 99)
                                  - percentile(base.latencies, 99)) * 1000, 3),
        "primitive run p50 ms": round(percentile(durations, 50) * 1000, 3),
        "pipeline minus primitive p50 ms": round(
            (percentile(measured.latencies, 50) - percentile(durations, 50)) * 1000, 3),
        **cpu, "calls (each)": calls, "errors": measured.errors + base.errors,
        **hop_figures(timeline, await invocation_facts(env.bootstrap, set(timeline))),
    }
    return ScenarioResult(
        "overhead", "1. invoke overhead (script tool, sequential)", figures,
        f"p50 overhead <= {OVERHEAD_TARGET_MS:g} ms", overhead_ms <= OVERHEAD_TARGET_MS,
        ["latency seen by the producer: request produced -> terminal event consumed",
         "primitive run = the executor's own spawn-to-exit time (incl. file materialising)",
         "hops = the pipeline's stamped event times between the producer's own clock "
         "readings (one host's clock; toolexec/bench/hops.py)"])


async def api_throughput(env: BenchEnvironment, *, concurrency: int,
                         seconds: float) -> ScenarioResult:
    """Scenario 2: closed-loop API-tool invocations vs httpx (the target's baseline) and
    aiohttp (the executor's client) straight to the server."""
    url = f"http://{env.http_host}/item/{API_PARAMS['word']}"
    # httpx at its best: one client with 50 requests in flight is several times
    # slower than sharded clients (see toolexec.bench.clients).
    http = ShardedClients(lambda n: httpx.AsyncClient(
        limits=httpx.Limits(max_connections=n, max_keepalive_connections=n)),
        max_connections=concurrency)

    async def direct() -> bool:
        with http.lease() as client:
            response = await client.get(url)
        return response.status_code == 200

    try:
        await closed_loop(direct, concurrency=concurrency, seconds=min(1.0, seconds))
        base = await closed_loop(direct, concurrency=concurrency, seconds=seconds)
    finally:
        await http.aclose()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        async def direct_aiohttp() -> bool:
            async with s.get(url) as response:
                await response.read()
                return response.status == 200

        await closed_loop(direct_aiohttp, concurrency=concurrency, seconds=min(1.0, seconds))
        lean = await closed_loop(direct_aiohttp, concurrency=concurrency, seconds=seconds)
    pipeline = pipeline_call(env, API_TOOL, API_PARAMS)
    await closed_loop(pipeline, concurrency=concurrency, seconds=min(1.0, seconds))
    await env.read_model_lag()  # forget the warm-up's
    meter = CpuMeter(env)
    meter.start()
    measured = await closed_loop(pipeline, concurrency=concurrency, seconds=seconds)
    cpu = meter.figures(measured.calls)
    lag = await env.read_model_lag()
    figures: dict[str, Figure] = {
        "pipeline invocations/s": round(measured.rate, 1),
        "httpx direct calls/s": round(base.rate, 1),
        "ratio": round(measured.rate / base.rate, 4) if base.rate else 0.0,
        "aiohttp direct calls/s": round(lean.rate, 1),
        "ratio to aiohttp": round(measured.rate / lean.rate, 4) if lean.rate else 0.0,
        **latency_figures("pipeline", measured.latencies),
        **latency_figures("direct", base.latencies),
        **cpu, **lag_figures(lag), "concurrency": concurrency, "seconds": seconds,
        "invocations": measured.calls, "errors": measured.errors + base.errors + lean.errors,
    }
    holds = measured.rate >= THROUGHPUT_TARGET or (
        bool(base.rate) and measured.rate / base.rate >= THROUGHPUT_RATIO_TARGET)
    return ScenarioResult(
        "throughput", f"2. API-tool throughput ({concurrency} producers)", figures,
        f">= {THROUGHPUT_TARGET:,.0f} invocations/s or >= {THROUGHPUT_RATIO_TARGET:g} of "
        "direct httpx", holds,
        ["one producer process (this one), pipeline and HTTP server in processes of their own",
         "read models lag = from a record's log timestamp to the commit of the read-model "
         f"batch holding it, every record of the measured run (target <= "
         f"{READ_MODEL_LAG_TARGET_MS:g} ms at p99)"])


def lag_figures(lag: dict[str, dict[str, float]]) -> dict[str, Figure]:
    """The slowest read-model runner's lag percentiles, and which one it is."""
    if not lag:
        return {}
    worst = max(lag, key=lambda name: lag[name]["p99"])
    return {"read models lag p50 ms": max(m["p50"] for m in lag.values()),
            "read models lag p99 ms": lag[worst]["p99"],
            "read models lag max ms": max(m["max"] for m in lag.values()),
            "read models lag p99 <= 1 s": "yes" if lag[worst]["p99"] <= READ_MODEL_LAG_TARGET_MS
            else "no", "read-model runner": worst}


async def script_throughput(env: BenchEnvironment, *, concurrency: int,
                            seconds: float) -> ScenarioResult:
    """Scenario 3: closed-loop script-tool invocations vs direct spawns, same concurrency."""
    direct = DirectSpawn(build_script_plan(env.tools_dir), env.root)
    base = await closed_loop(direct, concurrency=concurrency, seconds=seconds)
    pipeline = pipeline_call(env, SCRIPT_TOOL, SCRIPT_PARAMS)
    meter = CpuMeter(env)
    meter.start()
    measured = await closed_loop(pipeline, concurrency=concurrency, seconds=seconds)
    cpu = meter.figures(measured.calls)
    ratio = measured.rate / base.rate if base.rate else 0.0
    figures: dict[str, Figure] = {
        "pipeline calls/s": round(measured.rate, 1),
        "direct spawn calls/s": round(base.rate, 1),
        "ratio": round(ratio, 4),
        **latency_figures("pipeline", measured.latencies),
        **latency_figures("direct", base.latencies),
        **cpu, "in flight": concurrency, "seconds": seconds,
        "invocations": measured.calls, "errors": measured.errors + base.errors,
    }
    return ScenarioResult(
        "script-throughput", f"3. script-tool throughput ({concurrency} in flight)", figures,
        f">= {SCRIPT_RATIO_TARGET:.0%} of the direct spawn rate", ratio >= SCRIPT_RATIO_TARGET)
