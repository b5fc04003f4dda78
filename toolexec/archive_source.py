"""The projection runner's access to the embedded log's archive (the `ArchivedLog` port).

Retention leaves a partition's oldest records out of the embedded broker (they stay in
the archive); a read model rebuilt or started afresh reads those from here, and the
rest from the broker. Which offsets the broker no longer holds is what its supervisor
published in its state file (`retained_from`, per partition) when it last restored.
Read-only: the supervisor is the only writer of the archive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolexec.broker_control import archive_dir, read_state, state_path
from toolexec.log_archive import ArchivedRecord, PartitionArchive, Skip


@dataclass
class _Cursor:
    entries: Any  # the partition's entry iterator
    next_offset: int


@dataclass
class EmbeddedArchive:
    """Archived records of the state directory's embedded log."""

    state_dir: Path
    _parts: dict[tuple[str, int], PartitionArchive] = field(default_factory=dict)
    _cursors: dict[tuple[str, int], _Cursor] = field(default_factory=dict)
    _stamp: int | None = None
    _retained_cache: dict[str, int] = field(default_factory=dict)
    _state_file: Path | None = None

    def retained_from(self, topic: str, partition: int) -> int:
        """First offset the broker holds; the records before it are only archived."""
        return int(self._retained().get(f"{topic}/{partition}", 0))

    def _retained(self) -> dict[str, int]:
        # asked for every partition before every batch, idle polls included: one stat
        # of the state file (its path resolved once), read again only when it changed
        if self._state_file is None:
            self._state_file = state_path(self.state_dir)
        try:
            stamp = self._state_file.stat().st_mtime_ns
        except OSError:
            return {}
        if stamp != self._stamp:
            state = read_state(self.state_dir)
            self._retained_cache = dict((state.data.get("retained_from") or {})
                                        if state is not None else {})
            self._stamp = stamp
        return self._retained_cache

    def read(self, topic: str, partition: int, start: int, end: int,
             limit: int) -> list[ArchivedRecord]:
        """Up to `limit` archived records with offsets in [start, end), in order."""
        key = (topic, partition)
        cursor = self._cursors.get(key)
        if cursor is None or cursor.next_offset != start:
            part = self._parts.get(key)
            if part is None:
                directory = archive_dir(self.state_dir) / "topics" / topic / str(partition)
                part = self._parts[key] = PartitionArchive(directory, read_only=True)
            cursor = self._cursors[key] = _Cursor(part.read(start), start)
        records: list[ArchivedRecord] = []
        for entry in cursor.entries:
            if isinstance(entry, Skip):
                continue
            if entry.offset >= end:
                self._cursors.pop(key, None)  # this entry is consumed: start over next time
                break
            records.append(entry)
            cursor.next_offset = entry.offset + 1
            if len(records) >= limit:
                break
        else:
            self._cursors.pop(key, None)
        return records

    def record_at(self, topic: str, partition: int, offset: int) -> ArchivedRecord | None:
        """The archived record at exactly `offset`, if any."""
        found = self.read(topic, partition, offset, offset + 1, 1)
        self._cursors.pop((topic, partition), None)
        return found[0] if found and found[0].offset == offset else None
