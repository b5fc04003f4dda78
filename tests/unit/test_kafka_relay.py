"""The gate's relay: broker addresses rewritten in the responses that carry them
(every version Tansu answers), everything else relayed byte for byte whatever the
chunking."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct

import pytest
from aiokafka.protocol.coordination import FindCoordinatorResponse_v0, FindCoordinatorResponse_v1
from aiokafka.protocol.metadata import (
    MetadataResponse_v0,
    MetadataResponse_v1,
    MetadataResponse_v2,
    MetadataResponse_v3,
    MetadataResponse_v5,
)

from toolexec.kafka_addresses import (
    DESCRIBE_CLUSTER,
    FIND_COORDINATOR,
    METADATA,
    rewrite_response,
)
from toolexec.kafka_relay import (
    REQUEST_HEAD,
    RESPONSE_HEAD,
    FrameScanner,
    ProduceBell,
    ProtocolError,
    read_news,
)

ORIGIN = ("127.0.0.1", 40001)
PUBLIC = ("127.0.0.1", 9092)
OTHER = ("10.0.0.7", 40001)
CORRELATION = 77


def _frame(body: bytes, *, flexible: bool = False) -> bytes:
    header = struct.pack(">i", CORRELATION) + (b"\x00" if flexible else b"")
    return struct.pack(">i", len(header) + len(body)) + header + body


def _rewrite(frame: bytes, api_key: int, version: int) -> bytes:
    return rewrite_response(frame, api_key, version, origin=ORIGIN, public=PUBLIC)


TOPICS_V0 = [(0, "orders", [(0, 0, 111, [111], [111])])]


def _metadata_classic(version: int, addresses: list[tuple[str, int]]) -> bytes:
    brokers = [(111 + i, host, port) for i, (host, port) in enumerate(addresses)]
    if version == 0:
        return MetadataResponse_v0(brokers, TOPICS_V0).encode()
    racked = [(*b, None) for b in brokers]
    topics = [(0, "orders", False, [(0, 0, 111, [111], [111])])]
    if version == 1:
        return MetadataResponse_v1(racked, 111, topics).encode()
    if version == 2:
        return MetadataResponse_v2(racked, "cluster", 111, topics).encode()
    if version in (3, 4):
        return MetadataResponse_v3(0, racked, "cluster", 111, topics).encode()
    return MetadataResponse_v5(
        0, racked, "cluster", 111,
        [(0, "orders", False, [(0, 0, 111, [111], [111], [])])]).encode()


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 5])
def test_metadata_classic_versions_name_the_relay_for_the_origin_only(version: int) -> None:
    before = _frame(_metadata_classic(version, [ORIGIN, OTHER]))
    expected = _frame(_metadata_classic(version, [PUBLIC, OTHER]))
    assert _rewrite(before, METADATA, version) == expected


@pytest.mark.parametrize("version", [0, 1])
def test_find_coordinator_classic_versions(version: int) -> None:
    def encode(host: str, port: int) -> bytes:
        if version == 0:
            return FindCoordinatorResponse_v0(0, 111, host, port).encode()
        return FindCoordinatorResponse_v1(0, 0, None, 111, host, port).encode()

    assert _rewrite(_frame(encode(*ORIGIN)), FIND_COORDINATOR, version) == _frame(
        encode(*PUBLIC))


# -- flexible versions, encoded here by hand (aiokafka stops before them) --------------

def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes([*out, n])


def _cstr(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    raw = text.encode()
    return _uvarint(len(raw) + 1) + raw


def _carray(items: list[bytes]) -> bytes:
    return _uvarint(len(items) + 1) + b"".join(items)


TAGS = b"\x01\x05\x02ab"  # one tagged field (tag 5, two bytes): skipped, kept
NO_TAGS = b"\x00"


def _i32(n: int) -> bytes:
    return struct.pack(">i", n)


def _metadata_flexible(address: tuple[str, int]) -> bytes:
    broker = _i32(111) + _cstr(address[0]) + _i32(address[1]) + _cstr(None) + TAGS
    topics = _carray([b"\x00\x00" + _cstr("orders") + b"\x00" * 16 + b"\x00" + _carray([])
                      + _i32(-2147483648) + NO_TAGS])
    return (_i32(0) + _carray([broker, broker]) + _cstr("cluster") + _i32(111) + topics
            + NO_TAGS)


@pytest.mark.parametrize("version", [9, 10, 11, 12])
def test_metadata_flexible_versions(version: int) -> None:
    before = _frame(_metadata_flexible(ORIGIN), flexible=True)
    assert _rewrite(before, METADATA, version) == _frame(_metadata_flexible(PUBLIC),
                                                         flexible=True)


def _find_coordinator_v3(address: tuple[str, int]) -> bytes:
    return (_i32(0) + b"\x00\x00" + _cstr(None) + _i32(111) + _cstr(address[0])
            + _i32(address[1]) + NO_TAGS)


def _find_coordinator_v4(address: tuple[str, int]) -> bytes:
    entry = (_cstr("group-a") + _i32(111) + _cstr(address[0]) + _i32(address[1])
             + b"\x00\x00" + _cstr(None) + TAGS)
    failed = _cstr("group-b") + _i32(-1) + _cstr("") + _i32(-1) + b"\x00\x0f" + _cstr("x") + NO_TAGS
    return _i32(0) + _carray([entry, failed, entry]) + NO_TAGS


def test_find_coordinator_flexible_versions() -> None:
    assert _rewrite(_frame(_find_coordinator_v3(ORIGIN), flexible=True), FIND_COORDINATOR,
                    3) == _frame(_find_coordinator_v3(PUBLIC), flexible=True)
    for version in (4, 5, 6):
        assert _rewrite(_frame(_find_coordinator_v4(ORIGIN), flexible=True), FIND_COORDINATOR,
                        version) == _frame(_find_coordinator_v4(PUBLIC), flexible=True)


@pytest.mark.parametrize("version", [0, 1])
def test_describe_cluster(version: int) -> None:
    def encode(address: tuple[str, int]) -> bytes:
        broker = _i32(111) + _cstr(address[0]) + _i32(address[1]) + _cstr("r1") + NO_TAGS
        return (_i32(0) + b"\x00\x00" + _cstr(None) + (b"\x01" if version else b"")
                + _cstr("cluster") + _i32(111) + _carray([broker]) + _i32(0) + NO_TAGS)

    assert _rewrite(_frame(encode(ORIGIN), flexible=True), DESCRIBE_CLUSTER,
                    version) == _frame(encode(PUBLIC), flexible=True)


def test_a_host_of_another_length_changes_the_frame_size() -> None:
    before = _frame(_metadata_classic(1, [ORIGIN]))
    after = rewrite_response(before, METADATA, 1, origin=ORIGIN, public=("localhost", 1))
    assert after == _frame(_metadata_classic(1, [("localhost", 1)]))
    assert len(after) == len(before) + len("localhost") - len(ORIGIN[0])


def test_what_cannot_be_read_or_names_no_origin_passes_unchanged() -> None:
    frame = _frame(_metadata_classic(1, [ORIGIN]))
    assert _rewrite(frame[:16], METADATA, 1) == frame[:16]  # cut inside the brokers
    assert _rewrite(frame, METADATA, 13) == frame  # a version it does not know
    assert _rewrite(frame, 1, 1) == frame  # not an address-carrying response
    other = _frame(_metadata_classic(1, [OTHER]))
    assert _rewrite(other, METADATA, 1) == other


# -- framing -------------------------------------------------------------------------

def _request(api_key: int, correlation: int, payload: bytes) -> bytes:
    body = struct.pack(">hhi", api_key, 1, correlation) + b"\x00\x02id" + payload
    return struct.pack(">i", len(body)) + body


def _response(correlation: int, payload: bytes) -> bytes:
    body = struct.pack(">i", correlation) + payload
    return struct.pack(">i", len(body)) + body


def _scan(scanner: FrameScanner, data: bytes, cuts: list[int]) -> bytes:
    bounds = [0, *cuts, len(data)]
    return b"".join(scanner.feed(data[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))


def test_frames_pass_whole_whatever_the_chunks_and_held_ones_are_transformed() -> None:
    stream = (_response(1, b"a" * 50) + _response(2, b"rewrite me") + _response(3, b"")
              + _response(2, b"again"))
    expected = (_response(1, b"a" * 50) + b"<" + _response(2, b"rewrite me") + b">"
                + _response(3, b"") + b"<" + _response(2, b"again") + b">")
    for cut in range(1, len(stream)):
        for second in (cut + 1, cut + 7, len(stream) - 1):
            cuts = sorted({cut, min(second, len(stream))})
            scanner = FrameScanner(RESPONSE_HEAD, lambda head: head[4:8] == _i32(2),
                                   lambda frame: b"<" + frame + b">")
            assert _scan(scanner, stream, cuts) == expected


def test_requests_are_seen_head_first_and_passed_on_unchanged() -> None:
    seen: list[tuple[int, int]] = []

    def note(head: bytes) -> bool:
        seen.append(struct.unpack(">hxxi", head[4:12]))
        return False

    stream = _request(3, 10, b"") + _request(0, 11, b"x" * 1000) + _request(10, 12, b"g")
    scanner = FrameScanner(REQUEST_HEAD, note, bytes)
    assert _scan(scanner, stream, [5, 13, 500]) == stream
    assert seen == [(3, 10), (0, 11), (10, 12)]


def test_a_frame_shorter_than_its_header_is_refused() -> None:
    scanner = FrameScanner(RESPONSE_HEAD, lambda head: False, bytes)
    with pytest.raises(ProtocolError):
        scanner.feed(struct.pack(">i", 2) + b"\x00\x00\x00\x00")


async def test_the_produce_bell_tells_each_turn_of_the_loop_which_partitions() -> None:
    reader, writer = os.pipe()
    try:
        bell = ProduceBell(writer)
        for partition in (0, 1, 0, 2, 1):  # five acknowledgements in one turn of the loop
            bell.ring(frozenset({("orders", partition)}))
        await asyncio.sleep(0)
        first = _read_all(reader)
        bell.ring(frozenset({("audit", 3)}))  # and one in the next
        await asyncio.sleep(0)
        second = _read_all(reader)
    finally:
        os.close(reader)
        os.close(writer)
    assert first.count(b"\n") == 3  # one write: a line per partition
    assert read_news(first) == ({("orders", 0), ("orders", 1), ("orders", 2)}, False)
    assert read_news(second) == ({("audit", 3)}, False)


async def test_a_produce_whose_partitions_were_not_read_is_news_of_everything() -> None:
    reader, writer = os.pipe()
    try:
        bell = ProduceBell(writer)
        bell.ring(frozenset({("orders", 0)}))
        bell.ring(None)
        await asyncio.sleep(0)
        assert read_news(_read_all(reader)) == (set(), True)
    finally:
        os.close(reader)
        os.close(writer)


def test_news_lines_that_do_not_parse_are_news_of_everything() -> None:
    assert read_news(b"0 orders\nx y\n") == ({("orders", 0)}, True)
    assert read_news(b"") == (set(), False)


async def test_a_produce_bell_whose_reader_is_gone_falls_silent() -> None:
    reader, writer = os.pipe()
    bell = ProduceBell(writer)
    os.close(reader)
    bell.ring(frozenset({("orders", 0)}))
    await asyncio.sleep(0)  # EPIPE (SIGPIPE is ignored under Python): no exception
    assert bell.fd is None
    bell.ring(frozenset({("orders", 0)}))
    await asyncio.sleep(0)


async def test_news_a_full_pipe_cannot_take_is_told_as_everything_once_it_can() -> None:
    reader, writer = os.pipe()
    try:
        bell = ProduceBell(writer)
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(writer, b"x" * 4096)
        bell.ring(frozenset({("orders", 0)}))
        await asyncio.sleep(0)  # the pipe is full: kept
        os.set_blocking(reader, False)
        with contextlib.suppress(BlockingIOError):
            while os.read(reader, 65536):
                pass
        bell.ring(frozenset({("orders", 1)}))
        await asyncio.sleep(0)
        assert read_news(_read_all(reader)) == (set(), True)
    finally:
        os.close(reader)
        os.close(writer)


def _read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return b""


async def test_a_topic_name_no_broker_takes_cannot_add_news_of_its_own() -> None:
    reader, writer = os.pipe()
    try:
        bell = ProduceBell(writer)
        bell.ring(frozenset({("x\n7 toolexec.requests", 0)}))  # a hostile produce request
        await asyncio.sleep(0)
        assert read_news(_read_all(reader)) == (set(), True)
    finally:
        os.close(reader)
        os.close(writer)
