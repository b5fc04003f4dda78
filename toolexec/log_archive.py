"""The on-disk archive of the embedded log: every record, in order, with checksums.

Layout under the archive root (`<state_dir>/log/`):

```
identity.json                 cluster id of this log, format version, creation time
topics.json                   topic -> partition count (topics are discovered, not fixed)
groups.json                   consumer group -> topic -> partition -> committed offset,
                              and when each group's commits last changed
topics/<topic>/<partition>/<first offset, 20 digits>.seg   append-only segments
```

A segment starts with an 8-byte header (`SEGMENT_MAGIC`) and holds frames:
`length u32 | crc32 u32 | kind u8 | payload`, the CRC covering kind and payload.
A record frame carries offset, timestamp, timestamp type, key, value and headers
(null key / value / header values kept apart from empty ones); a skip frame says
that the log continues at a higher offset (offsets in between were lost with a
broker that died before they were archived, and are never handed out again).

Appends are single `write` calls; `sync()` makes them durable according to the
fsync policy (`always`: fsync before a record counts as archived; `never`: the
operating system writes them back, which survives process crashes but not a
machine stop). On open, a torn frame at the very end of a partition's last
segment (a write cut short by a crash) is cut off and reported; a bad frame
anywhere else raises `ArchiveCorrupt` naming the file and position.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from bisect import bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog

log = structlog.get_logger(__name__)

FORMAT_VERSION = 1
SEGMENT_MAGIC = b"TXLOG\x00\x01\n"
SEGMENT_BYTES = 64 * 1024 * 1024
"""A partition rolls to a new segment file past this size."""

KIND_RECORD = 1
KIND_SKIP = 2
_FRAME_HEAD = struct.Struct(">II")  # payload length (incl. kind), crc32
_RECORD_HEAD = struct.Struct(">qqb")  # offset, timestamp, timestamp type
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_Q = struct.Struct(">q")
_NULL = -1

FsyncPolicy = Literal["always", "never"]
Header = tuple[str, bytes | None]


class ArchiveCorrupt(RuntimeError):
    """A frame of the archive fails its checksum or cannot be decoded (not a torn tail)."""


@dataclass(frozen=True, slots=True)
class ArchivedRecord:
    """One Kafka record as archived: everything a consumer could observe of it."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp_type: int = 0


@dataclass(frozen=True, slots=True)
class Skip:
    """The log continues at `next_offset`; the offsets before it were never archived."""

    next_offset: int


Entry = ArchivedRecord | Skip


# --- frames -------------------------------------------------------------------------------

def _put_bytes(parts: list[bytes], data: bytes | None) -> None:
    if data is None:
        parts.append(_I32.pack(_NULL))
    else:
        parts.append(_I32.pack(len(data)))
        parts.append(data)


def encode_entry(entry: Entry) -> bytes:
    """One frame (head, kind and payload) for `entry`."""
    if isinstance(entry, Skip):
        body = bytes([KIND_SKIP]) + _Q.pack(entry.next_offset)
    else:
        parts = [bytes([KIND_RECORD]),
                 _RECORD_HEAD.pack(entry.offset, entry.timestamp, entry.timestamp_type)]
        _put_bytes(parts, entry.key)
        _put_bytes(parts, entry.value)
        parts.append(_U16.pack(len(entry.headers)))
        for name, value in entry.headers:
            encoded = name.encode("utf-8")
            parts.append(_U16.pack(len(encoded)))
            parts.append(encoded)
            _put_bytes(parts, value)
        body = b"".join(parts)
    return _FRAME_HEAD.pack(len(body), zlib.crc32(body)) + body


class _Cursor:
    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.at = 0

    def take(self, size: int) -> bytes:
        if size < 0 or self.at + size > len(self.data):
            raise ValueError("frame shorter than its fields")
        chunk = bytes(self.data[self.at:self.at + size])
        self.at += size
        return chunk

    def unpack(self, layout: struct.Struct) -> tuple[Any, ...]:
        return layout.unpack(self.take(layout.size))

    def blob(self) -> bytes | None:
        (size,) = self.unpack(_I32)
        return None if size == _NULL else self.take(size)


def decode_body(body: memoryview) -> Entry:
    """The entry of one frame's checked body (kind and payload)."""
    cursor = _Cursor(body)
    kind = cursor.take(1)[0]
    if kind == KIND_SKIP:
        (next_offset,) = cursor.unpack(_Q)
        entry: Entry = Skip(next_offset)
    elif kind == KIND_RECORD:
        offset, timestamp, timestamp_type = cursor.unpack(_RECORD_HEAD)
        key = cursor.blob()
        value = cursor.blob()
        (count,) = cursor.unpack(_U16)
        headers = []
        for _ in range(count):
            (size,) = cursor.unpack(_U16)
            headers.append((cursor.take(size).decode("utf-8"), cursor.blob()))
        entry = ArchivedRecord(offset, timestamp, key, value, tuple(headers), timestamp_type)
    else:
        raise ValueError(f"unknown frame kind {kind}")
    if cursor.at != len(body):
        raise ValueError("frame longer than its fields")
    return entry


