"""Half-open canaries are capped across executor replicas by a shared Redis counter."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio

from consumers.adapters.canaries import LocalCanaries, RedisCanaries
from consumers.steps.admission import AttemptGate, enter_attempt, leave_attempt
from domain.errors import CircuitOpen
from projections.circuit_view import CircuitView
from tests.unit.test_deadline import API, Clock, later, opened


async def _enter(gate: AttemptGate):
    clock = Clock()
    return await enter_attempt(gate, API, None, 30, clock=clock, sleep=clock.sleep)


async def test_two_replicas_share_one_canary_slot(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    slots = RedisCanaries(client, prefix=f"test:{uuid.uuid4().hex}:")
    try:
        first = AttemptGate(circuits=opened(CircuitView(), later(-10)), canaries=slots)
        second = AttemptGate(circuits=opened(CircuitView(), later(-10)), canaries=slots)
        passed = await _enter(first)
        assert passed.canary_service == "mail"
        with pytest.raises(Exception) as refused:
            await _enter(second)
        assert refused.value.code == "E3501"  # type: ignore[attr-defined]
        assert "across executors" in str(refused.value)
        await leave_attempt(first, passed)
        assert (await _enter(second)).canary_service == "mail"
    finally:
        await client.aclose()


async def test_without_redis_each_process_counts_its_own() -> None:
    gate = AttemptGate(circuits=opened(CircuitView(), later(-10)), canaries=LocalCanaries())
    passed = await _enter(gate)
    with pytest.raises(CircuitOpen):
        await _enter(gate)
    await leave_attempt(gate, passed)
    assert (await _enter(gate)).canary_service == "mail"
