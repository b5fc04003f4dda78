"""Producer-side client: emit `tool.invoke.requested`, wait for the terminal event.

Used by `toolexec run`, the gateway and the tests. Requests go to the requests topic.
When the pipeline runs in the same process and owns the request's partition, the
acknowledged request is handed to it in memory and the terminal event comes back in
memory; otherwise the client tails the invocations topic from its end (no consumer
group, started on first need) and routes events to waiting callers by correlation
id, so one client serves many concurrent invocations. Only facts signed by a trusted
pipeline key reach a caller (contracts.fact_signature).

Across a broker outage it keeps trying within each invocation's timeout: sends are
retried while the errors are transient, the tail reconnects by itself. An
invocation it cannot see to its end is reported, never left hanging: E3001 when the
request could not be handed to the broker, E3002 when it was but no terminal event
arrived in time (the invocation may still finish; its events stay in the log).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from consumers.runtime.delivery import transient_broker_error
from consumers.runtime.fetch_pacing import FetchPacer
from contracts import topics
from contracts.envelope import Envelope, new_envelope
from contracts.events import TERMINAL_TYPES, InvokeCancelRequested, InvokeRequested
from contracts.fact_signature import FactVerifier, Verdict
from contracts.kafka_binding import UndecodableRecord, decode, header_type, send_event
from contracts.kafka_clients import close_quietly
from contracts.token_seal import TokenSealer, is_sealed
from domain.errors import ToolexecError

if TYPE_CHECKING:
    from consumers.runtime.pipeline import Pipeline

log = structlog.get_logger(__name__)

PROGRESS_TYPES = frozenset({"tool.chain.resolved", "tool.permission.decided",
                            "tool.execution.started", "tool.execution.progressed",
                            "tool.execution.finished"})
SOURCE = "urn:toolexec:client"

Progress = Callable[[Envelope], None]
LOCAL_ID_TRIES = 16
SEND_TIMEOUT_MS = 5000
"""How long the producer holds a record the broker does not take before failing it:
`invoke` then sends it again (same event id) while its own timeout lasts, and
`stop()` never waits longer than this for records a stopped broker cannot take."""
RETRY_FIRST_DELAY = 0.05
RETRY_MAX_DELAY = 1.0


class InvocationNotDelivered(ToolexecError):
    """E3001: the request could not be handed to the broker within the timeout."""

    code = "E3001"


class InvocationUnresolved(ToolexecError):
    """E3002: the request was delivered, but no terminal event arrived in time."""

    code = "E3002"


class InvocationClient:
    """Emits invocation requests and resolves them when their terminal event arrives.

    With `pipeline` (the pipeline of this very process), a request whose partition the
    pipeline owns is handed over in memory once the broker acknowledged it, and its
    terminal event comes back in memory; other requests are followed on the log."""

    def __init__(self, bootstrap: str, *, pipeline: Pipeline | None = None,
                 verifier: FactVerifier | None = None,
                 fetch_waits: tuple[int, int] = (1, 500),
                 client_options: Mapping[str, Any] | None = None,
                 seal_to: X25519PublicKey | None = None) -> None:
        self._bootstrap = bootstrap
        self._sealer = None if seal_to is None else TokenSealer(seal_to)
        """Seals tokens sent to the pipeline's key `seal_to`, each bound to its command
        (contracts.token_seal); None sends them as they are."""
        self._options = dict(client_options or {})
        """Connection options (`settings.kafka_client_options`) of both clients."""
        self._pipeline = pipeline
        self._verifier = verifier
        self.untrusted = 0
        """Facts of awaited invocations ignored because their signature did not check."""
        self._pacer = FetchPacer(*fetch_waits)
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._tail_lock = asyncio.Lock()
        self._waiters: dict[str, asyncio.Future[Envelope]] = {}
        self._progress: dict[str, Progress] = {}
        self._reader: asyncio.Task[None] | None = None
        self._registry_end: int | None = None
        """End offset of the registry topic after this client's own last write there:
        its requests carry it, so the resolver sees what this client published."""

    async def __aenter__(self) -> InvocationClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(bootstrap_servers=self._bootstrap, linger_ms=0,
                                          request_timeout_ms=SEND_TIMEOUT_MS, **self._options)
        await self._producer.start()

    async def _follow_log(self) -> None:
        """Start tailing the facts from their end (before the first request that is
        not handed over locally is sent, so its terminal event cannot be missed)."""
        if self._verifier is None:
            raise ValueError("following invocations on the log needs a FactVerifier: a "
                             "result read from the log is trusted only when the pipeline "
                             "signed it")
        async with self._tail_lock:
            if self._consumer is not None:
                return
            consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, group_id=None,
                                        auto_offset_reset="latest",
                                        fetch_max_wait_ms=self._pacer.short_ms,
                                        **self._options)
            await consumer.start()
            partitions = consumer.partitions_for_topic(topics.INVOCATIONS) or {0}
            tps = [TopicPartition(topics.INVOCATIONS, p) for p in sorted(partitions)]
            consumer.assign(tps)
            await consumer.seek_to_end(*tps)
            for tp in tps:  # resolve the end positions now, before any request is sent
                await consumer.position(tp)
            self._consumer = consumer
            self._pacer.attach(consumer)
            self._reader = asyncio.create_task(self._read())

    async def _following_log(self, envelope: Envelope, deadline: float) -> None:
        """`_follow_log`, retried while the broker is away until `deadline` (then the
        request was not delivered: E3001)."""
        loop = asyncio.get_running_loop()
        delay = RETRY_FIRST_DELAY
        while True:
            try:
                await asyncio.wait_for(self._follow_log(), max(deadline - loop.time(), 0))
                return
            except (KafkaError, TimeoutError) as exc:
                if loop.time() + delay >= deadline:
                    raise _not_delivered(envelope, exc) from None
                log.warning("client.follow_retrying", error=repr(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_DELAY)

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._consumer is not None:
            await close_quietly(self._consumer.stop())
        if self._producer is not None:
            await self._producer.stop()

    async def send(self, envelope: Envelope, *, partition: int | None = None) -> Any:
        """Publish any event (e.g. tool.published) to its topic; returns its metadata."""
        assert self._producer is not None, "client not started"
        metadata = await send_event(self._producer, envelope, partition=partition)
        if topics.TOPIC_OF_TYPE[envelope.type] == topics.REGISTRY:
            self._registry_end = max(self._registry_end or 0, metadata.offset + 1)
        return metadata

    def new_invocation_id(self) -> str:
        """A fresh invocation id; with a local pipeline, one whose partition it owns
        when one of a few tries finds it (production replicas share the partitions)."""
        invocation_id = str(uuid.uuid4())
        pipeline = self._pipeline
        if pipeline is not None:
            for _ in range(LOCAL_ID_TRIES):
                if pipeline.owns(pipeline.partition_of(invocation_id)):
                    break
                invocation_id = str(uuid.uuid4())
        return invocation_id

    def _local_partition(self, invocation_id: str) -> int | None:
        """The partition of `invocation_id` when the local pipeline owns it."""
        pipeline = self._pipeline
        if pipeline is None:
            return None
        partition = pipeline.partition_of(invocation_id)
        return partition if pipeline.owns(partition) else None

    async def submit(self, tool_id: str, parameters: Mapping[str, Any] | None = None, *,
                     version_range: str = "*", lockfile: Mapping[str, Any] | None = None,
                     token: str | None = None, invocation_id: str | None = None,
                     requested_by: str | None = None,
                     execution_mode: Literal["sync", "async"] = "async",
                     timeout: float = 30.0, callback_url: str | None = None) -> Envelope:
        """Emit `tool.invoke.requested` without waiting for its outcome; returns the
        request's envelope. Raises `InvocationNotDelivered` (E3001) when the broker does
        not take it within `timeout` seconds. `callback_url` is sent as given: check it
        against the operator's hosts first (`usecases.callbacks.checked_callback_url`)."""
        envelope = _request(tool_id, parameters, version_range=version_range,
                            lockfile=lockfile, token=token, requested_by=requested_by,
                            invocation_id=invocation_id or self.new_invocation_id(),
                            execution_mode=execution_mode, registry_offset=self._registry_end,
                            callback_url=callback_url)
        self._seal(envelope)
        partition = self._local_partition(envelope.correlationid)
        metadata = await self._deliver(envelope, asyncio.get_running_loop().time() + timeout,
                                       partition=partition)
        if partition is not None and self._pipeline is not None:
            self._pipeline.hand_over(envelope, partition, metadata.offset)
        return envelope

    async def invoke(self, tool_id: str, parameters: Mapping[str, Any] | None = None, *,
                     version_range: str = "*", lockfile: Mapping[str, Any] | None = None,
                     token: str | None = None, timeout: float = 120.0,
                     invocation_id: str | None = None, progress: Progress | None = None,
                     requested_by: str | None = None,
                     callback_url: str | None = None) -> Envelope:
        """Request an invocation and return its terminal event (completed or failed).

        Raises `InvocationNotDelivered` (E3001) or `InvocationUnresolved` (E3002) when
        that cannot be done within `timeout` seconds; both carry the invocation id."""
        invocation_id = invocation_id or self.new_invocation_id()
        envelope = _request(tool_id, parameters, version_range=version_range,
                            lockfile=lockfile, token=token, requested_by=requested_by,
                            invocation_id=invocation_id, execution_mode="sync",
                            registry_offset=self._registry_end, callback_url=callback_url)
        self._seal(envelope)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        partition = self._local_partition(invocation_id)
        if partition is not None and self._pipeline is not None:
            waiter = self._pipeline.expect(invocation_id, _only_progress(progress))
            try:
                metadata = await self._deliver(envelope, deadline, partition=partition)
            except BaseException:
                self._pipeline.forget(invocation_id)
                raise
            self._pipeline.hand_over(envelope, partition, metadata.offset)
            return await _terminal(waiter, invocation_id, deadline, timeout)
        await self._following_log(envelope, deadline)
        waiter = loop.create_future()
        self._waiters[invocation_id] = waiter
        if progress is not None:
            self._progress[invocation_id] = progress
        self._pacer.busy()
        try:
            await self._deliver(envelope, deadline)
            return await _terminal(waiter, invocation_id, deadline, timeout, shared=False)
        finally:
            self._waiters.pop(invocation_id, None)
            self._progress.pop(invocation_id, None)

    async def cancel(self, invocation_id: str, reason: str | None = None, *,
                     requested_by: str | None = None, timeout: float = 30.0) -> Envelope:
        """Emit `tool.invoke.cancel.requested` for `invocation_id` and return it.

        The pipeline stops the invocation if it has not ended yet (it then ends with
        `tool.invoke.failed` E3703); a cancel of an ended invocation changes nothing.
        Raises `InvocationNotDelivered` (E3001) when the broker does not take it in time.
        A cancel of an invocation whose partition the local pipeline owns is applied
        there as soon as the broker has it, without waiting for the pipeline's fetch."""
        envelope = await self.command(InvokeCancelRequested(
            invocation_id=invocation_id, reason=reason, requested_by=requested_by),
            timeout=timeout)
        if self._pipeline is not None and self._local_partition(invocation_id) is not None:
            self._pipeline.cancel(invocation_id, reason)
        return envelope

    async def command(self, data: Any, *, token: str | None = None,
                      timeout: float = 30.0) -> Envelope:
        """Emit a command about one invocation (`data.invocation_id`: cancel, approval
        decision; `token` as its `captoken`) to the partition that owns it, and return
        it. Raises `InvocationNotDelivered` (E3001) when the broker does not take it in
        time."""
        invocation_id = data.invocation_id
        envelope = new_envelope(data, source=SOURCE, partitionkey=invocation_id,
                                correlationid=invocation_id, id=str(uuid.uuid4()),
                                time=datetime.now(UTC),
                                extensions={"captoken": token} if token else {})
        self._seal(envelope)
        await self._deliver(envelope, asyncio.get_running_loop().time() + timeout)
        return envelope

    def _seal(self, envelope: Envelope) -> None:
        """Seal `envelope`'s token to the pipeline's key, bound to `envelope`."""
        token = envelope.extensions.get("captoken")
        if token and self._sealer is not None and not is_sealed(token):
            envelope.extensions["captoken"] = self._sealer.seal(token, envelope)

    async def _deliver(self, envelope: Envelope, deadline: float, *,
                       partition: int | None = None) -> Any:
        """Send `envelope`, retrying transient broker errors until `deadline`; returns
        the record's metadata (partition, offset)."""
        loop = asyncio.get_running_loop()
        delay = RETRY_FIRST_DELAY
        last: BaseException | None = None
        while (remaining := deadline - loop.time()) > 0:
            try:
                return await asyncio.wait_for(self.send(envelope, partition=partition),
                                              remaining)
            except TimeoutError:
                break
            except KafkaError as exc:
                if not transient_broker_error(exc):
                    raise
                last = exc
                log.warning("client.send_retrying", event_id=envelope.id, error=repr(exc))
            await asyncio.sleep(min(delay, max(deadline - loop.time(), 0)))
            delay = min(delay * 2, RETRY_MAX_DELAY)
        raise _not_delivered(envelope, last)

    async def _read(self) -> None:
        assert self._consumer is not None
        failing = False
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=200)
            except KafkaError as exc:  # broker away: the consumer reconnects by itself
                if not failing:
                    log.warning("client.read_retrying", error=repr(exc))
                failing = True
                await asyncio.sleep(0.2)
                continue
            failing = False
            if self._waiters:
                self._pacer.busy()
            else:
                self._pacer.update()
            for records in batches.values():
                for record in records:
                    self._route(record)

    def _route(self, record: Any) -> None:
        key = record.key.decode("utf-8", "replace") if record.key else None
        if key not in self._waiters:
            return
        if header_type(record.headers) not in TERMINAL_TYPES and key not in self._progress:
            return
        assert self._verifier is not None
        verdict = self._verifier.verify(record.headers, record.value)
        if verdict is not Verdict.VALID:  # a forged result never reaches a caller
            self.untrusted += 1
            log.warning("client.untrusted_fact", invocation_id=key, offset=record.offset,
                        verdict=verdict.value)
            return
        try:
            envelope = decode(record.key, record.value, record.headers)
        except UndecodableRecord:
            return
        if envelope.type in TERMINAL_TYPES:
            waiter = self._waiters.get(envelope.correlationid)
            if waiter is not None and not waiter.done():
                waiter.set_result(envelope)
        elif envelope.type in PROGRESS_TYPES and envelope.correlationid in self._progress:
            self._progress[envelope.correlationid](envelope)


