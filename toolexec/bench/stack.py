"""The system under test of `toolexec bench`, run as its own process.

`python -m toolexec.bench.stack STATE_DIR TOOLS_DIR WORKERS` starts an embedded stack
(its own Tansu broker, every pipeline consumer and, as `toolexec up` runs them, the SQL
read models), publishes the built-in tools and the tools under TOOLS_DIR, waits until
its registry view holds them, prints one JSON line `{"bootstrap": ..., "published": N}`
and runs until stdin closes. Each line `lag` it reads on stdin is answered with one
JSON line: the read models' lag (log timestamp to commit) since the previous `lag`.

A separate process keeps the load generator's own work (building requests, decoding
terminal events, timing) off the pipeline's interpreter, as with a real producer, and
lets a profiler attach to the pipeline alone.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

from toolexec import heap
from toolexec.bench.report import percentile
from toolexec.logs import configure_logging
from toolexec.publishing import publish_event
from toolexec.read_models import ReadModels, start_read_models
from toolexec.settings import Settings
from toolexec.sources import load_builtin_sources, load_source
from toolexec.stack import Stack

REGISTRY_WAIT_SECONDS = 20.0


def bench_settings(state_dir: Path) -> Settings:
    """Embedded profile whatever the environment says: own broker, no auth, no tool dirs."""
    return Settings(kafka_bootstrap=None, state_dir=state_dir, tools_dir=state_dir / "none",
                    user_tools_dir=None, require_auth=False,
                    egress_allowed_networks=["127.0.0.1/32"])  # the bench's own HTTP server


async def run_stack(state_dir: Path, tools_dir: Path, workers: int) -> None:
    """Start, publish, announce, serve until stdin closes, stop."""
    settings = bench_settings(state_dir)
    configure_logging(settings, default_level="WARNING")
    started: list[ReadModels] = []

    async def read_models(settings: Settings, bootstrap: str) -> ReadModels:
        started.append(await start_read_models(settings, bootstrap))
        return started[-1]

    stack = Stack(settings, group_prefix=f"bench{uuid.uuid4().hex[:6]}", execute_workers=workers,
                  read_models_factory=read_models)
    async with stack:
        sources = load_builtin_sources() + [load_source(p) for p in sorted(tools_dir.iterdir())]
        now = datetime.now(UTC)
        events = [publish_event(source, now=now) for source in sources]
        rejected = [e.data for e in events if e.type != "tool.published"]
        if rejected:
            raise SystemExit(f"bench tools rejected: {rejected}")
        await stack.publish_all(events)
        await stack.registry.catch_up(REGISTRY_WAIT_SECONDS)
        heap.settle()  # as `up` does once started
        broker = stack.embedded
        print(json.dumps({"bootstrap": stack.bootstrap, "published": len(events),
                          "broker_supervisor_pid": broker.supervisor_pid if broker else None}),
              flush=True)
        await _answer(started[0])


async def _answer(models: ReadModels) -> None:
    """Answer `lag` lines until stdin closes."""
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        if line.strip() == "lag":
            print(json.dumps({"lag": lag_report(models)}), flush=True)


def lag_report(models: ReadModels) -> dict[str, dict[str, float]]:
    """Per runner (one feeds every read model): p50, p99 and max lag (ms) and the
    records since the last report."""
    report = {}
    for runner in {id(r): r for r in models.runners.values()}.values():
        lags = list(runner.stats.lags)
        runner.stats.lags.clear()
        report[runner.name] = {"records": len(lags),
                        **{f"p{q}": round(percentile(lags, q) * 1000, 1) if lags else 0.0
                           for q in (50, 99)},
                        "max": round(max(lags, default=0.0) * 1000, 1)}
    return report


if __name__ == "__main__":
    asyncio.run(run_stack(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])))
