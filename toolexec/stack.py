"""Composition root of a running system: broker, registry view, pipeline consumers.

`Stack` wires adapters into the consumers' ports. With `TOOLEXEC_KAFKA_BOOTSTRAP`
set it joins that broker; otherwise it uses the state directory's embedded broker
(a supervised Tansu whose log is archived on disk), starting it when none runs.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from faststream import AckPolicy
from faststream.kafka import KafkaBroker

from consumers import authorize, circuits, execute, finalize, resolve
from consumers.abac_client import HttpAbac
from consumers.admission import AttemptGate
from consumers.canaries import CanarySlots, LocalCanaries, RedisCanaries
from consumers.claim_store import RedisClaims, SqliteClaims
from consumers.deadletter import DeadLetters
from consumers.decision_cache import DecisionStore, MemoryDecisions, RedisDecisions
from consumers.delivery import DeliveringPublisher
from consumers.pipeline import (
    Attached,
    PipelineDeps,
    attach_group,
    passthrough_decoder,
    pipeline_groups,
)
from consumers.policy_engine import CedarEvaluator, cedar_text_from_json, compile_policies
from consumers.primitives.file_store import ContentStore
from consumers.primitives.runner import Primitives
from consumers.primitives.subprocess_primitive import NO_SANDBOX, resolve_sandbox
from consumers.request_log import KafkaRequestLog
from contracts import topics
from contracts.envelope import Envelope
from contracts.kafka_binding import UndecodableRecord, decode, encode, header_type
from domain.capability import VerifiedTokens
from domain.policy import DecisionCache
from projections.circuit_view import CircuitView
from projections.policy_view import PolicyView
from projections.registry_view import RegistryView
from toolexec import keys
from toolexec.broker_control import BrokerWatch, SupervisedBroker, ensure_broker
from toolexec.embedded_broker import ensure_topics
from toolexec.logs import reset_repeated_errors
from toolexec.runtime_file import up_running
from toolexec.settings import Settings, consumer_kwargs

log = structlog.get_logger(__name__)

STOP_GRACE_SECONDS = 10.0
DECISION_REDIS_TIMEOUT_SECONDS = 0.5
TOPIC_PARTITIONS = {
    topics.REGISTRY: 1,
    topics.INVOCATIONS: 4,
    topics.CIRCUITS: 1,
    topics.POLICIES: 1,
    topics.DEADLETTER: 1,
}


async def start_concurrently(broker: KafkaBroker) -> None:
    """Start every subscriber at once: each consumer group join costs about a second
    on Tansu, and FastStream's own start() joins them one after another."""
    await broker.connect()
    await asyncio.gather(*(subscriber.start() for subscriber in broker.subscribers))
    for publisher in broker.publishers:
        await publisher.start()
    broker.running = True


class Stoppable(Protocol):
    async def stop(self) -> None: ...


