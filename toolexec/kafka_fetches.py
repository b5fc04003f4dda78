"""What the relay reads in fetches and produces, to answer a waiting fetch when
records arrive (`toolexec.kafka_relay`).

Tansu holds every fetch for its full `max_wait_ms` even when records arrive meanwhile
(and one of 1 ms for 1.5-2.5 ms), answers a fetch of 1 ms at once when records are
there, and one of no wait without reading the log. So the relay asks Tansu with 1 ms
only when records may be there: it knows each partition's end from the fetch answers
it relays (their high watermarks) until a produce to it is acknowledged.

Read here: a Fetch request's wait, minimum bytes, session and partitions with their
offsets, and its wait rewritten (classic versions 0-11: the ones aiokafka,
kafka-python and Tansu speak); whether a Fetch response (0-11) carries any record or
error, and its high watermarks; the partitions and acks of a Produce request (0-11,
flexible from 9). Anything else is not read.

So that every client fetches in a version read here, the relay caps the Fetch version
an ApiVersions response (18) offers at 11 (`cap_fetch_version`): librdkafka, which
would take Tansu's flexible versions (12+), then fetches in 11 like the others, and
its waiting fetches are held and woken too.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from toolexec.kafka_wire import Malformed, Reader, request_body

PRODUCE = 0
FETCH = 1
API_VERSIONS = 18
API_VERSIONS_FLEXIBLE_FROM = 3
LAST_CLASSIC_FETCH = 11
LAST_PRODUCE = 11
PRODUCE_FLEXIBLE_FROM = 9

Place = tuple[str, int]
"""(topic, partition)"""


@dataclass(frozen=True)
class FetchWait:
    """A classic Fetch request a relay may hold: how long the client waits and for
    which partitions."""

    max_wait_ms: int
    min_bytes: int
    offsets: dict[Place, int]
    """The offset asked for in each partition."""
    wait_at: int
    """Offset of max_wait_ms in the frame."""
    in_session: bool
    """Part of an incremental fetch session (KIP-227): asked as it came, never again."""
    options: bytes
    """The request's fields between its wait and its partitions (minimum and maximum
    bytes, isolation level, session)."""

    @property
    def key(self) -> tuple[bytes, tuple[tuple[Place, int], ...]]:
        """What the broker's answer depends on, whatever the correlation id, the wait
        and the order of the partitions (aiokafka shuffles them)."""
        return self.options, tuple(sorted(self.offsets.items()))

    def with_wait(self, frame: bytes, wait_ms: int) -> bytes:
        """`frame` with its max_wait_ms replaced."""
        return frame[:self.wait_at] + struct.pack(">i", wait_ms) + frame[self.wait_at + 4:]


def read_fetch(frame: bytes, version: int) -> FetchWait | None:
    """The wait and partitions of a Fetch request `frame` (size included); None for a
    version not read here or a frame that does not parse."""
    if not 0 <= version <= LAST_CLASSIC_FETCH:
        return None
    try:
        r = request_body(frame, flexible=False)
        r.skip(4)  # replica_id
        wait_at = r.pos
        max_wait, min_bytes = r.int32(), r.int32()
        if version >= 3:
            r.skip(4)  # max_bytes
        if version >= 4:
            r.skip(1)  # isolation_level
        in_session = False
        if version >= 7:
            session_id, epoch = r.int32(), r.int32()
            in_session = session_id != 0 or epoch != -1
        options = frame[wait_at + 4:r.pos]
        offsets: dict[Place, int] = {}
        for _ in range(r.array_length()):
            topic = r.string() or ""
            for _ in range(r.array_length()):
                partition = r.int32()
                if version >= 9:
                    r.skip(4)  # current_leader_epoch
                offsets[(topic, partition)] = r.int64()
                r.skip((8 if version >= 5 else 0) + 4)  # log_start_offset, max_bytes
    except Malformed:
        return None
    return FetchWait(max_wait, min_bytes, offsets, wait_at, in_session, options)


@dataclass(frozen=True)
class FetchAnswer:
    """What a Fetch response says: whether it carries anything (records or an error)
    and the log end (high watermark) of each partition answered without error."""

    found: bool
    ends: dict[Place, int]


def read_fetch_answer(frame: bytes, version: int) -> FetchAnswer | None:
    """What a Fetch response `frame` (size included, classic versions) says; None when
    it cannot be read."""
    if not 0 <= version <= LAST_CLASSIC_FETCH:
        return None
    r = Reader(frame, pos=4 + 4)  # size, correlation_id
    found = False
    ends: dict[Place, int] = {}
    try:
        if version >= 1:
            r.skip(4)  # throttle_time_ms
        if version >= 7:
            found = r.int16() != 0
            r.skip(4)  # session_id
        for _ in range(r.array_length()):
            topic = r.string() or ""
            for _ in range(r.array_length()):
                partition = r.int32()
                error = r.int16()
                end = r.int64()
                if error:
                    found = True
                else:
                    ends[(topic, partition)] = end
                r.skip((8 if version >= 4 else 0) + (8 if version >= 5 else 0))
                if version >= 4:
                    aborted = r.int32()
                    if aborted > 0:
                        r.skip(16 * aborted)
                if version >= 11:
                    r.skip(4)  # preferred_read_replica
                if r.bytes_length() > 0:
                    found = True
        if r.pos != len(frame):
            return None
    except Malformed:
        return None
    return FetchAnswer(found, ends)


@dataclass(frozen=True)
class Produced:
    """The partitions a Produce request writes to, and whether it is acknowledged."""

    places: frozenset[Place]
    acks: int


def read_produce(frame: bytes, version: int) -> Produced | None:
    """The partitions of a Produce request `frame` (size included); None when it
    cannot be read (the relay then wakes every waiting fetch)."""
    if not 0 <= version <= LAST_PRODUCE:
        return None
    try:
        r = request_body(frame, flexible=version >= PRODUCE_FLEXIBLE_FROM)
        if version >= 3:
            r.string()  # transactional_id
        acks = r.int16()
        r.skip(4)  # timeout_ms
        places: set[Place] = set()
        for _ in range(r.array_length()):
            topic = r.string() or ""
            for _ in range(r.array_length()):
                places.add((topic, r.int32()))
                r.bytes_length()  # records
                r.tagged_fields()
            r.tagged_fields()
    except Malformed:
        return None
    return Produced(frozenset(places), acks)


def cap_fetch_version(frame: bytes, version: int) -> bytes:
    """ApiVersions response `frame` (size included; its header is v0 in every version)
    with Fetch's max version lowered to `LAST_CLASSIC_FETCH`; unchanged when it offers
    no more than that, or cannot be read."""
    r = Reader(frame, compact=version >= API_VERSIONS_FLEXIBLE_FROM, pos=4 + 4)
    try:
        if r.int16() != 0:  # an error (an unsupported version is answered in v0)
            return frame
        for _ in range(r.array_length()):
            api_key, lowest = r.int16(), r.int16()
            highest_at = r.pos
            highest = r.int16()
            r.tagged_fields()
            if api_key == FETCH:
                if lowest > LAST_CLASSIC_FETCH or highest <= LAST_CLASSIC_FETCH:
                    return frame
                return b"".join((frame[:highest_at], struct.pack(">h", LAST_CLASSIC_FETCH),
                                 frame[highest_at + 2:]))
    except Malformed:
        return frame
    return frame
