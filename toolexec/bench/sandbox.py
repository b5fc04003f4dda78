"""Scenario 6 of `toolexec bench`: what entering each sandbox costs over a bare spawn.

The bench's trivial Python tool is run, interleaved call by call in one loop, by a
bare spawn (its argv, parameters on stdin, exit on a pidfd: `DirectSpawn`) and by the
subprocess primitive under every sandbox this host offers (the namespace launcher,
bubblewrap, Landlock, rlimits). Each primitive figure is the caller's wall time around `run_subprocess`,
so everything a run pays is in it: run directory, launch, supervision, clean-up. No
broker and no pipeline are involved. The target is judged on the sandbox "auto"
picks (the default).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from consumers.primitives import bubblewrap, landlock, namespace_launcher
from consumers.primitives.file_store import ContentStore
from consumers.primitives.subprocess_primitive import resolve_sandbox, run_subprocess
from domain.sandbox_policy import SandboxPolicy
from toolexec.bench.env import SCRIPT_PARAMS, script_plan, write_bench_tools
from toolexec.bench.pipeline import DirectSpawn
from toolexec.bench.report import Figure, ScenarioResult, percentile

SANDBOX_TARGET_MS = 2.0
Call = Callable[[], Awaitable[bool]]


def available_sandboxes() -> list[str]:
    """The sandboxes this host can run, in the fallback order of "auto"."""
    names = ["namespaces"] if namespace_launcher.usable() else []
    if bubblewrap.bwrap_binary() is not None:
        names.append("bwrap")
    if landlock.available():
        names.append("landlock")
    return [*names, "rlimits"]


def primitive_call(sandbox: str, root: Path) -> Call:
    """One run of the bench tool through the subprocess primitive under `sandbox`."""
    plan = script_plan(write_bench_tools(root, "127.0.0.1:9"))
    # a store of its own, as in a deployment, where one sandbox runs every script:
    # runs in host folders link the store's objects, which the others' checks see
    store = ContentStore(root / f"store-{sandbox}")
    policy = SandboxPolicy(protected_paths=(str(store.root),))

    async def call() -> bool:
        outcome = await run_subprocess(plan, SCRIPT_PARAMS, store=store,
                                       work_root=root / "work", sandbox=sandbox, policy=policy)
        return outcome.ok and b'"ok": true' in outcome.stdout

    return call


async def sandbox_entry(root: Path, *, calls: int, warmup: int) -> ScenarioResult:
    """Scenario 6: bare spawn vs each available sandbox, interleaved."""
    sandboxes = available_sandboxes()
    runs: dict[str, Call] = {"bare spawn": DirectSpawn(
        script_plan(write_bench_tools(root, "127.0.0.1:9")), root)}
    runs.update({name: primitive_call(name, root) for name in sandboxes})
    latencies: dict[str, list[float]] = {name: [] for name in runs}
    errors = 0
    for round_number in range(warmup + calls):
        for name, call in runs.items():
            began = time.perf_counter()
            ok = await call()
            elapsed = time.perf_counter() - began
            errors += not ok
            if round_number >= warmup:
                latencies[name].append(elapsed)
    bare_p50 = percentile(latencies["bare spawn"], 50)
    bare_p95 = percentile(latencies["bare spawn"], 95)
    figures: dict[str, Figure] = {}
    for name, values in latencies.items():
        p50, p95 = percentile(values, 50), percentile(values, 95)
        figures[f"{name} p50 ms"] = round(p50 * 1000, 3)
        figures[f"{name} p95 ms"] = round(p95 * 1000, 3)
        if name != "bare spawn":
            figures[f"{name} over bare p50 ms"] = round((p50 - bare_p50) * 1000, 3)
            figures[f"{name} over bare p95 ms"] = round((p95 - bare_p95) * 1000, 3)
    default = resolve_sandbox("auto")
    over = figures.get(f"{default} over bare p50 ms")
    figures.update({"default sandbox": default, "calls (each)": calls, "errors": errors})
    return ScenarioResult(
        "sandbox", "6. sandbox entry (script tool, sequential, interleaved)", figures,
        f"default sandbox p50 <= {SANDBOX_TARGET_MS:g} ms over bare",
        None if not isinstance(over, float) else over <= SANDBOX_TARGET_MS,
        ["bare spawn = the tool's argv spawned directly (files written once); a sandbox "
         "row = the caller's wall time around one subprocess-primitive run (run "
         "directory, launch, supervision and clean-up included)",
         "interleaved: each round runs every variant once, in the same order",
         "on a busy machine run it under `chrt -f 10` (root) so other work does not "
         "preempt the spawns; without it the figures measure the load"])
