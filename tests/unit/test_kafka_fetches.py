"""What the gate's relay reads in fetches and produces (every classic version), and
how it knows when a waiting fetch may be answered (`Wakeups`)."""

from __future__ import annotations

import asyncio
import struct

import pytest
from aiokafka.protocol import fetch as kfetch
from aiokafka.protocol import produce as kproduce

from toolexec.kafka_fetches import (
    FETCH,
    LAST_CLASSIC_FETCH,
    PRODUCE,
    cap_fetch_version,
    read_fetch,
    read_fetch_answer,
    read_produce,
)
from toolexec.kafka_relay import Wakeups
from toolexec.kafka_wire import uvarint

CORRELATION = 41
A, B = ("facts", 0), ("facts", 3)


def _request(api_key: int, version: int, body: bytes, *, flexible: bool = False) -> bytes:
    client = b"probe"
    header = struct.pack(">hhih", api_key, version, CORRELATION, len(client)) + client
    if flexible:
        header += b"\x00"  # no tagged fields
    return struct.pack(">i", len(header) + len(body)) + header + body


def _fetch_request(version: int, wait: int, offsets: dict[tuple[str, int], int], *,
                   min_bytes: int = 1, session: tuple[int, int] = (0, -1)) -> bytes:
    by_topic: dict[str, list[tuple[int, ...]]] = {}
    for (topic, partition), offset in offsets.items():
        if version >= 9:
            entry: tuple[int, ...] = (partition, -1, offset, -1, 1 << 20)
        elif version >= 5:
            entry = (partition, offset, -1, 1 << 20)
        else:
            entry = (partition, offset, 1 << 20)
        by_topic.setdefault(topic, []).append(entry)
    fields: list[object] = [-1, wait, min_bytes]
    if version >= 3:
        fields.append(1 << 24)
    if version >= 4:
        fields.append(0)
    if version >= 7:
        fields.extend(session)
    fields.append(list(by_topic.items()))
    if version >= 7:
        fields.append([])
    if version >= 11:
        fields.append("")
    struct_class = getattr(kfetch, f"FetchRequest_v{version}")
    return _request(FETCH, version, struct_class(*fields).encode())


def _fetch_answer(version: int, partitions: dict[tuple[str, int], tuple[int, int, bytes]],
                  *, error: int = 0) -> bytes:
    """partitions: place -> (error, high watermark, records)."""
    by_topic: dict[str, list[tuple[object, ...]]] = {}
    for (topic, partition), (code, end, records) in partitions.items():
        entry: list[object] = [partition, code, end]
        if version >= 4:
            entry.append(end)  # last_stable_offset
        if version >= 5:
            entry.append(0)  # log_start_offset
        if version >= 4:
            entry.append([(7, 1)])  # aborted_transactions
        if version >= 11:
            entry.append(-1)
        entry.append(records)
        by_topic.setdefault(topic, []).append(tuple(entry))
    fields: list[object] = []
    if version >= 1:
        fields.append(0)
    if version >= 7:
        fields.extend([error, 0])
    fields.append(list(by_topic.items()))
    body = getattr(kfetch, f"FetchResponse_v{version}")(*fields).encode()
    return struct.pack(">ii", 4 + len(body), CORRELATION) + body


CLASSIC_FETCH = list(range(12))


@pytest.mark.parametrize("version", CLASSIC_FETCH)
def test_a_fetch_request_is_read_in_every_classic_version(version: int) -> None:
    frame = _fetch_request(version, 500, {A: 12, B: 0, ("other", 1): 7}, min_bytes=3)
    fetch = read_fetch(frame, version)
    assert fetch is not None
    assert (fetch.max_wait_ms, fetch.min_bytes, fetch.in_session) == (500, 3, False)
    assert fetch.offsets == {A: 12, B: 0, ("other", 1): 7}
    asked = fetch.with_wait(frame, 1)
    assert len(asked) == len(frame)
    again = read_fetch(asked, version)
    assert again is not None and again.max_wait_ms == 1 and again.offsets == fetch.offsets