def _not_delivered(envelope: Envelope, last: BaseException | None) -> InvocationNotDelivered:
    return InvocationNotDelivered(
        f"invocation {envelope.correlationid} could not be handed to the broker in time; "
        "it was not confirmed and may or may not run",
        details={"invocation_id": envelope.correlationid, "delivered": False,
                 "last_error": repr(last) if last else "timeout"})


def _only_progress(progress: Progress | None) -> Progress | None:
    """`progress`, called for the progress facts only (not the terminal event)."""
    if progress is None:
        return None

    def listener(event: Envelope) -> None:
        if event.type in PROGRESS_TYPES:
            progress(event)
    return listener


async def _terminal(waiter: asyncio.Future[Envelope], invocation_id: str, deadline: float,
                    timeout: float, *, shared: bool = True) -> Envelope:
    """The terminal event `waiter` gets, or E3002 when it does not come by `deadline`.
    A `shared` waiter (a local run's) is never cancelled from here; one of this call's
    own is awaited as it is (each layer around it costs a turn of the event loop)."""
    try:
        async with asyncio.timeout_at(deadline):
            return await (asyncio.shield(waiter) if shared else waiter)
    except TimeoutError:
        raise InvocationUnresolved(
            f"no terminal event for invocation {invocation_id} within {timeout:g} s; "
            "it may still finish", details={"invocation_id": invocation_id,
                                            "delivered": True}) from None
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        reason = "its run was stopped (the pipeline is shutting down)"
    except Exception as error:  # the run could not even append its failure
        reason = f"its run failed: {error!r}"
    raise InvocationUnresolved(
        f"invocation {invocation_id} did not reach its terminal event here: {reason}; it "
        "resumes from the log when the pipeline starts again",
        details={"invocation_id": invocation_id, "delivered": True})


def _request(tool_id: str, parameters: Mapping[str, Any] | None, *, version_range: str,
             lockfile: Mapping[str, Any] | None, token: str | None, requested_by: str | None,
             invocation_id: str, execution_mode: Literal["sync", "async"],
             registry_offset: int | None = None, callback_url: str | None = None) -> Envelope:
    request = InvokeRequested(
        invocation_id=invocation_id, tool_id=tool_id, version_range=version_range,
        parameters=dict(parameters or {}), lockfile=dict(lockfile) if lockfile else None,
        requested_by=requested_by, execution_mode=execution_mode,
        registry_offset=registry_offset, callback_url=callback_url,
    )
    extensions = {"captoken": token} if token else {}
    return new_envelope(request, source=SOURCE, partitionkey=invocation_id,
                        correlationid=invocation_id, id=str(uuid.uuid4()),
                        time=datetime.now(UTC), extensions=extensions)
