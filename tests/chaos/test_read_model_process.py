"""The read models' process of `toolexec up` (toolexec.read_model_child) under kill -9:
of `up` itself (the process goes with it), and of the read models' process (restarted,
its state in /health meanwhile, no row lost or applied twice, read-your-writes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from projections.catalog import read_models
from projections.database import make_engine, migrate
from projections.runner import ProjectionRunner
from tests.chaos.up_process import start_up, verifier_for, wait_until_up
from tests.projection_db import run_to_end, snapshot
from tests.waiting import process_gone, until
from toolexec.bench.env import with_read_models
from toolexec.client import InvocationClient
from toolexec.embedded_broker import EmbeddedBroker
from toolexec.read_models import SIGNED_TOPICS
from toolexec.stack import TOPIC_PARTITIONS

pytestmark = pytest.mark.chaos

BURST = 60
TOOL = "append_id"


def read_model_pid(up_pid: int) -> int:
    """The pid of `up`'s read models' process, once there is one."""
    pids = until(lambda: with_read_models(up_pid)[1:], "up runs its read models' process")
    assert len(pids) == 1, pids
    return int(pids[0])


def projection_states(gateway: str) -> dict[str, str]:
    """The read models' states as /health reports them."""
    body = httpx.get(f"{gateway}/health", timeout=30).json()
    consumers: dict[str, Any] = body["checks"]["consumers"]
    return {name: str(state) for name, state in consumers["consumers"].items()
            if name.startswith("projection.")}


@contextlib.asynccontextmanager
async def running_up(tmp_path: Path) -> AsyncIterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """`toolexec up` on a broker of its own: (bootstrap, process, state dir)."""
    state = tmp_path / "state"
    state.mkdir()
    async with EmbeddedBroker(TOPIC_PARTITIONS, log_dir=tmp_path) as broker:
        process = start_up(broker.bootstrap, state)
        try:
            await wait_until_up(process, state)
            yield broker.bootstrap, process, state
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)


async def test_the_read_models_process_dies_with_up(tmp_path: Path) -> None:
    async with running_up(tmp_path) as (_, process, _):
        child = read_model_pid(process.pid)
        process.send_signal(signal.SIGKILL)
        process.wait()
        until(lambda: process_gone(child), "the read models' process exits with up")


async def test_a_killed_read_models_process_is_restarted_and_catches_up_exactly(
        tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    async with running_up(tmp_path) as (bootstrap, process, state):
        gateway = json.loads((state / "runtime.json").read_text())["gateway_url"]
        child = read_model_pid(process.pid)
        async with InvocationClient(bootstrap, verifier=verifier_for(state)) as client:
            ids = [str(uuid.uuid4()) for _ in range(BURST)]
            tasks = [asyncio.create_task(client.invoke(
                TOOL, {"id": i, "ledger": str(ledger)}, invocation_id=i, timeout=240))
                for i in ids]
            async with asyncio.timeout(120):
                while sum(t.done() for t in tasks) < BURST // 3:
                    await asyncio.sleep(0.05)
            os.kill(child, signal.SIGKILL)  # mid-burst
            seen = await asyncio.to_thread(until, lambda: _down_state(gateway),
                                           "/health shows the read models down", 60.0, 0.02)
            results = await asyncio.gather(*tasks)
        assert all("read-model process exited" in s for s in seen.values()), seen
        await asyncio.to_thread(until, lambda: set(projection_states(gateway).values())
                                == {"running"}, "the read models run again")
        assert read_model_pid(process.pid) != child
        for result in results:  # read-your-writes: each answer's terminal is in the view
            view = await asyncio.to_thread(
                httpx.get, f"{gateway}/v1/invocations/{result.data.invocation_id}", timeout=60)
            assert view.status_code == 200, view.text
            assert view.json()["status"] in ("completed", "failed")
        rebuilt = await _rows_folded_from_scratch(tmp_path, bootstrap, state)
        async with asyncio.timeout(120):  # the same rows once up has applied them all
            while (incremental := await _rows(state)) != rebuilt:
                await asyncio.sleep(0.2)
        assert incremental == rebuilt


def _down_state(gateway: str) -> dict[str, str] | None:
    states = projection_states(gateway)
    down = {name: s for name, s in states.items() if s != "running"}
    return down or None


async def _rows(state: Path) -> dict[str, Any]:
    engine = make_engine(f"sqlite+aiosqlite:///{state / 'toolexec.db'}")
    try:
        return {name: await snapshot(engine, model) for name, model in read_models().items()}
    finally:
        await engine.dispose()


async def _rows_folded_from_scratch(tmp_path: Path, bootstrap: str, state: Path) -> dict[str, Any]:
    """Every read model folded from the start of the log into a fresh database."""
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}")
    try:
        await migrate(engine)
        await run_to_end(ProjectionRunner(engine, list(read_models().values()), bootstrap,
                                          verifier=verifier_for(state),
                                          signed_topics=SIGNED_TOPICS))
        return {name: await snapshot(engine, model) for name, model in read_models().items()}
    finally:
        await engine.dispose()
