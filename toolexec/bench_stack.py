"""The system under test of `toolexec bench`, run as its own process.

`python -m toolexec.bench_stack STATE_DIR TOOLS_DIR WORKERS` starts an embedded stack
(its own Tansu broker, every pipeline consumer), publishes the built-in tools and the
tools under TOOLS_DIR, waits until its registry view holds them, prints one JSON line
`{"bootstrap": ..., "published": N}` and runs until stdin closes.

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

from toolexec.logs import configure_logging
from toolexec.publishing import publish_event
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
    stack = Stack(settings, group_prefix=f"bench{uuid.uuid4().hex[:6]}", execute_workers=workers)
    async with stack:
        sources = load_builtin_sources() + [load_source(p) for p in sorted(tools_dir.iterdir())]
        now = datetime.now(UTC)
        events = [publish_event(source, now=now) for source in sources]
        rejected = [e.data for e in events if e.type != "tool.published"]
        if rejected:
            raise SystemExit(f"bench tools rejected: {rejected}")
        await stack.publish_all(events)
        await stack.registry.catch_up(REGISTRY_WAIT_SECONDS)
        broker = stack.embedded
        pids = [p for p in ((broker.pid, broker.supervisor_pid) if broker else ()) if p]
        print(json.dumps({"bootstrap": stack.bootstrap, "published": len(events),
                          "broker_pids": pids}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(run_stack(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])))