@pytest.mark.parametrize("session", [(9, 2), (0, 0), (5, -1)])
def test_a_fetch_in_an_incremental_session_is_marked(session: tuple[int, int]) -> None:
    fetch = read_fetch(_fetch_request(11, 500, {A: 1}, session=session), 11)
    assert fetch is not None and fetch.in_session


def test_a_fetch_not_read_here_is_none() -> None:
    frame = _fetch_request(11, 500, {A: 1})
    assert read_fetch(frame, 12) is None  # flexible versions are relayed as they are
    assert read_fetch(frame[:-30], 11) is None  # cut inside its partitions
    topics_at = len(frame) - (4 + 2 + 5 + 4 + 28 + 4 + 2)  # the topics array's length
    huge = frame[:topics_at] + b"\x00\x00\x7f\xff" + frame[topics_at + 4:]
    assert read_fetch(huge, 11) is None  # more topics than the frame holds


@pytest.mark.parametrize("version", CLASSIC_FETCH)
def test_an_empty_answer_is_read_with_its_ends(version: int) -> None:
    answer = read_fetch_answer(_fetch_answer(version, {A: (0, 12, b""), B: (0, 4, b"")}),
                               version)
    assert answer is not None
    assert not answer.found
    assert answer.ends == {A: 12, B: 4}


@pytest.mark.parametrize("version", CLASSIC_FETCH)
def test_records_or_an_error_are_found(version: int) -> None:
    with_records = _fetch_answer(version, {A: (0, 12, b""), B: (0, 9, b"\x00" * 61)})
    answer = read_fetch_answer(with_records, version)
    assert answer is not None and answer.found and answer.ends == {A: 12, B: 9}
    with_error = _fetch_answer(version, {A: (1, -1, b""), B: (0, 4, b"")})
    answer = read_fetch_answer(with_error, version)
    assert answer is not None and answer.found and answer.ends == {B: 4}
    if version >= 7:
        answer = read_fetch_answer(_fetch_answer(version, {}, error=71), version)
        assert answer is not None and answer.found


def test_an_answer_not_read_here_is_none() -> None:
    frame = _fetch_answer(11, {A: (0, 12, b"")})
    assert read_fetch_answer(frame, 12) is None
    assert read_fetch_answer(frame[:-1], 11) is None
    assert read_fetch_answer(frame + b"\x00", 11) is None


@pytest.mark.parametrize("version", range(9))
def test_a_produce_request_names_its_partitions(version: int) -> None:
    topics = [("facts", [(0, b"\x01" * 30), (3, None)]), ("requests", [(2, b"\x02")])]
    fields: list[object] = [-1, 5000, topics]
    if version >= 3:
        fields.insert(0, None)
    body = getattr(kproduce, f"ProduceRequest_v{version}")(*fields).encode()
    produced = read_produce(_request(PRODUCE, version, body), version)
    assert produced is not None
    assert produced.acks == -1
    assert produced.places == {A, B, ("requests", 2)}


