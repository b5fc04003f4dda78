"""The callback deliverer of `toolexec up`: POSTs each terminal result to the request's
`callback_url`, signed, and records the outcome on the log.

A consumer of its own group (`toolexec.callbacks`) on the facts topic, stateless: for
each signed terminal event it reads the request's callback URL from the invocations
read model, checks it against the operator's callback hosts again (a request may come
from any Kafka producer) and the addresses the host resolves to
(`domain.callbacks`), then POSTs the terminal event to one of the very addresses
checked (the name is never resolved again: no DNS rebinding between the check and the
connection; the Host header and TLS server name stay the URL's) as a structured
CloudEvent with `Toolexec-Signature` and `Toolexec-Event-Id` headers. 5xx, 408, 429
and transport errors are retried (each attempt resolving the host once again) with exponential backoff and jitter (tenacity) up to
`callback_max_attempts`; then, or on another answer, it gives up (E3704).

"Once": the outcome is appended to `toolexec.callbacks` (`callback.delivered` or
`callback.failed`, id derived from the terminal event's) before the facts' offset is
committed, and the deliverer reads that topic before each batch: a restarted
deliverer, or the new owner of a partition after a rebalance, does not send what was
recorded. A crash between a POST and its record sends it again: receivers dedupe on
`Toolexec-Event-Id`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from contracts import topics
from contracts.envelope import Envelope, derived_event_id, new_envelope
from contracts.errors import ErrorInfo
from contracts.events import TERMINAL_TYPES, CallbackDelivered, CallbackFailed
from contracts.fact_signature import FactVerifier, Verdict
from contracts.kafka_binding import UndecodableRecord, decode, header_type
from contracts.kafka_clients import close_quietly
from domain.callbacks import (
    EVENT_ID_HEADER,
    SIGNATURE_HEADER,
    CallbackTarget,
    check_callback_addresses,
    check_callback_url,
    signature,
)
from domain.errors import ToolexecError
from toolexec import keys
from toolexec.log_reading import events_to
from toolexec.settings import Settings, consumer_kwargs, fetch_waits

log = structlog.get_logger(__name__)

GROUP = "toolexec.callbacks"
SOURCE = "urn:toolexec:callbacks"
INVOCATION_ID_HEADER = "Toolexec-Invocation-Id"
MAX_BACKOFF_SECONDS = 60.0
AT_ONCE = 16
"""Deliveries of one batch in flight at once."""
RETRIED_STATUSES = frozenset({408, 429})

Lookup = Callable[[str], Awaitable[str | None]]
"""Invocation id -> the callback URL of its request (None: it has none)."""
Publish = Callable[[Envelope], Awaitable[None]]


@dataclass(frozen=True)
class CallbackPolicy:
    """The operator's callback settings the deliverer applies."""

    hosts: tuple[str, ...]
    secret: bytes
    max_attempts: int = 6
    timeout_seconds: float = 10.0
    first_backoff_seconds: float = 0.5

    @classmethod
    def from_settings(cls, settings: Settings) -> CallbackPolicy:
        return cls(hosts=tuple(settings.callback_hosts), secret=keys.callback_secret(settings),
                   max_attempts=settings.callback_max_attempts,
                   timeout_seconds=settings.callback_timeout_seconds,
                   first_backoff_seconds=settings.callback_first_backoff_seconds)


class _Retryable(Exception):
    """A POST worth trying again (5xx, 408, 429, no answer)."""


@dataclass(frozen=True)
class Delivery:
    """How one callback ended: the receiver's 2xx, or the error that ended it."""

    attempts: int
    status_code: int | None = None
    error: ErrorInfo | None = None


def callback_body(terminal: Envelope) -> bytes:
    """The terminal event as a structured-mode CloudEvent (compact JSON): the bytes
    that are signed and sent."""
    document = {"specversion": "1.0", "id": terminal.id, "type": terminal.type,
                "source": terminal.source, "time": terminal.time.isoformat(),
                "subject": terminal.subject, "datacontenttype": "application/json",
                "correlationid": terminal.correlationid,
                "data": terminal.data.model_dump(mode="json")}
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


async def resolve_host(target: CallbackTarget) -> list[str]:
    """Every address `target`'s host resolves to."""
    infos = await asyncio.get_running_loop().getaddrinfo(target.host, target.port)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def post_pinned(http: httpx.AsyncClient, target: CallbackTarget,
                      addresses: Sequence[str], body: bytes, headers: Mapping[str, str],
                      timeout: float) -> httpx.Response:
    """POST `body` to the first of `addresses` (those `target`'s host resolved to, all
    checked) that takes the connection; the host name is never resolved again. The
    URL's host is replaced by the address, while the Host header and the TLS server
    name (SNI, the name the certificate is verified against) stay the URL's."""
    url = httpx.URL(target.url)
    pinned = {**headers, "Host": url.netloc.decode("ascii")}
    refused: httpx.ConnectError | None = None
    for address in addresses:
        try:
            return await http.post(url.copy_with(host=address), content=body,
                                   headers=pinned, timeout=timeout,
                                   extensions={"sni_hostname": target.host})
        except httpx.ConnectError as error:
            refused = error
    raise refused or httpx.ConnectError(f"{target.host} has no address to connect to")


