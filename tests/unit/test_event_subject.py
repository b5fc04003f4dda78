"""Records about one tool carry its id as the CloudEvents `subject` (the `ce_subject`
header), signed with the rest; the others carry none."""

from __future__ import annotations

import pytest

from contracts.envelope import subject_of
from contracts.events import EventData
from contracts.kafka_binding import decode, encode
from tests.unit.test_kafka_binding import SAMPLES, envelope_of


@pytest.mark.parametrize("data", SAMPLES, ids=lambda d: d.EVENT_TYPE)
def test_subject_is_the_tool_id_where_the_event_names_one(data: EventData) -> None:
    record = encode(envelope_of(data))
    header = dict(record.headers).get("ce_subject")
    tool_id = getattr(data, "tool_id", None)
    assert header == (tool_id.encode() if tool_id else None)
    assert decode(record.key, record.value, record.headers).subject == tool_id


def test_an_explicit_subject_wins() -> None:
    request = next(d for d in SAMPLES if d.EVENT_TYPE == "tool.invoke.requested")
    assert subject_of(request) == request.tool_id
    record = encode(envelope_of(request, subject="other"))
    assert dict(record.headers)["ce_subject"] == b"other"
