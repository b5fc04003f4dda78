"""Redaction plans compiled per contract model (`projections.audit_plan`): for generated
events of every type, hostile text and secrets in every field the model lets hold
them, the planned redaction gives the full walk's document, count and encoding, and
the audit record built with the plans is the one built with the full walk."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

import pytest
from annotated_types import Ge, Le, MaxLen, MinLen
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import AwareDatetime, BaseModel, JsonValue, ValidationError
from pydantic.fields import FieldInfo

import projections.audit_document as audit_document
from contracts.envelope import new_envelope
from contracts.events import EVENT_MODELS, EventData
from domain.redaction import (
    OBJECT,
    SECRET,
    TEXT,
    VALUE,
    redact_document,
    redact_planned,
    redact_text,
)
from projections.audit_plan import INERT_PATTERNS, PLANS, redaction_plan, unannotated

_HOSTILE = ["", "ada@example.com", "4111 1111 1111 1111", "10.0.0.1", "::1", "fe80::1%eth0",
            "password=hunter22", "api_key: 'k-123456'", "call +44 20 7946 0958",
            "(212) 555-0143", "Bearer abcdefgh12345", "123-45-6789", "[REDACTED]",
            "eyJhbGciOi.eyJzdWIiOi.c2ln", "ключ", "\U0001d11e clef", "x" * 190 + " ada@ex.io",
            "sha256:" + "0" * 64, "E3004", "2026-11-28T06:41:59+05:30"]
_texts = st.sampled_from(_HOSTILE) | st.text(max_size=24)
_keys = st.sampled_from(["password", "api_key", "Authorization", "note", "ключ", "\U0001d11e",
                         "tokens", "id"]) | st.text(max_size=6)
_numbers = (st.integers(-(2**64), 2**64) | st.floats(allow_nan=True, allow_infinity=True)
            | st.sampled_from([1.0, 12.5, 1e-7, 2**60]))
_json = st.recursive(st.none() | st.booleans() | _numbers | _texts,
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(_keys, inner, max_size=3), max_leaves=12)
_offsets = st.timedeltas(min_value=-timedelta(hours=23, minutes=59),
                         max_value=timedelta(hours=23, minutes=59)).map(timezone)
_times = st.datetimes(timezones=_offsets | st.just(UTC))


def _strategy(annotation: Any, metadata: list[Any]) -> st.SearchStrategy[Any]:
    """Values of `annotation` (hostile where it is free text), mostly valid."""
    annotation, metadata = unannotated(annotation, metadata)
    origin = get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return st.one_of([st.none() if a is type(None) else _strategy(a, metadata)
                          for a in get_args(annotation)])
    bounds = {type(m): m for m in metadata}
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return st.integers(getattr(bounds.get(Ge), "ge", -(2**64)),
                           getattr(bounds.get(Le), "le", 2**64))
    if annotation is float:
        return st.floats(getattr(bounds.get(Ge), "ge", None), getattr(bounds.get(Le), "le", None))
    if annotation is str:
        pattern = next((m.pattern for m in metadata if getattr(m, "pattern", None)), None)
        if pattern is not None:
            return st.from_regex(pattern, fullmatch=True)
        low = getattr(bounds.get(MinLen), "min_length", 0)
        high = getattr(bounds.get(MaxLen), "max_length", 10**6)
        return _texts.filter(lambda text: low <= len(text) <= high)
    if annotation in (datetime, AwareDatetime):
        return _times
    if origin is Literal:
        return st.sampled_from(get_args(annotation))
    if annotation is JsonValue:
        return _json
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _raw(annotation)
    if origin is list:
        (item,) = get_args(annotation)
        return st.lists(_strategy(item, []), min_size=getattr(bounds.get(MinLen), "min_length", 0),
                        max_size=3)
    if origin is dict:
        _, value = get_args(annotation)
        return st.dictionaries(_keys, _strategy(value, []), max_size=3)
    raise AssertionError(f"no strategy for {annotation!r}")


def _raw(model: type[BaseModel]) -> st.SearchStrategy[dict[str, Any]]:
    fields = {name: _strategy(info.annotation, info.metadata)
              for name, info in model.model_fields.items()}
    required = {n: s for n, s in fields.items() if model.model_fields[n].is_required()}
    optional = {n: s for n, s in fields.items() if n not in required}
    return st.fixed_dictionaries(required, optional=optional)


def _event(model: type[EventData], raw: dict[str, Any]) -> EventData:
    try:
        return model.model_validate(raw)
    except ValidationError:
        assume(False)
        raise


def _serialized(event: EventData) -> dict[str, Any]:
    return event.__pydantic_serializer__.to_python(event, mode="json")


@contextlib.contextmanager
def _full_walk() -> Iterator[None]:
    plans = audit_document.PLANS
    audit_document.PLANS = {}
    try:
        yield
    finally:
        audit_document.PLANS = plans


@pytest.mark.parametrize("event_type", sorted(EVENT_MODELS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                 HealthCheck.too_slow])
@given(data=st.data())
def test_the_planned_redaction_of_every_event_type_is_the_full_walk_s(
        event_type: str, data: st.DataObject) -> None:
    model = EVENT_MODELS[event_type]
    event = _event(model, data.draw(_raw(model)))
    before = event.model_dump(mode="json")
    assert redact_planned(_serialized(event), PLANS[model]) == redact_document(_serialized(event))
    assert event.model_dump(mode="json") == before  # the model's own values untouched

    envelope = new_envelope(event, source="urn:test", partitionkey="p", correlationid="c",
                            id="e", time=datetime(2026, 11, 28, tzinfo=UTC),
                            subject=data.draw(st.none() | _texts.filter(bool)))
    with _full_walk():
        expected = audit_document.audit_values(envelope, topic="t", partition=0, offset=1,
                                               prev_hash=audit_document.GENESIS)
    assert audit_document.audit_values(envelope, topic="t", partition=0, offset=1,
                                       prev_hash=audit_document.GENESIS) == expected


@pytest.mark.parametrize("pattern", sorted(INERT_PATTERNS))
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_no_text_rule_changes_a_match_of_an_inert_pattern(pattern: str,
                                                          data: st.DataObject) -> None:
    text = data.draw(st.from_regex(pattern, fullmatch=True))
    assert redact_text(text) == (text, 0)


def test_plans_leave_out_only_fields_of_inert_shape_and_walk_free_text() -> None:
    class Nested(BaseModel):
        digest: Annotated[str, FieldInfo(pattern=r"^sha256:[0-9a-f]{64}$")]
        note: str

    class Sample(EventData):
        EVENT_TYPE: ClassVar[str] = "sample"
        id: str
        flag: bool
        at: AwareDatetime
        state: Literal["open", "closed"]
        mail: Literal["ada@example.com"]
        password: str
        nested: Nested | None = None
        anything: JsonValue = None

    assert redaction_plan(Sample) == (
        ("id", TEXT, None), ("mail", VALUE, None), ("password", SECRET, None),
        ("nested", OBJECT, (("note", TEXT, None),)), ("anything", VALUE, None))


def test_a_field_read_by_another_name_is_refused() -> None:
    class Aliased(BaseModel):
        value: str = FieldInfo(alias="Value")  # type: ignore[assignment]

    with pytest.raises(ValueError, match="ASCII names"):
        redaction_plan(Aliased)