async def deliver(http: httpx.AsyncClient, target: CallbackTarget, terminal: Envelope,
                  policy: CallbackPolicy, *,
                  resolve: Callable[[CallbackTarget], Awaitable[list[str]]] = resolve_host
                  ) -> Delivery:
    """POST `terminal` to `target` until a 2xx, a final answer or the last attempt."""
    body = callback_body(terminal)
    attempts = 0

    async def post() -> int:
        nonlocal attempts
        attempts += 1
        try:
            addresses = await resolve(target)
        except OSError as error:
            raise _Retryable(f"cannot resolve {target.host}: {error}") from None
        check_callback_addresses(target, addresses)
        headers = {"Content-Type": "application/cloudevents+json",
                   SIGNATURE_HEADER: signature(policy.secret, int(time.time()), body),
                   EVENT_ID_HEADER: terminal.id,
                   INVOCATION_ID_HEADER: terminal.correlationid}
        try:
            answer = await post_pinned(http, target, addresses, body, headers,
                                       policy.timeout_seconds)
        except httpx.HTTPError as error:
            raise _Retryable(f"{type(error).__name__}: {error}") from None
        if answer.status_code >= 500 or answer.status_code in RETRIED_STATUSES:
            raise _Retryable(f"the receiver answered {answer.status_code}")
        return answer.status_code

    retrying = AsyncRetrying(
        stop=stop_after_attempt(policy.max_attempts),
        wait=wait_exponential(multiplier=policy.first_backoff_seconds, max=MAX_BACKOFF_SECONDS)
        + wait_random(0, policy.first_backoff_seconds),
        retry=retry_if_exception_type(_Retryable), reraise=False)
    try:
        status = await retrying(post)
    except RetryError as gave_up:
        reason = gave_up.last_attempt.exception()
        return Delivery(attempts, error=ErrorInfo(
            code="E3704", message=f"no 2xx after {attempts} attempt(s): {reason}"[:500],
            details={"host": target.host}))
    except ToolexecError as refused:  # E3406: the host now resolves somewhere not allowed
        return Delivery(attempts, error=ErrorInfo(code=refused.code, message=refused.message,
                                                  details=refused.details))
    if 200 <= status < 300:
        return Delivery(attempts, status_code=status)
    return Delivery(attempts, error=ErrorInfo(
        code="E3704", message=f"the receiver answered {status}", details={"host": target.host,
                                                                           "status": status}))


def outcome_event(terminal: Envelope, host: str | None, delivery: Delivery) -> Envelope:
    """`callback.delivered` or `callback.failed` for `terminal`; one id either way."""
    data: CallbackDelivered | CallbackFailed
    if delivery.error is None:
        assert host is not None and delivery.status_code is not None
        data = CallbackDelivered(invocation_id=terminal.correlationid,
                                 terminal_event_id=terminal.id, host=host,
                                 status_code=delivery.status_code, attempts=delivery.attempts)
    else:
        data = CallbackFailed(invocation_id=terminal.correlationid,
                              terminal_event_id=terminal.id, host=host,
                              attempts=delivery.attempts, error=delivery.error)
    return new_envelope(data, source=SOURCE, partitionkey=terminal.correlationid,
                        correlationid=terminal.correlationid, causationid=terminal.id,
                        id=derived_event_id(terminal.id, "callback"), time=datetime.now(UTC))


