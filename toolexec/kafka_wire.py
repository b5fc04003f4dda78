"""Reading Kafka protocol frames: a cursor over primitive types, classic and flexible
(compact strings and arrays, tagged fields), shared by the relay's parsers
(`toolexec.kafka_addresses`, `toolexec.kafka_fetches`)."""

from __future__ import annotations

import struct


class Malformed(ValueError):
    """A frame is not what its api key and version say."""


class Reader:
    """A cursor over a frame; `compact` reads strings, bytes and arrays in the flexible
    versions' encoding."""

    def __init__(self, data: bytes, *, compact: bool = False, pos: int = 0) -> None:
        self.data = data
        self.pos = pos
        self.compact = compact

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.data):
            raise Malformed("truncated")
        self.pos += n

    def _unpack(self, fmt: str, size: int) -> int:
        start = self.pos
        self.skip(size)
        return int(struct.unpack_from(fmt, self.data, start)[0])

    def int16(self) -> int:
        return self._unpack(">h", 2)

    def int32(self) -> int:
        return self._unpack(">i", 4)

    def int64(self) -> int:
        return self._unpack(">q", 8)

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            if self.pos >= len(self.data) or shift > 28:
                raise Malformed("bad varint")
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def string(self) -> str | None:
        n = self.uvarint() - 1 if self.compact else self.int16()
        if n < 0:
            return None
        start = self.pos
        self.skip(n)
        return self.data[start:self.pos].decode("utf-8", "replace")

    def bytes_length(self) -> int:
        """The length of a nullable bytes field, its bytes skipped (-1: null)."""
        n = self.uvarint() - 1 if self.compact else self.int32()
        if n > 0:
            self.skip(n)
        return n

    def array_length(self) -> int:
        n = self.uvarint() - 1 if self.compact else self.int32()
        return max(n, 0)

    def tagged_fields(self) -> None:
        if self.compact:
            for _ in range(self.uvarint()):
                self.uvarint()
                self.skip(self.uvarint())


def uvarint(value: int) -> bytes:
    """`value` as an unsigned varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def request_body(frame: bytes, *, flexible: bool) -> Reader:
    """A reader at the body of a request `frame` (4-byte size included): past the
    header's api key, version, correlation id, client id (a classic nullable string
    in every header version) and, in flexible versions (header v2), tagged fields."""
    reader = Reader(frame, pos=4 + 8)
    reader.string()
    reader.compact = flexible
    reader.tagged_fields()
    return reader