@dataclass(frozen=True, slots=True)
class ScannedFrame:
    entry: Entry
    position: int
    end: int


def first_record(data: bytes, path: Path) -> ArchivedRecord | None:
    """The first record of a segment's bytes, decoding no further than it."""
    view = memoryview(data)
    at = len(SEGMENT_MAGIC) if data.startswith(SEGMENT_MAGIC) else len(data)
    while at + _FRAME_HEAD.size <= len(data):
        size, crc = _FRAME_HEAD.unpack_from(data, at)
        end = at + _FRAME_HEAD.size + size
        body = view[at + _FRAME_HEAD.size:end]
        if end > len(data) or zlib.crc32(body) != crc:
            scan_frames(data, path)  # raises ArchiveCorrupt unless it is a torn tail
            return None
        if body[0] == KIND_RECORD:
            entry = decode_body(body)
            assert isinstance(entry, ArchivedRecord)
            return entry
        at = end
    return None


def scan_frames(data: bytes, path: Path) -> tuple[list[ScannedFrame], int, str | None]:
    """Every whole, checked frame of a segment's bytes, the length of its good prefix,
    and why the rest (if any) was not read: a torn tail. A bad frame followed by more
    data is corruption, not a torn tail, and raises `ArchiveCorrupt`."""
    if not data.startswith(SEGMENT_MAGIC):
        if len(data) < len(SEGMENT_MAGIC) and SEGMENT_MAGIC.startswith(data):
            return [], 0, "segment header cut short"
        raise ArchiveCorrupt(f"{path}: not an archive segment (bad header)")
    view = memoryview(data)
    frames: list[ScannedFrame] = []
    at = len(SEGMENT_MAGIC)
    while at < len(data):
        if at + _FRAME_HEAD.size > len(data):
            return frames, at, "frame head cut short"
        size, crc = _FRAME_HEAD.unpack_from(data, at)
        end = at + _FRAME_HEAD.size + size
        if end > len(data):
            return frames, at, "frame cut short"
        body = view[at + _FRAME_HEAD.size:end]
        try:
            if zlib.crc32(body) != crc:
                raise ValueError("checksum mismatch")
            entry = decode_body(body)
        except ValueError as error:
            if end == len(data):  # the last frame: a write the crash cut short
                return frames, at, f"last frame unreadable ({error})"
            raise ArchiveCorrupt(f"{path}: frame at byte {at} unreadable ({error}); "
                                 "the archive is damaged there") from error
        frames.append(ScannedFrame(entry, at, end))
        at = end
    return frames, at, None


# --- one partition ----------------------------------------------------------------------

def segment_name(first_offset: int) -> str:
    return f"{first_offset:020d}.seg"


