"""Publishing that outlasts a broker outage.

A handler's output events are its work: when the broker is away (restarting,
partitioned) a publish fails with a transient error. Failing the handler for it
would burn its poison-record attempts and dead-letter a good record; instead the
publish is retried with capped exponential backoff until the broker takes the
event. The record is not committed meanwhile (its handler has not returned), so a
process that stops during the wait leaves the record to be delivered again.
Errors that a retry cannot cure (a record too large, a closed producer) are raised
at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
from aiokafka.errors import KafkaTimeoutError

from consumers.ports import Publish
from contracts.envelope import Envelope

log = structlog.get_logger(__name__)


def transient_broker_error(error: BaseException) -> bool:
    """Whether a Kafka client error may pass once the broker is back: aiokafka marks
    connection and leadership errors retriable, and times out (KafkaTimeoutError)
    when it found no broker to take a record within its request timeout."""
    return bool(getattr(error, "retriable", False)) or isinstance(error, KafkaTimeoutError)


@dataclass(frozen=True)
class DeliveringPublisher:
    """A `Publish` port that retries `publish` while `is_transient(error)` holds."""

    publish: Publish
    is_transient: Callable[[BaseException], bool] = transient_broker_error
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    first_delay: float = 0.05
    max_delay: float = 2.0

    async def __call__(self, envelope: Envelope) -> None:
        delay = self.first_delay
        attempt = 1
        while True:
            try:
                await self.publish(envelope)
            except Exception as exc:
                if not self.is_transient(exc):
                    raise
                log.warning("publish.retrying", event_id=envelope.id, event_type=envelope.type,
                            attempt=attempt, retry_in=delay, error=repr(exc))
            else:
                if attempt > 1:
                    log.info("publish.delivered", event_id=envelope.id, attempts=attempt)
                return
            await self.sleep(delay)
            delay = min(delay * 2, self.max_delay)
            attempt += 1
