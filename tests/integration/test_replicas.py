"""Two consumer replicas in one group share the work and lose nothing."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from consumers.adapters.claim_store import REDIS_PREFIX
from tests.log_reading import terminal_event_ids
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
    # Two replicas as in production: one group, executor claims shared in Redis.
    group = f"replica{uuid.uuid4().hex[:6]}"
    first = Stack(Settings(state_dir=tmp_path / "a", tools_dir=tmp_path / "none",
                           user_tools_dir=None, redis_url=redis_url), group_prefix=group)
    await first.start()
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


async def _claim_owners(redis_url: str, ids: list[str]) -> dict[str, str]:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        values = await client.mget([f"{REDIS_PREFIX}{i}/1" for i in ids])
    finally:
        await client.aclose()
    claims = {i: json.loads(v) for i, v in zip(ids, values, strict=True) if v is not None}
    return {i: c["owner"] for i, c in claims.items() if c["finished"]}
