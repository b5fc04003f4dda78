"""A planned compaction of the embedded broker never drops a written record: behind its
gate, an archive that cannot catch up in time postpones it (toolexec.broker_supervisor)."""

from __future__ import annotations

import time
from pathlib import Path

from toolexec import broker_supervisor
from toolexec.broker_supervisor import COMPACT, Supervisor
from toolexec.settings import Settings


class Gate:
    """What the supervisor uses of a BrokerGate: closed, then perhaps opened again."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.pid = 4242

    def close(self) -> None:
        self.calls.append("close")

    async def open(self) -> None:
        self.calls.append("open")


class Archiver:
    """What the supervisor uses of a LogArchiver, its drain's answer chosen."""

    def __init__(self, caught_up: bool, archived_records: int = 60_000) -> None:
        self.caught_up = caught_up
        self.archived_records = archived_records
        self.last_archived_at = time.monotonic() - 60  # quiet: a compaction is due
        self.observed_high = {("toolexec.requests", 0): 12_000}
        self.drains = 0
        self.following = True

    async def drain(self, timeout: float) -> bool:
        self.drains += 1
        self.following = False  # a drain takes over from the background loop
        return self.caught_up

    def follow(self) -> None:
        self.following = True

    def lag(self) -> dict[tuple[str, int], int]:
        return {} if self.caught_up else {("toolexec.requests", 0): 900}


OVERDUE = 200_000  # four times the threshold: due even while the archive lags


def supervisor(tmp_path: Path) -> Supervisor:
    settings = Settings(state_dir=tmp_path, broker_compact_after_records=50_000)
    return Supervisor(settings, tmp_path, gated=True, port=None)


async def test_an_archive_that_cannot_catch_up_postpones_the_compaction(
        tmp_path: Path) -> None:
    serving, gate = supervisor(tmp_path), Gate()
    archiver = Archiver(caught_up=False, archived_records=OVERDUE)
    assert serving._compaction_due(archiver)  # noqa: SLF001
    assert await serving._compact(gate, archiver) is None  # noqa: SLF001 - keep serving
    assert gate.calls == ["close", "open"]  # writers were let in again
    assert archiver.following  # and what they write is archived again
    assert not serving._compaction_due(archiver)  # noqa: SLF001 - not again at once


async def test_a_postponed_compaction_is_tried_again_later(tmp_path: Path,
                                                           monkeypatch) -> None:
    serving, archiver = supervisor(tmp_path), Archiver(caught_up=False, archived_records=OVERDUE)
    await serving._compact(Gate(), archiver)  # noqa: SLF001
    later = time.monotonic() + broker_supervisor.COMPACT_RETRY_SECONDS + 1
    monkeypatch.setattr(broker_supervisor.time, "monotonic", lambda: later)
    assert serving._compaction_due(archiver)  # noqa: SLF001


async def test_an_archive_that_caught_up_restarts_the_broker_cleanly(tmp_path: Path) -> None:
    serving, gate = supervisor(tmp_path), Gate()
    assert await serving._compact(gate, Archiver(caught_up=True)) == COMPACT  # noqa: SLF001
    assert gate.calls == ["close"]
    assert serving._compacted_clean  # noqa: SLF001 - no offset gap on the restart


def test_a_quiet_archive_with_nothing_left_to_archive_is_a_moment_to_compact(
        tmp_path: Path) -> None:
    assert supervisor(tmp_path)._compaction_due(Archiver(caught_up=True))  # noqa: SLF001


def test_an_archiver_stalled_behind_the_broker_is_not_a_quiet_moment(tmp_path: Path) -> None:
    serving, stalled = supervisor(tmp_path), Archiver(caught_up=False)
    assert not serving._compaction_due(stalled)  # noqa: SLF001 - nothing archived, 900 behind
    stalled.archived_records = OVERDUE
    assert serving._compaction_due(stalled)  # noqa: SLF001
