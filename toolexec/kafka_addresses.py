"""Rewrite the broker address in the Kafka responses that carry one.

A forwarder in front of a broker must advertise itself, or clients would follow the
broker's own address past it. Three responses name brokers: Metadata (3),
FindCoordinator (10) and DescribeCluster (60). `rewrite_response` replaces every
broker entry equal to `origin` by `public` in one of them and copies the rest of the
frame byte for byte; a response it cannot read is returned unchanged.

Versions covered (Tansu 0.6 answers up to these): Metadata 0-12, FindCoordinator 0-6,
DescribeCluster 0-1. Flexible versions (Metadata 9+, FindCoordinator 3+, every
DescribeCluster) use compact strings/arrays, tagged fields and response header v1.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from toolexec.kafka_wire import Malformed, Reader, uvarint

METADATA = 3
FIND_COORDINATOR = 10
DESCRIBE_CLUSTER = 60
REWRITTEN_KEYS = frozenset({METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER})
MAX_VERSION = {METADATA: 12, FIND_COORDINATOR: 6, DESCRIBE_CLUSTER: 1}

Address = tuple[str, int]


class _Reader(Reader):
    """A cursor over a response body that notes where each broker address is."""

    def __init__(self, data: bytes, *, compact: bool) -> None:
        super().__init__(data, compact=compact)
        self.edits: list[tuple[int, int, int, Address]] = []
        """(host start, host end, port end, (host, port)) of each broker entry."""

    def address(self) -> None:
        """A host then a port (int32): noted for rewriting."""
        start = self.pos
        host = self.string()
        end = self.pos
        port = self.int32()
        self.edits.append((start, end, self.pos, (host or "", port)))


def _metadata(r: _Reader, version: int) -> None:
    if version >= 3:
        r.skip(4)  # throttle_time_ms
    for _ in range(r.array_length()):
        r.skip(4)  # node_id
        r.address()
        if version >= 1:
            r.string()  # rack
        r.tagged_fields()


def _find_coordinator(r: _Reader, version: int) -> None:
    if version >= 1:
        r.skip(4)  # throttle_time_ms
    if version >= 4:
        for _ in range(r.array_length()):
            r.string()  # key
            r.skip(4)  # node_id
            r.address()
            r.skip(2)  # error_code
            r.string()  # error_message
            r.tagged_fields()
        return
    r.skip(2)  # error_code
    if version >= 1:
        r.string()  # error_message
    r.skip(4)  # node_id
    r.address()


def _describe_cluster(r: _Reader, version: int) -> None:
    r.skip(4 + 2)  # throttle_time_ms, error_code
    r.string()  # error_message
    if version >= 1:
        r.skip(1)  # endpoint_type
    r.string()  # cluster_id
    r.skip(4)  # controller_id
    for _ in range(r.array_length()):
        r.skip(4)  # broker_id
        r.address()
        r.string()  # rack
        r.tagged_fields()


_PARSERS: dict[int, tuple[Callable[[_Reader, int], None], int]] = {
    # api key: (parser, first flexible version)
    METADATA: (_metadata, 9),
    FIND_COORDINATOR: (_find_coordinator, 3),
    DESCRIBE_CLUSTER: (_describe_cluster, 0),
}


def _encode(host: str, port: int, *, compact: bool) -> bytes:
    raw = host.encode()
    if compact:
        return uvarint(len(raw) + 1) + raw + struct.pack(">i", port)
    return struct.pack(">h", len(raw)) + raw + struct.pack(">i", port)


def rewrite_response(frame: bytes, api_key: int, api_version: int, *, origin: Address,
                     public: Address) -> bytes:
    """`frame` (4-byte size included) with each broker entry equal to `origin` naming
    `public` instead; unchanged when it names none or cannot be read."""
    parser, flexible_from = _PARSERS.get(api_key, (None, 0))
    if parser is None or api_version > MAX_VERSION[api_key]:
        return frame
    compact = api_version >= flexible_from
    reader = _Reader(frame, compact=compact)
    try:
        reader.skip(4 + 4)  # size, correlation_id
        reader.tagged_fields()  # response header v1 (flexible versions)
        parser(reader, api_version)
    except Malformed:
        return frame
    pieces: list[bytes] = []
    copied = 4
    for start, _end, port_end, address in reader.edits:
        if address != origin:
            continue
        pieces.append(frame[copied:start])
        pieces.append(_encode(*public, compact=compact))
        copied = port_end
    if not pieces:
        return frame
    pieces.append(frame[copied:])
    body = b"".join(pieces)
    return struct.pack(">i", len(body)) + body