class CallbackDeliverer:
    """The deliverer's consumers and its loop; `start()` then `stop()`."""

    def __init__(self, settings: Settings, bootstrap: str, *, lookup: Lookup,
                 publish: Publish, verifier: FactVerifier,
                 client_options: Mapping[str, Any] | None = None,
                 policy: CallbackPolicy | None = None, group: str = GROUP) -> None:
        self._settings = settings
        self._bootstrap = bootstrap
        self._lookup = lookup
        self._publish = publish
        self._verifier = verifier
        self._client_options = dict(client_options or {})
        self._policy = policy or CallbackPolicy.from_settings(settings)
        self._group = group
        self._done: set[str] = set()
        """Terminal event ids whose callback outcome is on the log."""
        self._facts: AIOKafkaConsumer | None = None
        self._records: AIOKafkaConsumer | None = None
        self._http: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._at_once = asyncio.Semaphore(AT_ONCE)

    async def start(self) -> None:
        # Callbacks are not on any caller's path: the idle wait, woken by new facts
        # behind the gate and by Kafka, instead of a poll every millisecond.
        options = {**consumer_kwargs(self._settings),
                   "fetch_max_wait_ms": fetch_waits(self._settings)[1]}
        self._facts = AIOKafkaConsumer(
            topics.INVOCATIONS, bootstrap_servers=self._bootstrap, group_id=self._group,
            enable_auto_commit=False, auto_offset_reset="earliest", **options,
            **self._client_options)
        self._records = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, group_id=None,
                                         enable_auto_commit=False, **self._client_options)
        # No kept-alive connections: one made to an address for one host name (its TLS
        # server name) must not carry a callback to another name on that address.
        self._http = httpx.AsyncClient(follow_redirects=False,
                                       limits=httpx.Limits(max_keepalive_connections=0))
        await self._records.start()
        await self._records.topics()  # the cluster's metadata, partitions included
        partitions = self._records.partitions_for_topic(topics.CALLBACKS) or {0}
        self._records.assign([TopicPartition(topics.CALLBACKS, p) for p in partitions])
        await self._records.seek_to_beginning()
        await self._facts.start()
        self._task = asyncio.create_task(self._run(), name="callback-deliverer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for consumer in (self._facts, self._records):
            if consumer is not None:
                await close_quietly(consumer.stop())
        self._facts = self._records = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> CallbackDeliverer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _run(self) -> None:
        assert self._facts is not None
        while True:
            try:
                batches = await self._facts.getmany(timeout_ms=1000, max_records=200)
                if not batches:
                    continue
                await self._read_outcomes()
                terminals = [t for records in batches.values() for r in records
                             if (t := self._terminal(r)) is not None and t.id not in self._done]
                await asyncio.gather(*(self._handle_bounded(t) for t in terminals))
                await self._facts.commit({tp: records[-1].offset + 1
                                          for tp, records in batches.items()})
            except asyncio.CancelledError:
                raise
            except Exception as error:  # broker or store away: the batch comes again
                log.warning("callbacks.batch_failed", error=repr(error), exc_info=True)
                await asyncio.sleep(1.0)
                with contextlib.suppress(KafkaError, AssertionError):
                    await self._rewind()

    async def _rewind(self) -> None:
        """Go back to the committed offsets: a batch not committed is handled again."""
        assert self._facts is not None
        for tp in self._facts.assignment():
            committed = await self._facts.committed(tp)
            if committed is None:
                await self._facts.seek_to_beginning(tp)
            else:
                self._facts.seek(tp, committed)

    async def _read_outcomes(self) -> None:
        """Take in every outcome recorded so far (this or another deliverer's)."""
        assert self._records is not None
        partitions = list(self._records.assignment())
        ends = await self._records.end_offsets(partitions)
        async for envelope in events_to(self._records, ends, timeout_ms=500):
            terminal_id = getattr(envelope.data, "terminal_event_id", None)
            if terminal_id:
                self._done.add(terminal_id)

    def _terminal(self, record: Any) -> Envelope | None:
        """The record as a terminal event the pipeline signed, else None."""
        if header_type(record.headers) not in TERMINAL_TYPES:
            return None
        if self._verifier.verify(record.headers, record.value) is not Verdict.VALID:
            return None  # the circuits step dead-letters it
        try:
            return decode(record.key, record.value, record.headers)
        except UndecodableRecord:
            return None

    async def _handle_bounded(self, terminal: Envelope) -> None:
        async with self._at_once:
            await self._handle(terminal)

    async def _handle(self, terminal: Envelope) -> None:
        url = await self._lookup(terminal.correlationid)
        if url is None:
            return
        assert self._http is not None
        try:
            target = check_callback_url(url, self._policy.hosts)
        except ToolexecError as refused:
            delivery = Delivery(0, error=ErrorInfo(code=refused.code, message=refused.message,
                                                   details=refused.details))
            host = refused.details.get("host")
        else:
            delivery = await deliver(self._http, target, terminal, self._policy)
            host = target.host
        await self._publish(outcome_event(terminal, host if isinstance(host, str) else None,
                                          delivery))
        self._done.add(terminal.id)
        log.info("callbacks.outcome", invocation_id=terminal.correlationid, host=host,
                 attempts=delivery.attempts,
                 code=None if delivery.error is None else delivery.error.code)


class RequestNotFolded(RuntimeError):
    """The read model has not folded an invocation's request yet: the terminal event's
    batch is handled again later rather than its callback skipped."""


def read_model_lookup(engine: Any, caught_up: Callable[[float], Awaitable[bool]], *,
                      wait_seconds: float = 10.0) -> Lookup:
    """The callback URL of an invocation's request, from the invocations read model.
    A request the model has not folded yet is waited for (bounded); if the model is
    still behind then, RequestNotFolded (the batch comes again); a request missing
    from a model that has caught up is no callback (logged)."""
    from projections.queries import invocation_status

    async def lookup(invocation_id: str) -> str | None:
        caught = False
        for first in (True, False):
            async with engine.connect() as conn:
                row = await invocation_status(conn, invocation_id)
            if row is not None and row["requested_at"] is not None:
                return row["callback_url"]
            if first:
                caught = await caught_up(wait_seconds)
        if not caught:
            raise RequestNotFolded(invocation_id)
        log.warning("callbacks.request_not_found", invocation_id=invocation_id)
        return None

    return lookup
