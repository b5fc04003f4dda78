"""Scenarios of `toolexec bench` run against `toolexec up` itself, as a user runs it:
1b, the HTTP gateway's sync invoke against direct spawns; and the CPU an idle `up`
(its process and its broker) burns while nothing happens.

`up` runs as its own process on a state directory of the bench's temp dir, with the
bench tools and the embedded profile (its own broker, read models, gateway).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

from toolexec.bench.env import (
    HANG_SECONDS,
    SCRIPT_PARAMS,
    SCRIPT_TOOL,
    BenchEnvironment,
    cpu_seconds,
    tree_cpu_seconds,
)
from toolexec.bench.env import script_plan as build_script_plan
from toolexec.bench.pipeline import OVERHEAD_TARGET_MS, DirectSpawn, sequential
from toolexec.bench.report import Figure, ScenarioResult, latency_figures, percentile
from toolexec.broker_control import stop_broker
from toolexec.child_python import module_argv
from toolexec.settings import Settings

UP_START_SECONDS = HANG_SECONDS
UP_STOP_SECONDS = 120.0
IDLE_SETTLE_SECONDS = 5.0
IDLE_TARGET_PERCENT = 5.0


@dataclass
class UpProcess:
    """`toolexec up` on a state directory of its own, stopped with SIGTERM."""

    root: Path
    tools_dir: Path
    process: subprocess.Popen[bytes] | None = None
    runtime: dict[str, object] | None = None

    async def __aenter__(self) -> UpProcess:
        state = self.root / "up-state"
        # an `up` of an earlier scenario killed on its way out leaves its runtime file
        (state / "runtime.json").unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLEXEC_")}
        env.update(TOOLEXEC_STATE_DIR=str(state), TOOLEXEC_TOOLS_DIR=str(self.root / "none"),
                   TOOLEXEC_USER_TOOLS_DIR="", TOOLEXEC_LOG_LEVEL="WARNING")
        log = (self.root / "up.log").open("wb")
        self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            module_argv("toolexec.cli", "up", "--tools", str(self.tools_dir)),
            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()  # the child holds its own copy
        try:
            self.runtime = await self._started(state / "runtime.json")
        except BaseException:  # failed or cancelled while starting: stop what started
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _started(self, runtime_file: Path) -> dict[str, object]:
        assert self.process is not None
        deadline = time.monotonic() + UP_START_SECONDS
        while not runtime_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / "up.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"toolexec up did not start: {tail}")
            await asyncio.sleep(0.1)
        return dict(json.loads(runtime_file.read_text()))

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            await asyncio.to_thread(self.process.wait, UP_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            await asyncio.to_thread(self.process.wait)
        # `up` leaves its embedded broker running (with its log); the bench's is done.
        await asyncio.to_thread(stop_broker, Settings(state_dir=self.root / "up-state"))

    @property
    def gateway_url(self) -> str:
        assert self.runtime is not None
        return str(self.runtime["gateway_url"])

    def pids(self) -> dict[str, int | None]:
        """`up`, and its broker's supervisor (the broker is measured as its tree)."""
        assert self.process is not None and self.runtime is not None
        supervisor = self.runtime.get("broker_supervisor_pid")
        return {"up": self.process.pid, "broker": int(supervisor) if supervisor else None}


def _cpu(pids: dict[str, int | None]) -> dict[str, float | None]:
    """CPU seconds so far of `up` (its own process) and of its broker: the supervisor,
    Tansu and the gate (`tree_cpu_seconds`)."""
    return {"up": cpu_seconds(pids["up"]), "broker": tree_cpu_seconds(pids["broker"])}


async def gateway_overhead(env: BenchEnvironment, *, calls: int,
                           warmup: int) -> ScenarioResult:
    """Scenario 1b: sequential sync invokes through `up`'s HTTP gateway vs direct spawns."""
    direct = DirectSpawn(build_script_plan(env.tools_dir), env.root)
    async with UpProcess(env.root, env.tools_dir) as up, \
            httpx.AsyncClient(base_url=up.gateway_url, timeout=HANG_SECONDS) as http:

        async def invoke() -> bool:
            response = await http.post("/v1/tools/invoke", json={
                "tool_id": SCRIPT_TOOL, "parameters": SCRIPT_PARAMS})
            return response.status_code == 200

        await sequential(direct, warmup)
        await sequential(invoke, warmup)
        base = await sequential(direct, calls)
        before = _cpu(up.pids())
        measured = await sequential(invoke, calls)
        after = _cpu(up.pids())
    overhead_ms = (percentile(measured.latencies, 50) - percentile(base.latencies, 50)) * 1000
    cpu: dict[str, Figure] = {
        f"{name} CPU ms/invocation": round((after[name] - began) / calls * 1000, 3)
        for name, began in before.items()
        if began is not None and after.get(name) is not None}
    figures: dict[str, Figure] = {
        **latency_figures("gateway sync invoke", measured.latencies),
        **latency_figures("direct spawn", base.latencies),
        "overhead p50 ms": round(overhead_ms, 3),
        "overhead p95 ms": round((percentile(measured.latencies, 95)
                                  - percentile(base.latencies, 95)) * 1000, 3),
        **cpu, "calls (each)": calls, "errors": measured.errors + base.errors,
    }
    return ScenarioResult(
        "gateway-overhead", "1b. invoke overhead through the HTTP gateway (sync, sequential)",
        figures, f"p50 overhead <= {OVERHEAD_TARGET_MS:g} ms", overhead_ms <= OVERHEAD_TARGET_MS,
        ["POST /v1/tools/invoke of `toolexec up` (embedded: its broker, read models, "
         "gateway), keep-alive HTTP client; `up` CPU includes its read models"])


async def idle_cpu(env: BenchEnvironment, *, seconds: float) -> ScenarioResult:
    """CPU of an idle `toolexec up` (its process and its broker), as % of one core."""
    async with UpProcess(env.root, env.tools_dir) as up:
        await asyncio.sleep(IDLE_SETTLE_SECONDS)  # past start-up and the fetch linger
        pids = up.pids()
        before, began = _cpu(pids), time.monotonic()
        await asyncio.sleep(seconds)
        after, elapsed = _cpu(pids), time.monotonic() - began
    percent = {name: (after[name] - start) / elapsed * 100
               for name, start in before.items()
               if start is not None and after.get(name) is not None}
    total = sum(percent.values())
    figures: dict[str, Figure] = {
        **{f"{name} % of a core": round(value, 2) for name, value in percent.items()},
        "total % of a core": round(total, 2), "seconds": seconds}
    return ScenarioResult(
        "idle", "idle `toolexec up` (process + broker)", figures,
        f"<= {IDLE_TARGET_PERCENT:g} % of a core", total <= IDLE_TARGET_PERCENT,
        [f"measured {IDLE_SETTLE_SECONDS:g} s after start, no invocations"])