class PartitionArchive:
    """The segments of one topic partition: append at the end, read from any offset."""

    def __init__(self, directory: Path, *, fsync: FsyncPolicy = "always",
                 segment_bytes: int = SEGMENT_BYTES, read_only: bool = False) -> None:
        self.directory = directory
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.read_only = read_only
        """A reader in another process than the supervisor's: never cuts a tail (it may
        be a write in progress) and never writes."""
        self.next_offset = 0
        """Offset the next archived record may have (last record + 1, or a skip's)."""
        self.first_offset: int | None = None
        """Offset of the first archived record (None while empty)."""
        self.last_offset: int | None = None
        """Offset of the last archived record (None while empty); skips after it move
        `next_offset` only."""
        self._fd: int | None = None
        self._size = 0
        self._dirty = False
        self._segments: list[int] = []
        if not read_only:
            directory.mkdir(parents=True, exist_ok=True)
        self._open()

    def _open(self) -> None:
        self._segments = self._listed()
        if not self._segments:
            return
        for first in self._segments:  # the first record may sit behind skips
            path = self.directory / segment_name(first)
            record = first_record(path.read_bytes(), path)
            if record is not None:
                self.first_offset = record.offset
                break
        last = self.directory / segment_name(self._segments[-1])
        data = last.read_bytes()
        frames, good, torn = scan_frames(data, last)
        if torn is not None and not self.read_only:
            log.warning("log_archive.torn_tail_cut", file=str(last), kept_bytes=good,
                        dropped_bytes=len(data) - good, reason=torn)
            with last.open("r+b") as handle:
                if good < len(SEGMENT_MAGIC):  # not even the header made it
                    handle.truncate(0)
                    handle.write(SEGMENT_MAGIC)
                else:
                    handle.truncate(good)
                handle.flush()
                os.fsync(handle.fileno())
        # A segment is named after its first entry's offset: the archive reaches at least
        # there even when that entry's write was cut short.
        self.next_offset = self._segments[-1]
        for frame in frames:
            self._advance(frame.entry)
        if self.last_offset is None and self.first_offset is not None:
            for first in reversed(self._segments[:-1]):  # the last segment held skips only
                records = [f.entry for f in self._frames_of(first)
                           if isinstance(f.entry, ArchivedRecord)]
                if records:
                    self.last_offset = records[-1].offset
                    break

    def _listed(self) -> list[int]:
        if not self.directory.exists():
            return []
        return sorted(int(p.name.split(".")[0]) for p in self.directory.glob("*.seg"))

    def _advance(self, entry: Entry) -> None:
        if isinstance(entry, Skip):
            self.next_offset = max(self.next_offset, entry.next_offset)
        else:
            self.next_offset = entry.offset + 1
            self.last_offset = entry.offset
            if self.first_offset is None:
                self.first_offset = entry.offset

    def _frames_of(self, first: int) -> list[ScannedFrame]:
        path = self.directory / segment_name(first)
        frames, _, _ = scan_frames(path.read_bytes(), path)
        return frames

    def append(self, entries: list[Entry]) -> None:
        """Append `entries` (offsets must rise past `next_offset`); durable after `sync()`."""
        if not entries:
            return
        if self.read_only:
            raise ValueError(f"{self.directory}: opened read-only")
        for entry in entries:
            offset = entry.next_offset if isinstance(entry, Skip) else entry.offset
            if offset < self.next_offset:
                raise ValueError(f"{self.directory}: offset {offset} is below the archive's "
                                 f"end {self.next_offset}")
        if self._fd is None or self._size >= self.segment_bytes:
            self._roll(entries[0])
        data = b"".join(encode_entry(e) for e in entries)
        assert self._fd is not None
        written = os.write(self._fd, data)
        while written < len(data):  # a short write (rare, large buffers): write the rest
            written += os.write(self._fd, data[written:])
        self._size += len(data)
        self._dirty = True
        for entry in entries:
            self._advance(entry)

    def _roll(self, first: Entry) -> None:
        """Open the segment to append to: the last one while it has room, else a new
        one named after `first`'s offset."""
        if self._fd is None and self._segments:
            path = self.directory / segment_name(self._segments[-1])
            size = path.stat().st_size
            if size < self.segment_bytes:
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
                self._size = size
                return
        self.sync()
        if self._fd is not None:
            os.close(self._fd)
        start = first.next_offset if isinstance(first, Skip) else first.offset
        path = self.directory / segment_name(start)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o644)
        os.write(self._fd, SEGMENT_MAGIC)
        self._size = len(SEGMENT_MAGIC)
        self._segments.append(start)
        self._dirty = True
        _fsync_directory(self.directory, self.fsync)

    def sync(self) -> None:
        """Make what was appended durable (policy `always`; `never` leaves it to the OS)."""
        if self._dirty and self._fd is not None and self.fsync == "always":
            os.fsync(self._fd)
        self._dirty = False

    def close(self) -> None:
        self.sync()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self, start: int = 0) -> Iterator[Entry]:
        """Every entry whose offset is at or after `start`, in order (skips included).
        Read-only, the segments are listed anew (the writer may have rolled one)."""
        segments = self._listed() if self.read_only else list(self._segments)
        index = max(bisect_right(segments, start) - 1, 0)
        for first in segments[index:]:
            path = self.directory / segment_name(first)
            frames, _, _ = scan_frames(path.read_bytes(), path)
            for frame in frames:
                entry = frame.entry
                offset = entry.next_offset if isinstance(entry, Skip) else entry.offset
                if offset >= start:
                    yield entry


def _fsync_directory(directory: Path, policy: FsyncPolicy) -> None:
    if policy != "always":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- the whole archive ----------------------------------------------------------------------

