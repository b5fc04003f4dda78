"""Two consumer replicas in one group share the work and lose nothing, the second
joining through the broker's gate (every embedded incarnation is gated while
compactions are on), also after the broker was restarted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from consumers.adapters.claim_store import REDIS_PREFIX
from tests.log_reading import terminal_event_ids
from tests.waiting import START_WAIT, eventually
from toolexec.broker_control import read_state
from toolexec.client import InvocationClient
from toolexec.publishing import publish_event
from toolexec.settings import Settings
from toolexec.sources import load_builtin_sources, load_source
from toolexec.stack import Stack

pytestmark = pytest.mark.integration

TOOLS = Path(__file__).parent / "tools"
INVOCATIONS = 200


async def test_two_replicas_give_every_invocation_exactly_one_terminal_event(
        tmp_path: Path, redis_url: str) -> None:
    await _two_replicas(tmp_path, redis_url, restart_broker=False)


async def test_a_second_replica_joins_after_the_broker_restarted(
        tmp_path: Path, redis_url: str) -> None:
    """The broker killed and restored under the first replica (a new incarnation
    behind the gate on the same port), then the second one joins its groups."""
    await _two_replicas(tmp_path, redis_url, restart_broker=True)


async def _two_replicas(tmp_path: Path, redis_url: str, *, restart_broker: bool) -> None:
    # Two replicas as in production: one group, executor claims shared in Redis.
    group = f"replica{uuid.uuid4().hex[:6]}"
    first = Stack(Settings(state_dir=tmp_path / "a", tools_dir=tmp_path / "none",
                           user_tools_dir=None, redis_url=redis_url), group_prefix=group)
    await first.start()
    try:
        if restart_broker:
            await _kill_broker_and_wait(tmp_path / "a")
    except BaseException:
        await first.stop()
        raise
    second = Stack(Settings(state_dir=tmp_path / "b", tools_dir=tmp_path / "none",
                            user_tools_dir=None, kafka_bootstrap=first.bootstrap,
                            require_auth=False, sandbox="auto", redis_url=redis_url,
                            # replicas share the key they sign their facts with
                            fact_signing_key=tmp_path / "a" / "keys" / "facts.pem"),
                   group_prefix=group)
    try:
        await second.start()
        now = datetime.now(UTC)
        for source in load_builtin_sources() + [load_source(TOOLS / "py_echo")]:
            await first.publish(publish_event(source, now=now))
        ids = [str(uuid.uuid4()) for _ in range(INVOCATIONS)]
        async with InvocationClient(first.bootstrap, verifier=first.verifier) as client:
            results = await asyncio.gather(*(
                client.invoke("py_echo", {"text": i[:8]}, invocation_id=i, timeout=180)
                for i in ids))
        assert [r.data for r in results if r.type != "tool.invoke.completed"] == []
        terminals = await terminal_event_ids(first.bootstrap, set(ids))
        assert {i: len(terminals.get(i, ())) for i in ids} == {i: 1 for i in ids}
        owners = await _claim_owners(redis_url, ids)
        assert set(owners) == set(ids)  # one finished claim per invocation, in Redis
        assert len(set(owners.values())) == 2  # and both replicas executed some
    finally:
        await second.stop()
        await first.stop()


async def _kill_broker_and_wait(state_dir: Path) -> None:
    before = read_state(state_dir)
    assert before is not None and before.data.get("gate_pid")  # gated from the cold start
    os.kill(before.data["broker_pid"], signal.SIGKILL)

    def restored() -> bool:
        state = read_state(state_dir)
        return (state is not None and state.status == "ready"
                and state.data.get("incarnation", 0) > before.data["incarnation"])

    await eventually(restored, "the broker restored behind its gate", timeout=START_WAIT,
                     interval=0.1)


async def _claim_owners(redis_url: str, ids: list[str]) -> dict[str, str]:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        values = await client.mget([f"{REDIS_PREFIX}{i}/1" for i in ids])
    finally:
        await client.aclose()
    claims = {i: json.loads(v) for i, v in zip(ids, values, strict=True) if v is not None}
    return {i: c["owner"] for i, c in claims.items() if c["finished"]}