ReadModelsFactory = Callable[[Settings, str], Awaitable[Stoppable]]


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Stack:
    """A running toolexec: broker connection, registry view and (optionally) consumers."""

    settings: Settings
    run_consumers: bool = True
    group_prefix: str = "toolexec"
    execute_workers: int = 32
    registry: RegistryView = field(init=False)
    circuits: CircuitView = field(init=False)
    policies: PolicyView = field(init=False)
    decisions: DecisionStore = field(init=False)
    keep_broker: bool = False
    """Leave the embedded broker running at stop even when this stack started it
    (`toolexec up`); otherwise a broker started for this stack alone is stopped."""
    embedded: SupervisedBroker | None = field(default=None, init=False)
    _broker_watch: BrokerWatch | None = field(default=None, init=False)
    broker: KafkaBroker | None = field(default=None, init=False)
    _offsets: AIOKafkaConsumer | None = field(default=None, init=False)
    _primitives: Primitives | None = field(default=None, init=False)
    _claims: SqliteClaims | RedisClaims | None = field(default=None, init=False)
    _redis: Any = field(default=None, init=False)
    _decisions_redis: Any = field(default=None, init=False)
    _abac: HttpAbac | None = field(default=None, init=False)
    _requests: KafkaRequestLog | None = field(default=None, init=False)
    read_models_factory: ReadModelsFactory | None = None
    _attached: list[Attached] = field(default_factory=list, init=False)
    _read_models: Stoppable | None = field(default=None, init=False)

    @property
    def bootstrap(self) -> str:
        if self.settings.kafka_bootstrap:
            return self.settings.kafka_bootstrap
        assert self.embedded is not None, "stack not started"
        return self.embedded.bootstrap

    async def __aenter__(self) -> Stack:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        state = Path(self.settings.state_dir).resolve()  # bwrap binds absolute paths
        state.mkdir(parents=True, exist_ok=True)
        if not self.settings.kafka_bootstrap:
            self.embedded = await ensure_broker(self.settings)
            self._broker_watch = BrokerWatch(self.settings, self.embedded,
                                             on_change=self._broker_changed)
            self._broker_watch.start()
        await ensure_topics(self.bootstrap, TOPIC_PARTITIONS)
        self._offsets = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None)
        await self._offsets.start()
        self.registry = RegistryView(end_offsets=self._registry_end_offsets)
        self.circuits = CircuitView(end_offsets=self._circuits_end_offsets)
        self.decisions = self._decision_store()
        self.policies = PolicyView(validate=compile_policies, to_text=cedar_text_from_json,
                                   end_offsets=self._policies_end_offsets)
        self.policies.on_change(self.decisions.invalidate)
        if self.settings.embedded:
            keys.ensure_dev_keys(state)
        self.broker = KafkaBroker(self.bootstrap, apply_types=False, decoder=passthrough_decoder,
                                  linger_ms=0, logger=None, graceful_timeout=10)
        self._attach_views(self.broker)
        if self.run_consumers:
            self._attach_pipeline(self.broker, state)
        await start_concurrently(self.broker)
        if self.run_consumers and self.read_models_factory is not None:
            self._read_models = await self.read_models_factory(self.settings, self.bootstrap)
        log.info("stack.started", bootstrap=self.bootstrap, consumers=self.run_consumers)

    async def stop(self) -> None:
        if self._read_models is not None:
            await self._read_models.stop()
            self._read_models = None
        for attached in self._attached:
            try:
                async with asyncio.timeout(STOP_GRACE_SECONDS):
                    await attached.drain()
            except TimeoutError:
                log.warning("stack.stop_with_work_in_flight")
        if self.broker is not None:
            await self.broker.stop()
            self.broker = None
        if self._primitives is not None:
            await self._primitives.aclose()
        if isinstance(self._claims, SqliteClaims):
            self._claims.close()
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None
        if self._decisions_redis is not None:
            if isinstance(self.decisions, RedisDecisions):
                await self.decisions.settled()
            await self._decisions_redis.aclose()
            self._decisions_redis = None
        if self._abac is not None:
            await self._abac.aclose()
            self._abac = None
        if self._requests is not None:
            await self._requests.aclose()
            self._requests = None
        if self._offsets is not None:
            await self._offsets.stop()
            self._offsets = None
        if self._broker_watch is not None:
            await self._broker_watch.stop()
            self.embedded = self._broker_watch.broker  # the one watched last
            self._broker_watch = None
        if self.embedded is not None:
            if self.embedded.started_here and not self.keep_broker \
                    and not up_running(self.settings):
                await self.embedded.stop()  # archives what is left first
            self.embedded = None

    def _broker_changed(self, status: str) -> None:
        """The embedded broker changed state (logged once by the watch): after it is
        back, aiokafka's repeated errors of the outage may be reported again."""
        if status == "ready":
            reset_repeated_errors()

    def _decision_store(self) -> DecisionStore:
        """Decisions shared by every replica through Redis when it is configured,
        else kept in this process."""
        ttl = self.settings.decision_cache_ttl_seconds
        if not self.settings.redis_url:
            return MemoryDecisions(DecisionCache(ttl_seconds=ttl))
        import redis.asyncio

        # Short timeouts: a slow Redis must not hold decisions back (they are then
        # evaluated without the cache).
        self._decisions_redis = redis.asyncio.Redis.from_url(
            self.settings.redis_url, socket_timeout=DECISION_REDIS_TIMEOUT_SECONDS,
            socket_connect_timeout=DECISION_REDIS_TIMEOUT_SECONDS)
        return RedisDecisions(self._decisions_redis, ttl_seconds=ttl,
                              operation_timeout=DECISION_REDIS_TIMEOUT_SECONDS)

    async def publish(self, envelope: Envelope) -> None:
        """Publish one event to its topic (CloudEvents binary mode, key = partitionkey)."""
        assert self.broker is not None, "stack not started"
        record = encode(envelope)
        await self.broker.publish(
            record.value, topics.TOPIC_OF_TYPE[envelope.type], key=record.key,
            headers={name: value.decode("utf-8") for name, value in record.headers},
        )

    async def publish_all(self, envelopes: Iterable[Envelope]) -> None:
        for envelope in envelopes:
            await self.publish(envelope)

    async def _registry_end_offsets(self) -> dict[int, int]:
        return await self._end_offsets(topics.REGISTRY)

    async def _circuits_end_offsets(self) -> dict[int, int]:
        return await self._end_offsets(topics.CIRCUITS)

    async def _policies_end_offsets(self) -> dict[int, int]:
        return await self._end_offsets(topics.POLICIES)

    async def _end_offsets(self, topic: str) -> dict[int, int]:
        assert self._offsets is not None
        partitions = self._offsets.partitions_for_topic(topic) or {0}
        tps = [TopicPartition(topic, p) for p in partitions]
        ends = await self._offsets.end_offsets(tps)
        return {tp.partition: offset for tp, offset in ends.items()}

    def _attach_views(self, broker: KafkaBroker) -> None:
        """Every process folds the registry, circuits and policies topics into its
        views, outside any consumer group, through one consumer: each consumer polls
        the broker every fetch_max_wait_ms even when idle, so one instead of three.
        Records of other types only advance a view's position."""
        views: dict[str, tuple[Any, tuple[str, ...]]] = {
            topics.REGISTRY: (self.registry, ("tool.published", "tool.lifecycle.changed")),
            topics.CIRCUITS: (self.circuits, ("circuit.state.changed",)),
            topics.POLICIES: (self.policies, ("policy.updated",)),
        }
        fetch_wait = consumer_kwargs(self.settings)["fetch_max_wait_ms"]

        @broker.subscriber(*views, group_id=None, auto_offset_reset="earliest",
                           ack_policy=AckPolicy.MANUAL, fetch_max_wait_ms=fetch_wait)
        async def fold(message: Any) -> None:
            record = message.raw_message
            view, types = views[record.topic]
            if header_type(record.headers) in types:
                try:
                    view.apply(decode(record.key, record.value, record.headers))
                except UndecodableRecord as bad:
                    log.warning("view.undecodable", topic=record.topic, offset=record.offset,
                                error=bad.error.code)
            view.advance(record.partition, record.offset)

    def _attach_pipeline(self, broker: KafkaBroker, state: Path) -> None:
        sandbox = resolve_sandbox(self.settings.effective_sandbox,
                                  strict=self.settings.sandbox_strict)
        if sandbox in ("rlimits", NO_SANDBOX) and self.settings.effective_sandbox == "auto":
            log.warning("sandbox.unavailable", sandbox=sandbox,
                        reason="neither bubblewrap nor Landlock is available")
        self._primitives = Primitives(ContentStore(state / "cas"), state / "work",
                                      sandbox=sandbox)
        if self.settings.abac_url:
            self._abac = HttpAbac(self.settings.abac_url)
        owner = f"executor-{uuid.uuid4()}"
        canaries: CanarySlots = LocalCanaries()
        if self.settings.redis_url:  # shared by every replica
            import redis.asyncio

            self._redis = redis.asyncio.Redis.from_url(self.settings.redis_url)
            self._claims = RedisClaims(self._redis, owner)
            canaries = RedisCanaries(self._redis)
        else:  # durable across restarts of this host's executor
            self._claims = SqliteClaims(state / "claims.sqlite3", owner=owner)
        publish = DeliveringPublisher(self.publish)  # outlasts a broker restart
        options = consumer_kwargs(self.settings)
        if self.settings.auth_required:  # tokens of requests consumed before a restart
            self._requests = KafkaRequestLog(
                self.bootstrap, consumer_options={"fetch_max_wait_ms": options["fetch_max_wait_ms"]})
        env_snapshot = dict(os.environ)
        deps = PipelineDeps(
            resolve=resolve.ResolveDeps(
                registry=self.registry, publish=publish, clock=utc_now,
                strict_chain=self.settings.strict_chain,
                registry_wait_seconds=self.settings.registry_wait_seconds),
            authorize=authorize.AuthorizeDeps(
                publish=publish, clock=utc_now, require_auth=self.settings.auth_required,
                public_keys=lambda: keys.verification_keys(self.settings),
                pending=authorize.PendingTokens(), registry=self.registry,
                policies=self.policies, evaluator=CedarEvaluator(), cache=self.decisions,
                default_decision=self.settings.policy_default, external=self._abac,
                verified=VerifiedTokens(), requests=self._requests),
            execute=execute.ExecuteDeps(
                registry=self.registry, publish=publish, clock=utc_now, runner=self._primitives,
                claims=self._claims, secrets=env_snapshot.get, random=random.random,
                gate=AttemptGate(circuits=self.circuits, canaries=canaries)),
            finalize=finalize.FinalizeDeps(publish=publish, clock=utc_now),
            dead_letters=DeadLetters(publish, utc_now),
            clock=utc_now,
            circuits=circuits.CircuitDeps(
                publish=publish, registry=self.registry,
                book=circuits.CircuitBook(self.circuits), clock=utc_now),
        )
        for group in pipeline_groups(deps, group_prefix=self.group_prefix,
                                     execute_workers=self.execute_workers):
            self._attached.append(attach_group(broker, group, deps, consumer_options=options))
