"""Publishing that outlasts a broker outage.

A step's output events are its work: when the broker is away (restarting,
partitioned) a publish fails with a transient error. Failing the step for it would
burn its poison attempts and dead-letter a good request; instead the publish is
retried with capped exponential backoff until the broker takes the events. The
request is not marked finished meanwhile, so a process that stops during the wait
leaves it to be read again. Errors that a retry cannot cure (a record too large, a
closed producer) are raised at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import structlog
from aiokafka.errors import KafkaTimeoutError

from consumers.ports import Publish
from contracts.envelope import Envelope

log = structlog.get_logger(__name__)

T = TypeVar("T")


def transient_broker_error(error: BaseException) -> bool:
    """Whether a Kafka client error may pass once the broker is back: aiokafka marks
    connection and leadership errors retriable, and times out (KafkaTimeoutError)
    when it found no broker to take a record within its request timeout."""
    return bool(getattr(error, "retriable", False)) or isinstance(error, KafkaTimeoutError)


async def deliver(send: Callable[[], Awaitable[T]], *, what: str,
                  is_transient: Callable[[BaseException], bool] = transient_broker_error,
                  sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                  first_delay: float = 0.05, max_delay: float = 2.0) -> T:
    """`send()`, again and again with capped exponential backoff while it fails with a
    transient error; other errors are raised at once."""
    delay = first_delay
    attempt = 1
    while True:
        try:
            result = await send()
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning("publish.retrying", what=what, attempt=attempt, retry_in=delay,
                        error=repr(exc))
        else:
            if attempt > 1:
                log.info("publish.delivered", what=what, attempts=attempt)
            return result
        await sleep(delay)
        delay = min(delay * 2, max_delay)
        attempt += 1


@dataclass(frozen=True)
class DeliveringPublisher:
    """A `Publish` port that retries `publish` while `is_transient(error)` holds."""

    publish: Publish
    is_transient: Callable[[BaseException], bool] = transient_broker_error
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    first_delay: float = 0.05
    max_delay: float = 2.0

    async def __call__(self, envelope: Envelope) -> None:
        await deliver(lambda: self.publish(envelope), what=f"{envelope.type} {envelope.id}",
                      is_transient=self.is_transient, sleep=self.sleep,
                      first_delay=self.first_delay, max_delay=self.max_delay)


class FactLog(Protocol):
    """Appends facts of one invocation to the log, in order; returns once the broker
    has acknowledged every one of them."""

    async def append(self, events: Sequence[Envelope]) -> None: ...


@dataclass(frozen=True)
class DeliveringFactLog:
    """A `FactLog` that retries `inner` while the broker is away. The facts keep their
    ids, so a batch the broker took twice is de-duplicated by every consumer."""

    inner: FactLog
    is_transient: Callable[[BaseException], bool] = transient_broker_error
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def append(self, events: Sequence[Envelope]) -> None:
        await deliver(lambda: self.inner.append(events),
                      what=f"{len(events)} fact(s) of {events[0].correlationid}",
                      is_transient=self.is_transient, sleep=self.sleep)
