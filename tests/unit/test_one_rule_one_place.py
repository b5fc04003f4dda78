"""Rules that several parts apply are written once: the terminal events of an
invocation, sending an event to its type's topic."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from contracts import topics
from contracts.envelope import new_envelope
from contracts.events import EVENT_MODELS, TERMINAL_STATUSES, TERMINAL_TYPES, PolicyUpdated
from contracts.kafka_binding import KafkaRecord, encode, send_event


def test_the_terminal_events_are_the_completed_and_failed_facts() -> None:
    assert {"tool.invoke.completed", "tool.invoke.failed"} == TERMINAL_TYPES
    assert set(EVENT_MODELS) >= TERMINAL_TYPES
    assert all(topics.TOPIC_OF_TYPE[t] == topics.INVOCATIONS for t in TERMINAL_TYPES)
    assert {"completed", "failed"} == TERMINAL_STATUSES


def test_every_part_uses_the_contracts_terminal_set() -> None:
    import consumers.runtime.invocation_facts
    import projections.audit
    import projections.invocations
    import toolexec.client
    import toolexec.metrics

    assert consumers.runtime.invocation_facts.TERMINAL_TYPES is TERMINAL_TYPES
    assert toolexec.client.TERMINAL_TYPES is TERMINAL_TYPES
    assert toolexec.metrics.TERMINAL is TERMINAL_TYPES
    assert set(projections.audit.TERMINAL_TYPES) == TERMINAL_TYPES
    assert projections.invocations.TERMINAL is TERMINAL_STATUSES


class Recorder:
    """Records what an aiokafka producer would be asked to send."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_and_wait(self, topic: str, value: bytes | None = None,
                            key: bytes | None = None, partition: int | None = None,
                            timestamp_ms: int | None = None, headers: Any = None) -> str:
        self.sent.append({"topic": topic, "value": value, "key": key, "partition": partition,
                          "headers": headers})
        return "metadata"


def _policy_event() -> Any:
    data = PolicyUpdated(policy_set_id="ops", version="v1", policies="permit(principal, "
                         "action, resource);")
    return new_envelope(data, source="urn:test", partitionkey="ops", correlationid="ops",
                        id="e-1", time=datetime(2026, 11, 25, tzinfo=UTC))


async def test_send_event_encodes_and_sends_to_the_types_topic() -> None:
    producer, event = Recorder(), _policy_event()
    assert await send_event(producer, event, partition=0) == "metadata"
    record = encode(event)
    assert producer.sent == [{"topic": topics.TOPIC_OF_TYPE["policy.updated"],
                              "value": record.value, "key": record.key, "partition": 0,
                              "headers": list(record.headers)}]


async def test_send_event_sends_an_already_encoded_record_as_it_is() -> None:
    producer, event = Recorder(), _policy_event()
    signed = KafkaRecord(key=b"ops", value=b"{}", headers=[("x-signed", b"1")])
    await send_event(producer, event, record=signed)
    assert producer.sent[0]["value"] == b"{}"
    assert producer.sent[0]["headers"] == [("x-signed", b"1")]


def test_redaction_scrubs_credentials_as_the_executor_does() -> None:
    """Redaction's credential pass is the Scrubber: every form the executor scrubs
    from a tool's output (here base64 and JSON-escaped) is scrubbed from a result too."""
    import base64

    from domain.redaction import redact_secrets
    from domain.secret_scrub import Scrubber

    secret = 'hunter2"pass'
    value = {"plain": f"token={secret}", "b64": base64.b64encode(secret.encode()).decode(),
             "json": json.dumps(secret)[1:-1], "other": "nothing to see"}
    redacted = redact_secrets(value, secrets=(secret,))
    assert redacted.value == Scrubber([secret]).value(value)
    assert redacted.value["other"] == "nothing to see"
    assert all(secret not in v and value["b64"] not in v
               for k, v in redacted.value.items() if k != "other")
    assert redacted.count == 3