class LogArchive:
    """Every partition's records, the topics and the consumer groups' committed offsets."""

    def __init__(self, root: Path, *, fsync: FsyncPolicy = "always",
                 segment_bytes: int = SEGMENT_BYTES, read_only: bool = False) -> None:
        self.root = root
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.read_only = read_only
        self._partitions: dict[tuple[str, int], PartitionArchive] = {}
        if not read_only:
            root.mkdir(parents=True, exist_ok=True)

    # identity
    def identity(self) -> dict[str, Any] | None:
        """`{"cluster_id", "format", "created_at"}` of this log, None for a new archive."""
        return _read_json(self.root / "identity.json")

    def create_identity(self, cluster_id: str, created_at: str) -> dict[str, Any]:
        identity = {"cluster_id": cluster_id, "format": FORMAT_VERSION, "created_at": created_at}
        _write_json(self.root / "identity.json", identity, self.fsync)
        return identity

    # topics and groups
    def topics(self) -> dict[str, int]:
        """Topic -> partition count, as discovered on the broker."""
        return {str(k): int(v) for k, v in (_read_json(self.root / "topics.json") or {}).items()}

    def record_topics(self, topics: Mapping[str, int]) -> None:
        _write_json(self.root / "topics.json", dict(sorted(topics.items())), self.fsync)

    def groups(self) -> dict[str, dict[tuple[str, int], int]]:
        """Group -> (topic, partition) -> committed offset, as last archived."""
        stored = (_read_json(self.root / "groups.json") or {}).get("offsets", {})
        return {group: {(topic, int(p)): int(o) for topic, parts in offsets.items()
                        for p, o in parts.items()}
                for group, offsets in stored.items()}

    def group_changes(self) -> dict[str, float]:
        """Group -> when (epoch seconds) its archived commits last changed."""
        stored = (_read_json(self.root / "groups.json") or {}).get("changed_at", {})
        return {str(group): float(at) for group, at in stored.items()}

    def record_groups(self, groups: Mapping[str, Mapping[tuple[str, int], int]], *,
                      now: float = 0.0) -> None:
        """Archive the groups' commits; a group whose commits differ from the archived
        ones is marked changed at `now`."""
        before = self.groups()
        changed = self.group_changes()
        nested: dict[str, dict[str, dict[str, int]]] = {}
        for group, offsets in sorted(groups.items()):
            if dict(offsets) != before.get(group):
                changed[group] = now
            for (topic, partition), offset in sorted(offsets.items()):
                nested.setdefault(group, {}).setdefault(topic, {})[str(partition)] = offset
        _write_json(self.root / "groups.json",
                    {"offsets": nested, "changed_at": {g: changed[g] for g in nested
                                                       if g in changed}}, self.fsync)

    # partitions
    def partition(self, topic: str, partition: int) -> PartitionArchive:
        """The archive of one partition (created empty on first use)."""
        key = (topic, partition)
        if key not in self._partitions:
            directory = self.root / "topics" / topic / str(partition)
            if not self.read_only:
                self._make_below_root(directory)
            self._partitions[key] = PartitionArchive(
                directory, fsync=self.fsync, segment_bytes=self.segment_bytes,
                read_only=self.read_only)
        return self._partitions[key]

    def _make_below_root(self, directory: Path) -> None:
        """Make `directory` and its parents up to the root, never the root itself: an
        archive whose root was deleted (with its state directory) is not made again
        piecemeal (FileNotFoundError instead)."""
        path = self.root
        for part in directory.relative_to(self.root).parts:
            path = path / part
            path.mkdir(exist_ok=True)

    def partitions(self) -> list[tuple[str, int]]:
        """Every (topic, partition) with a directory in the archive or a topic entry."""
        found = {(topic, p) for topic, count in self.topics().items() for p in range(count)}
        base = self.root / "topics"
        if base.exists():
            for topic_dir in base.iterdir():
                for part_dir in topic_dir.iterdir():
                    if part_dir.name.isdigit():
                        found.add((topic_dir.name, int(part_dir.name)))
        return sorted(found)

    def ends(self) -> dict[tuple[str, int], int]:
        """Next offset of every archived partition."""
        return {key: self.partition(*key).next_offset for key in self.partitions()}

    def sync(self) -> None:
        for archive in self._partitions.values():
            archive.sync()

    def close(self) -> None:
        for archive in self._partitions.values():
            archive.close()
        self._partitions.clear()

    def size_bytes(self) -> int:
        """Bytes on disk of every segment."""
        base = self.root / "topics"
        return sum(p.stat().st_size for p in base.rglob("*.seg")) if base.exists() else 0


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def _write_json(path: Path, value: Any, policy: FsyncPolicy) -> None:
    """Replace `path` atomically (write, fsync, rename, fsync the directory)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as handle:
        json.dump(value, handle, indent=1, sort_keys=True)
        handle.flush()
        if policy == "always":
            os.fsync(handle.fileno())
    tmp.replace(path)
    _fsync_directory(path.parent, policy)