def _compact_string(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    raw = text.encode()
    return uvarint(len(raw) + 1) + raw


@pytest.mark.parametrize("version", [9, 10, 11])
def test_a_flexible_produce_request_names_its_partitions(version: int) -> None:
    records = b"\x05" * 200
    partition = struct.pack(">i", 3) + uvarint(len(records) + 1) + records + b"\x00"
    topic = _compact_string("facts") + uvarint(2) + partition + b"\x00"
    body = _compact_string("tx") + struct.pack(">hi", 1, 5000) + uvarint(2) + topic + b"\x00"
    produced = read_produce(_request(PRODUCE, version, body, flexible=True), version)
    assert produced is not None and produced.acks == 1 and produced.places == {B}


def test_a_produce_not_read_here_is_none() -> None:
    body = kproduce.ProduceRequest_v8(None, 1, 5000, [("facts", [(0, b"x" * 9)])]).encode()
    frame = _request(PRODUCE, 8, body)
    assert read_produce(frame[:-4], 8) is None
    assert read_produce(frame, 12) is None


def test_a_partition_is_at_its_end_until_a_produce_reaches_it() -> None:
    wakeups = Wakeups()
    assert not wakeups.at_end({A: 12})  # nothing known yet
    mark = wakeups.mark([A, B])
    wakeups.learn({A: 12, B: 4}, mark)
    assert wakeups.at_end({A: 12, B: 4})
    assert wakeups.at_end({A: 13})
    assert not wakeups.at_end({A: 11})  # records are there
    wakeups.produced(frozenset({B}))
    assert wakeups.at_end({A: 12})
    assert not wakeups.at_end({A: 12, B: 4})


def test_ends_read_before_a_produce_landed_are_not_kept() -> None:
    wakeups = Wakeups()
    mark = wakeups.mark([A])
    wakeups.produced(frozenset({A}))  # acknowledged while the fetch was on its way
    wakeups.learn({A: 12}, mark)
    assert not wakeups.at_end({A: 12})


def test_a_produce_of_unknown_partitions_ends_what_is_known() -> None:
    wakeups = Wakeups()
    wakeups.learn({A: 12}, wakeups.mark([A]))
    wakeups.produced(None)
    assert not wakeups.at_end({A: 12})


def test_a_waiting_fetch_is_woken_by_a_produce_to_its_partitions_only() -> None:
    async def scenario() -> None:
        wakeups = Wakeups()
        waiter = asyncio.create_task(wakeups.wait(wakeups.mark([A]), 600))
        await asyncio.sleep(0)
        wakeups.produced(frozenset({("facts", 1)}))
        await asyncio.sleep(0)
        assert not waiter.done()
        wakeups.produced(frozenset({A, ("facts", 1)}))
        await asyncio.wait_for(waiter, 60)

        everyone = asyncio.create_task(wakeups.wait(wakeups.mark([B]), 600))
        await asyncio.sleep(0)
        wakeups.produced(None)
        await asyncio.wait_for(everyone, 60)

        stale = wakeups.mark([A])
        wakeups.produced(frozenset({A}))
        await asyncio.wait_for(wakeups.wait(stale, 600), 60)  # at once: it already moved

    asyncio.run(scenario())


def test_a_wait_ends_with_its_time() -> None:
    async def scenario() -> None:
        wakeups = Wakeups()
        await asyncio.wait_for(wakeups.wait(wakeups.mark([A]), 0.01), 60)

    asyncio.run(scenario())


def _api_versions_answer(version: int, ranges: dict[int, tuple[int, int]],
                         error: int = 0) -> bytes:
    """An ApiVersions response (header v0 in every version) offering `ranges`."""
    flexible = version >= 3
    body = struct.pack(">ih", CORRELATION, error)
    body += uvarint(len(ranges) + 1) if flexible else struct.pack(">i", len(ranges))
    for key, (lowest, highest) in ranges.items():
        body += struct.pack(">hhh", key, lowest, highest) + (b"\x00" if flexible else b"")
    if version >= 1:
        body += struct.pack(">i", 0)  # throttle_time_ms
    if flexible:
        body += b"\x00"
    return struct.pack(">i", len(body)) + body


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_api_versions_offer_fetch_only_in_the_versions_read_here(version: int) -> None:
    offered = {PRODUCE: (0, 11), FETCH: (0, 16), 18: (0, 4)}
    capped = cap_fetch_version(_api_versions_answer(version, offered), version)
    assert capped == _api_versions_answer(version, {**offered, FETCH: (0, LAST_CLASSIC_FETCH)})


@pytest.mark.parametrize(("version", "answer"), [
    (3, _api_versions_answer(3, {PRODUCE: (0, 11), FETCH: (0, 11)})),  # nothing above 11
    (3, _api_versions_answer(3, {PRODUCE: (0, 11)})),  # no Fetch
    (3, _api_versions_answer(3, {FETCH: (12, 16)})),  # only flexible versions: theirs
    (0, _api_versions_answer(0, {FETCH: (0, 16)}, error=35)),  # UNSUPPORTED_VERSION
    (3, _api_versions_answer(3, {FETCH: (0, 16)})[:-9]),  # cut short
])
def test_api_versions_that_need_no_cap_or_cannot_be_read_are_unchanged(
        version: int, answer: bytes) -> None:
    assert cap_fetch_version(answer, version) == answer
