"""The decoder's shortcuts change no verdict.

- Headers exactly as toolexec writes them (a signed fact's, with its resume header,
  included) are read in one comprehension; any others
  one by one. Headers given as an iterator always take the one-by-one reading, so
  decoding the same headers as a list and as an iterator must give the same envelope,
  or the same E3004 error with the same message and details.
- `Envelope` accepts a plainly valid envelope without listing its problems; it must
  accept exactly what `envelope_problems` finds nothing wrong with.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.envelope import Envelope, envelope_problems, plain_optionals
from contracts.events import InvokeRequested
from contracts.fact_signature import FactSigner
from contracts.kafka_binding import WRITTEN_EXTENSIONS, UndecodableRecord, decode, encode
from tests.projection_events import captoken, invocation

_PLAIN = [encode(e) for e in invocation("inv-1", token=captoken("ann", "j1"), reports=1)]
_SIGNED = FactSigner(Ed25519PrivateKey.generate()).sign(
    [replace(r, headers=[*r.headers, ("toolexec-resume", b"3 7")]) for r in _PLAIN[1:]])
VALID = [*_PLAIN, *_SIGNED]

names = st.sampled_from(["ce_id", "ce_type", "ce_time", "ce_source", "ce_subject",
                         "content-type", "CE_ID", "ce_traceparent", "ce_Foo", "ce_foo-bar",
                         "x-other", "ce_captoken", "ce_data", "ce_sig", "ce_sigkid",
                         "toolexec-resume", "toolexec-other"]) | st.binary(max_size=6).map(
    lambda b: b"ce_" + b)
values = (st.sampled_from([b"", b"1.0", b"\xff\xfe", b"tool.invoke.requested",
                           b"application/json", b"application/cloudevents+json"])
          | st.binary(max_size=12) | st.text(max_size=6)
          | st.binary(max_size=6).map(bytearray))


def _outcome(key: bytes | None, value: bytes, headers: Any) -> Any:
    try:
        return decode(key, value, headers)
    except UndecodableRecord as bad:
        return bad.error


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_headers_read_at_once_or_one_by_one_give_the_same_verdict(data: st.DataObject) -> None:
    record = data.draw(st.sampled_from(VALID))
    headers = list(record.headers)
    for _ in range(data.draw(st.integers(0, 3))):
        change = data.draw(st.sampled_from(["drop", "repeat", "rename", "revalue", "add"]))
        index = data.draw(st.integers(0, max(len(headers) - 1, 0)))
        if change == "drop" and headers:
            headers.pop(index)
        elif change == "repeat" and headers:
            headers.insert(index, headers[index])
        elif change == "rename" and headers:
            headers[index] = (data.draw(names), headers[index][1])
        elif change == "revalue" and headers:
            headers[index] = (headers[index][0], data.draw(values))
        else:
            headers.insert(index, (data.draw(names), data.draw(values)))
    key = data.draw(st.sampled_from([record.key, None, b""]))
    as_list = _outcome(key, record.value, headers)
    assert as_list == _outcome(key, record.value, tuple(headers))
    assert as_list == _outcome(key, record.value, iter(headers))


def test_the_records_toolexec_writes_decode_through_both_readings() -> None:
    assert all("sig" in decode(r.key, r.value, r.headers).extensions for r in _SIGNED)
    for record in VALID:
        assert decode(record.key, record.value, list(record.headers)) == decode(
            record.key, record.value, iter(record.headers))


texts = st.none() | st.sampled_from(["", "x", "inv-1"]) | st.integers(0, 2)
moments = (st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=2))]))
           | st.datetimes() | st.none())
extensions = (st.dictionaries(st.sampled_from(["traceparent", "captoken", "Bad", "a-b", "id",
                                                "data", "x1", ""]) | st.integers(0, 2),
                              st.sampled_from(["v", ""]) | st.integers(0, 2), max_size=3)
              | st.none() | st.just([]))
DATA = InvokeRequested(invocation_id="inv-1", tool_id="t", parameters={})


@settings(max_examples=400, deadline=None)
@given(id=texts, type=st.sampled_from(["tool.invoke.requested", "tool.invoke.completed", ""]),
       source=texts, subject=texts, time=moments, data=st.sampled_from([DATA, None, "data"]),
       correlationid=texts, causationid=texts, partitionkey=texts, extensions=extensions)
def test_an_envelope_is_accepted_exactly_when_it_has_no_problem(**fields: Any) -> None:
    bare = object.__new__(Envelope)
    for name, value in fields.items():
        object.__setattr__(bare, name, value)
    problems = envelope_problems(bare)
    try:
        Envelope(**fields)
    except ValueError as error:
        assert problems and str(error) == "invalid envelope: " + "; ".join(problems)
    else:
        assert problems == []


@settings(max_examples=400, deadline=None)
@given(subject=texts, causationid=texts,
       extensions=extensions | st.dictionaries(st.sampled_from(sorted(WRITTEN_EXTENSIONS)),
                                               st.sampled_from(["v", ""]) | st.integers(0, 2),
                                               max_size=3),
       names=st.sampled_from([None, WRITTEN_EXTENSIONS]))
def test_plain_optionals_are_optionals_an_envelope_takes(
        subject: Any, causationid: Any, extensions: Any, names: frozenset[str] | None) -> None:
    """The decoder's check (the names toolexec writes) and `Envelope`'s (any allowed
    name) are one predicate: what it passes, the full check finds nothing wrong with."""
    bare = object.__new__(Envelope)
    for name, value in {"id": "e", "type": DATA.EVENT_TYPE, "source": "s", "subject": subject,
                        "time": datetime(2026, 1, 1, tzinfo=UTC), "data": DATA,
                        "correlationid": "c", "causationid": causationid, "partitionkey": "k",
                        "extensions": extensions}.items():
        object.__setattr__(bare, name, value)
    if plain_optionals(subject, causationid, extensions, names):
        assert envelope_problems(bare) == []
        assert plain_optionals(subject, causationid, extensions)
    elif names is None:
        assert envelope_problems(bare) != []


def test_a_plain_valid_envelope_is_built() -> None:
    env = Envelope(id="e", type=DATA.EVENT_TYPE, source="s", time=datetime(2026, 1, 1, tzinfo=UTC),
                   data=DATA, correlationid="c", partitionkey="k",
                   extensions={"traceparent": "00-ab"})
    assert envelope_problems(env) == []
