"""Dead-letter records: undecodable or poison records, kept with the reason.

Each record becomes a `deadletter.recorded` CloudEvent on `toolexec.deadletter`,
keyed like the original record so partition order is kept, with an id derived from
(topic, partition, offset, consumer) so a redelivery dead-letters idempotently.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import structlog

from consumers.ports import Publish
from contracts.envelope import derived_event_id, new_envelope
from contracts.errors import ErrorInfo
from contracts.events import DeadLetterRecord

log = structlog.get_logger(__name__)

SOURCE = "urn:toolexec:deadletter"


class DeadLetters:
    """Publishes DeadLetterRecord events for records a consumer could not process."""

    def __init__(self, publish: Publish, clock: Callable[[], datetime]) -> None:
        self._publish = publish
        self._clock = clock

    async def record(self, record: Any, error: ErrorInfo | Mapping[str, Any], *,
                     consumer: str, attempts: int) -> None:
        info = error if isinstance(error, ErrorInfo) else ErrorInfo(**dict(error))
        raw_key: bytes | None = record.key if isinstance(record.key, bytes) else None
        key_text = raw_key.decode("utf-8", "replace") if raw_key else None
        document = DeadLetterRecord(
            topic=record.topic, partition=record.partition, offset=record.offset, key=key_text,
            key_b64=base64.b64encode(raw_key).decode("ascii") if raw_key else None,
            headers=_text_headers(record.headers), error=info, consumer=consumer,
            value_b64=base64.b64encode(record.value or b"").decode("ascii"),
            failed_at=self._clock(), attempts=attempts,
        )
        identity = f"{record.topic}/{record.partition}/{record.offset}/{consumer}"
        partitionkey = key_text or identity
        log.warning("deadletter.recorded", topic=record.topic, partition=record.partition,
                    offset=record.offset, consumer=consumer, code=info.code)
        await self._publish(new_envelope(
            document, source=SOURCE, partitionkey=partitionkey, correlationid=partitionkey,
            id=derived_event_id(identity, "deadletter"), time=self._clock()))


def _text_headers(headers: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers or ():
        try:
            out[name] = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError:
            continue
    return out
