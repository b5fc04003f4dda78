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
from typing import Any, Protocol, TypeVar

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from faststream import AckPolicy
from faststream.kafka import KafkaBroker

from consumers.adapters.abac_client import HttpAbac
from consumers.adapters.canaries import CanarySlots, LocalCanaries, RedisCanaries
from consumers.adapters.checkpoint_store import FileCheckpointStore
from consumers.adapters.claim_store import RedisClaims, SqliteClaims
from consumers.adapters.decision_cache import DecisionStore, MemoryDecisions, RedisDecisions
from consumers.adapters.policy_engine import CedarEvaluator, cedar_text_from_json, compile_policies
from consumers.ports import PrimitiveRunner
from consumers.primitives.file_store import ContentStore
from consumers.primitives.runner import Primitives
from consumers.primitives.sandbox_launch import warn_about_isolation
from consumers.primitives.subprocess_primitive import NO_SANDBOX, resolve_sandbox
from consumers.runtime.deadletter import DeadLetters
from consumers.runtime.delivery import DeliveringPublisher
from consumers.runtime.fetch_pacing import FetchPacer
from consumers.runtime.invocation import invocation_deps
from consumers.runtime.pipeline import Pipeline
from consumers.steps import authorize, circuit_transitions
from consumers.steps.admission import AttemptGate
from consumers.steps.definitions import DefinitionDeps
from contracts import topics
from contracts.envelope import Envelope
from contracts.events import EVENT_MODELS
from contracts.fact_signature import FactSigner, FactVerifier, Verdict
from contracts.kafka_binding import UndecodableRecord, decode, encode, header_type, send_event
from contracts.kafka_clients import close_quietly
from domain.capability import VerifiedTokens
from domain.policy import DecisionCache
from projections.circuit_view import CircuitView
from projections.definitions import DefinitionLogView
from projections.policy_view import PolicyView
from projections.registry_view import RegistryLogView
from toolexec import keys
from toolexec.broker_control import (
    STATE_GONE,
    BrokerWatch,
    SupervisedBroker,
    ensure_broker,
    state_gone_error,
)
from toolexec.broker_yield import BrokerYield, YieldingRunner, next_loop_turn
from toolexec.deferred_commits import DeferredCommits
from toolexec.embedded_broker import ensure_topics
from toolexec.logs import reset_repeated_errors
from toolexec.runtime_file import up_running
from toolexec.settings import (
    Settings,
    consumer_kwargs,
    faststream_security,
    fetch_waits,
    kafka_client_options,
)
from toolexec.state_files import DirectoryIdentity, ensure_state_dir

log = structlog.get_logger(__name__)

START_TIMEOUT_SECONDS = 60.0
PACING_SECONDS = 0.5
VIEWS_IDLE_WAIT_MS = 200
"""The views (registry, circuits, policies) answer read-your-writes waits: a resolver's
catch-up for a new tool may wait up to half their idle fetch wait (Tansu answers a
waiting fetch at half its wait once records are there), so keep it short."""
CIRCUITS_WAIT_MS = 100
"""The circuits step is off the invocation's path: a moderate fetch wait while busy
(a breaker opens at most this much later)."""
CIRCUITS_COMMIT_SECONDS = 1.0
"""The circuits step commits a batch that changed nothing (no outcome counted, nothing
published or dead-lettered) at most this much later: at once per batch had been a
broker request per sequential invocation."""
CIRCUITS_IDLE_WAIT_MS = 2000
"""Its fetch wait when idle: the first outcome after a quiet spell is counted up to
about half of it later (Tansu answers a waiting fetch at half its wait once records
are there), and an idle `up` does not poll for it more than once a second."""
FACT_TYPES = frozenset(t for t in EVENT_MODELS if topics.TOPIC_OF_TYPE[t] == topics.INVOCATIONS)
DECISION_REDIS_TIMEOUT_SECONDS = 0.5
INVOCATION_PARTITIONS = 4
TOPIC_PARTITIONS = {
    topics.REGISTRY: 1,
    topics.REQUESTS: INVOCATION_PARTITIONS,
    topics.INVOCATIONS: INVOCATION_PARTITIONS,
    topics.CIRCUITS: 1,
    topics.POLICIES: 1,
    topics.DEADLETTER: 1,
    topics.CALLBACKS: 1,
}


async def start_concurrently(broker: KafkaBroker) -> None:
    """Start every subscriber at once: each consumer group join costs about a second
    on Tansu, and FastStream's own start() joins them one after another."""
    await broker.connect()
    await asyncio.gather(*(subscriber.start() for subscriber in broker.subscribers))
    for publisher in broker.publishers:
        await publisher.start()
    broker.running = True


async def passthrough_decoder(message: Any) -> Any:
    """FastStream decoder that hands the handler the raw StreamMessage."""
    return message


class Stoppable(Protocol):
    async def stop(self) -> None: ...


ReadModelsFactory = Callable[[Settings, str], Awaitable[Stoppable]]
T = TypeVar("T")


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Stack:
    """A running toolexec: broker connection, views and (optionally) the pipeline."""

    settings: Settings
    run_consumers: bool = True
    group_prefix: str = "toolexec"
    execute_workers: int = 32
    registry: RegistryLogView = field(init=False)
    definitions: DefinitionLogView = field(init=False)
    circuits: CircuitView = field(init=False)
    policies: PolicyView = field(init=False)
    decisions: DecisionStore = field(init=False)
    keep_broker: bool = False
    """Leave the embedded broker running at stop even when this stack started it
    (`toolexec up`); otherwise a broker started for this stack alone is stopped."""
    embedded: SupervisedBroker | None = field(default=None, init=False)
    _broker_watch: BrokerWatch | None = field(default=None, init=False)
    state_gone: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    """Set once the state directory of an embedded broker's stack was deleted or
    replaced while it ran (its broker is then not restarted: `BrokerWatch`)."""
    broker: KafkaBroker | None = field(default=None, init=False)
    pipeline: Pipeline | None = field(default=None, init=False)
    verifier: FactVerifier = field(init=False)
    """Checks facts against the trusted pipeline keys (for clients of this stack)."""
    _signer: FactSigner | None = field(default=None, init=False)
    """The consumer group running invocations (None without consumers)."""
    observers: list[Callable[[Envelope], None]] = field(default_factory=list, init=False)
    """Called with every request the pipeline starts and every fact it appends."""
    _producer: AIOKafkaProducer | None = field(default=None, init=False)
    _offsets: AIOKafkaConsumer | None = field(default=None, init=False)
    _primitives: Primitives | None = field(default=None, init=False)
    _claims: SqliteClaims | RedisClaims | None = field(default=None, init=False)
    _redis: Any = field(default=None, init=False)
    _decisions_redis: Any = field(default=None, init=False)
    _abac: HttpAbac | None = field(default=None, init=False)
    _pacers: list[FetchPacer] = field(default_factory=list, init=False)
    _paced: list[tuple[Any, FetchPacer]] = field(default_factory=list, init=False)
    """FastStream subscribers and their pacers (attached once their consumers exist)."""
    _pacing: asyncio.Task[None] | None = field(default=None, init=False)
    read_models_factory: ReadModelsFactory | None = None
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
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        state = Path(self.settings.state_dir).resolve()  # bwrap binds absolute paths
        ensure_state_dir(state)
        if not self.settings.kafka_bootstrap:
            identity = DirectoryIdentity(state)  # the directory the broker starts in
            try:
                self.embedded = await ensure_broker(self.settings)
            except BaseException:
                identity.close()
                raise
            self._broker_watch = BrokerWatch(self.settings, self.embedded,
                                             on_change=self._broker_changed, state=identity)
            self._broker_watch.start()
        client_options = kafka_client_options(self.settings)
        await ensure_topics(self.bootstrap, TOPIC_PARTITIONS, client_options=client_options)
        self._producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=0,
                                          max_request_size=self.settings.max_message_bytes,
                                          **client_options)
        await self._producer.start()
        self._offsets = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                         **client_options)
        await self._offsets.start()
        self.registry = RegistryLogView(end_offsets=self._registry_end_offsets,
                                     limits=self.settings.publication_limits)
        self.definitions = DefinitionLogView(end_offsets=self._registry_end_offsets)
        self.circuits = CircuitView(end_offsets=self._circuits_end_offsets)
        self.decisions = self._decision_store()
        self.policies = PolicyView(validate=compile_policies, to_text=cedar_text_from_json,
                                   end_offsets=self._policies_end_offsets)
        self.policies.on_change(self.decisions.invalidate)
        if self.settings.embedded:
            keys.ensure_dev_keys(state)
        if self.run_consumers:
            self._signer = FactSigner(keys.fact_signing_key(self.settings))
        self.verifier = FactVerifier(keys.fact_verify_keys(self.settings))
        self.broker = KafkaBroker(self.bootstrap, apply_types=False, decoder=passthrough_decoder,
                                  linger_ms=0, logger=None, graceful_timeout=10,
                                  security=faststream_security(client_options))
        self._attach_views(self.broker)
        if self.run_consumers:
            self._attach_circuits(self.broker)
            self.pipeline = self._pipeline(state)
        await start_concurrently(self.broker)
        for subscriber, pacer in self._paced:
            pacer.attach(subscriber.consumer)
        if self.pipeline is not None:
            await self.pipeline.start()
            async with asyncio.timeout(START_TIMEOUT_SECONDS):
                await self.pipeline.ready.wait()
        self._pacing = asyncio.create_task(self._pace(), name="fetch-pacing")
        if self.run_consumers and self.read_models_factory is not None:
            self._read_models = await self.read_models_factory(self.settings, self.bootstrap)
        log.info("stack.started", bootstrap=self.bootstrap, consumers=self.run_consumers)

    async def stop(self) -> None:
        if self._read_models is not None:
            await self._read_models.stop()
            self._read_models = None
        if self._pacing is not None:
            self._pacing.cancel()
            await asyncio.gather(self._pacing, return_exceptions=True)
            self._pacing = None
        if self.pipeline is not None:
            await self.pipeline.stop()
            self.pipeline = None
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
        if self._offsets is not None:
            await close_quietly(self._offsets.stop())
            self._offsets = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        if self._broker_watch is not None:
            await self._broker_watch.stop()
            self.embedded = self._broker_watch.broker  # the one watched last
            self._broker_watch = None
        if self.embedded is not None:
            if self.embedded.started_here and not self.keep_broker \
                    and not up_running(self.settings):
                await self.embedded.stop()  # archives what is left first
            self.embedded = None

    async def unless_state_gone(self, work: Awaitable[T]) -> T:
        """`work`'s result; E3801 (`state_gone_error`), `work` cancelled, once the
        state directory is gone while it runs."""
        task = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(self.state_gone.wait())
        try:
            done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task not in done:
            raise state_gone_error(self.settings.state_dir)
        return task.result()

    def _broker_changed(self, status: str) -> None:
        """The embedded broker changed state (logged once by the watch): after it is
        back, aiokafka's repeated errors of the outage may be reported again."""
        if status == "ready":
            reset_repeated_errors()
        elif status == STATE_GONE:
            self.state_gone.set()

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
        assert self._producer is not None, "stack not started"
        await send_event(self._producer, envelope)

    async def _publish_signed(self, envelope: Envelope) -> None:
        """Publish a fact of the pipeline's side steps (circuit transitions), signed."""
        assert self._producer is not None and self._signer is not None
        await send_event(self._producer, envelope,
                         record=self._signer.sign([encode(envelope)])[0])

    async def publish_all(self, envelopes: Iterable[Envelope]) -> None:
        for envelope in envelopes:
            await self.publish(envelope)

    def _observe(self, event: Envelope) -> None:
        for observer in self.observers:
            observer(event)

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

    def _new_pacer(self, *, busy_ms: int | None = None, idle_ms: int | None = None,
                   idle_floor_ms: int = 0) -> FetchPacer:
        """A pacer on the profile's waits: at least `busy_ms` while busy; while idle at
        most `idle_ms` and at least `idle_floor_ms`."""
        short, long = fetch_waits(self.settings)
        pacer = FetchPacer(short if busy_ms is None else max(short, busy_ms),
                           max(long if idle_ms is None else min(long, idle_ms), idle_floor_ms))
        self._pacers.append(pacer)
        return pacer

    async def _pace(self) -> None:
        """Move idle consumers to their long fetch wait."""
        while True:
            await asyncio.sleep(PACING_SECONDS)
            for pacer in self._pacers:
                pacer.update()

    def _attach_views(self, broker: KafkaBroker) -> None:
        """Every process folds the registry (tools and MCP tool definitions), circuits
        and policies topics into its views, outside any consumer group, through one
        consumer: each consumer polls
        the broker even when idle, so one instead of three. Records of other types
        only advance a view's position."""
        views: dict[str, tuple[tuple[Any, tuple[str, ...]], ...]] = {
            topics.REGISTRY: ((self.registry, ("tool.published", "tool.lifecycle.changed")),
                              (self.definitions, DefinitionLogView.TYPES)),
            topics.CIRCUITS: ((self.circuits, ("circuit.state.changed",)),),
            topics.POLICIES: ((self.policies, ("policy.updated",)),),
        }
        pacer = self._new_pacer(idle_ms=VIEWS_IDLE_WAIT_MS)

        subscriber = broker.subscriber(*views, group_id=None, auto_offset_reset="earliest",
                                       ack_policy=AckPolicy.MANUAL,
                                       fetch_max_wait_ms=pacer.long_ms)
        self._paced.append((subscriber, pacer))

        @subscriber
        async def fold(message: Any) -> None:
            pacer.busy()
            record = message.raw_message
            kind = header_type(record.headers)
            for view, types in views[record.topic]:
                if kind in types:
                    try:
                        view.apply(decode(record.key, record.value, record.headers))
                    except UndecodableRecord as bad:
                        log.warning("view.undecodable", topic=record.topic,
                                    offset=record.offset, error=bad.error.code)
                view.advance(record.partition, record.offset)

    def _attach_circuits(self, broker: KafkaBroker) -> None:
        """The circuits step, a side step of its own consumer group on the facts: it
        must see every outcome of a service, so one member of the group counts them.
        It reads every fact, so it also stands guard: a record on the facts topic that
        is no fact, or a fact the pipeline did not sign, is dead-lettered (E3004,
        E3804) and counted by no one."""
        assert self._producer is not None
        published: list[Envelope] = []  # what this batch dead-lettered or published

        async def publish_noted(envelope: Envelope) -> None:
            await self.publish(envelope)
            published.append(envelope)

        async def publish_signed_noted(envelope: Envelope) -> None:
            await self._publish_signed(envelope)
            published.append(envelope)

        deps = circuit_transitions.CircuitDeps(publish=DeliveringPublisher(publish_signed_noted),
                                    registry=self.registry,
                                    book=circuit_transitions.CircuitBook(self.circuits), clock=utc_now)
        dead_letters = DeadLetters(DeliveringPublisher(publish_noted), utc_now)
        commits = DeferredCommits(CIRCUITS_COMMIT_SECONDS, name="circuits")
        verifier = self.verifier
        pacer = self._new_pacer(busy_ms=CIRCUITS_WAIT_MS, idle_floor_ms=CIRCUITS_IDLE_WAIT_MS)
        group = f"{self.group_prefix}.circuits"
        options = {k: v for k, v in consumer_kwargs(self.settings).items()
                   if k != "fetch_max_wait_ms"}

        subscriber = broker.subscriber(
            topics.INVOCATIONS, group_id=group, batch=True, batch_timeout_ms=CIRCUITS_WAIT_MS,
            max_records=500, auto_offset_reset="earliest", ack_policy=AckPolicy.MANUAL,
            fetch_max_wait_ms=pacer.long_ms, **options)
        self._paced.append((subscriber, pacer))

        @subscriber
        async def count_outcomes(message: Any) -> None:
            pacer.busy()
            records = message.raw_message
            published.clear()
            last_counted = next(reversed(deps.book.counted), None)
            for record in records:
                kind = header_type(record.headers)
                if kind not in FACT_TYPES:
                    await circuit_transitions.misplaced_record(record, dead_letters, consumer=group)
                elif (verdict := verifier.verify(record.headers, record.value)) \
                        is not Verdict.VALID:
                    await circuit_transitions.untrusted_record(record, verdict.value, dead_letters,
                                                    consumer=group)
                elif kind == "tool.execution.finished":
                    await circuit_transitions.count_record(record, deps, dead_letters, consumer=group)
            positions: dict[TopicPartition, int] = {}
            for record in records:
                tp = TopicPartition(record.topic, record.partition)
                positions[tp] = max(positions.get(tp, 0), record.offset + 1)
            # Read again after a rebalance, a batch that changed nothing changes nothing.
            changed = bool(published) or next(reversed(deps.book.counted), None) != last_counted
            await commits.commit(message.consumer, positions, now=changed)

    def _runner(self) -> PrimitiveRunner:
        """The primitives; with the embedded broker on this host, subprocess tools run
        with the broker yielding the cores to them (toolexec.broker_yield)."""
        assert self._primitives is not None
        if self.embedded is None:
            return self._primitives
        return YieldingRunner(self._primitives,
                              BrokerYield(self._broker_processes, defer=next_loop_turn))

    def _broker_processes(self) -> list[int]:
        return self.embedded.processes() if self.embedded is not None else []

    def _pipeline(self, state: Path) -> Pipeline:
        assert self._producer is not None
        sandbox = resolve_sandbox(self.settings.effective_sandbox,
                                  strict=self.settings.sandbox_strict)
        if sandbox in ("rlimits", NO_SANDBOX) and self.settings.effective_sandbox == "auto":
            log.warning("sandbox.unavailable", sandbox=sandbox,
                        reason="neither bubblewrap nor Landlock is available")
        self._primitives = Primitives(ContentStore(state / "cas"), state / "work",
                                      sandbox=sandbox, policy=self.settings.sandbox_policy())
        warn_about_isolation(sandbox)
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
        env_snapshot = dict(os.environ)
        deps = invocation_deps(
            registry=self.registry, clock=utc_now,
            resolve={"strict_chain": self.settings.strict_chain,
                     "registry_wait_seconds": self.settings.registry_wait_seconds,
                     "max_parameter_bytes": self.settings.max_parameter_bytes,
                     "trust": keys.trust_store(self.settings)},
            authorize=authorize.AuthorizeDeps(
                clock=utc_now, require_auth=self.settings.auth_required,
                public_keys=lambda: keys.verification_keys(self.settings),
                policies=self.policies, evaluator=CedarEvaluator(), cache=self.decisions,
                default_decision=self.settings.policy_default, external=self._abac,
                verified=VerifiedTokens(lifetime=keys.token_lifetime(self.settings)),
                approval_ttl_seconds=self.settings.approval_ttl_seconds,
                opener=keys.token_opener(self.settings)),
            runner=self._runner(), claims=self._claims, secrets=env_snapshot.get,
            random=random.random, gate=AttemptGate(circuits=self.circuits, canaries=canaries),
            credential_grants=self.settings.credential_grants_policy(),
            checkpoints=FileCheckpointStore(state / "checkpoints"),
            definitions=DefinitionDeps(pins=self.definitions, announced=self._primitives,
                                       publish=DeliveringPublisher(self.publish),
                                       clock=utc_now))
        options = consumer_kwargs(self.settings)  # its wait: the recovery reader's
        assert self._signer is not None
        return Pipeline(self.bootstrap, self._producer, deps,
                        DeadLetters(DeliveringPublisher(self.publish), utc_now),
                        signer=self._signer, verifier=self.verifier,
                        group=f"{self.group_prefix}.pipeline", consumer_options=options,
                        client_options=kafka_client_options(self.settings),
                        pacer=self._new_pacer(), max_in_flight=self.execute_workers,
                        observe=self._observe)
