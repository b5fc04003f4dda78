"""The embedded broker's supervisor: `python -m toolexec.broker_supervisor --state-dir DIR`.

One per state directory (an exclusive lock on `broker/supervisor.lock`). It

1. opens the archive (`<state_dir>/log/`) and the log's identity (its cluster id,
   created once and reused by every broker of this log);
2. starts Tansu (in memory) and restores the archive into it: same topics, records,
   offsets and consumer groups' commits; a restore that does not match refuses to
   serve (status `failed`) rather than serve another log;
3. archives everything the broker is then given, continuously (`LogArchiver`);
4. restarts Tansu with its log when it dies, behind a closed gate on the same port
   (`BrokerGate`), so reconnecting clients find it only once the restore is done;
5. on SIGTERM closes the gate, archives what is left, stops Tansu and exits;
6. stops Tansu and exits (code 4), writing nothing, once its state directory is
   deleted or replaced under it (the lock file it holds is no longer the one at its
   path): what it would archive has nowhere to go, and another supervisor may serve
   that directory already, with a log of its own.

After a broker died (or a supervisor was killed) the log resumes
`broker_crash_offset_gap` offsets past the highest offset it may have handed out, so
an offset that was acknowledged and lost is never handed out again: consumers whose
position falls into that gap move on to the next record.

Its state file (`broker/broker.json`, see `broker_control`) tells everyone else where
it listens and how it is doing; it logs each change of state once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from toolexec.broker_control import (
    EXIT_ANOTHER_SUPERVISOR,
    EXIT_STATE_GONE,
    archive_dir,
    broker_dir,
    read_state,
    write_state,
)
from toolexec.broker_gate import BrokerGate
from toolexec.embedded_broker import EmbeddedBroker, EmbeddedBrokerError, _tail, free_port
from toolexec.log_archive import ArchiveCorrupt, LogArchive, Skip
from toolexec.log_archiver import LogArchiver
from toolexec.log_restore import RestoreMismatch, RestoreReport, restore, retention_starts
from toolexec.logs import configure_logging
from toolexec.settings import Settings, kafka_client_options

log = structlog.get_logger(__name__)

BACKOFF_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
STABLE_SECONDS = 60.0
"""An incarnation that served this long resets the restart back-off."""
PROGRESS_SECONDS = 1.0
DRAIN_SECONDS = 10.0
EXIT_REFUSED = 1
GROUP_PIN_SECONDS = 24 * 3600.0
"""A consumer group whose commits changed this recently keeps the records it has not
consumed in the broker through retention."""
COMPACT = "compact"
STATE_GONE = "state directory gone"
COMPACT_RETRY_SECONDS = 30.0
"""After a compaction the archive could not catch up with (the gate reopened, nothing
lost), how long before it is tried again."""


class Refused(RuntimeError):
    """The log cannot be served as it is (a damaged archive, a restore that does not
    match): needs a person, not a retry."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Supervisor:
    def __init__(self, settings: Settings, state_dir: Path, *, gated: bool,
                 port: int | None) -> None:
        self.settings = settings
        self.state_dir = state_dir.resolve()
        self.gated = gated
        self.requested_port = port
        self.archive = LogArchive(archive_dir(self.state_dir),
                                  fsync=settings.broker_archive_fsync)
        self.options = kafka_client_options(settings)
        self.logs = self.state_dir / "logs"
        self._stop = asyncio.Event()
        self._state: dict[str, Any] = {}
        self._observed_high: dict[tuple[str, int], int] = {}
        self._lock_fd: int | None = None
        self._compacted_clean = False
        self._compact_not_before = 0.0

    # -- state file ------------------------------------------------------------------------
    def _write(self, **changes: Any) -> None:
        self._state.update(changes)
        self._state["updated_at"] = _now()
        if self._lock_still_ours():  # else writing would make the directory again
            write_state(self.state_dir, self._state)

    def _status(self, status: str, **changes: Any) -> None:
        if status != self._state.get("status"):
            level = log.error if status == "failed" else log.info
            level("broker_supervisor.status", status=status,
                  **{k: v for k, v in changes.items() if k in ("error", "reason", "bootstrap")})
        self._write(status=status, **changes)

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def _lock_path(self) -> Path:
        return broker_dir(self.state_dir) / "supervisor.lock"

    def lock(self) -> bool:
        path = self._lock_path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        previous = read_state(self.state_dir)
        try:
            identity = self.archive.identity() or self.archive.create_identity(
                f"toolexec-{secrets.token_hex(8)}", _now())
        except OSError as error:
            return self._refuse(f"cannot open the archive: {error}")
        port = self.requested_port or (previous.port if self.gated and previous else None)
        self._state = {"supervisor_pid": os.getpid(), "started_at": _now(),
                       "cluster_id": identity["cluster_id"], "archive": str(self.archive.root),
                       "incarnation": 0, "restarts": 0, "clean_stop": False}
        try:
            unclean = self._ended_unclean(previous)
        except ArchiveCorrupt as error:
            return self._refuse(f"the archive is damaged: {error}")
        # A compaction is exact only behind a gate (closed while the rest is archived):
        # with compactions on, even a cold start serves through one.
        gated = self.gated or self.settings.broker_gated_from_start
        if gated and port is None:
            port = free_port()
        failures = 0
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                outcome, port = await self._incarnation(port, gated=gated, unclean=unclean,
                                                        cluster_id=identity["cluster_id"])
            except Refused as error:
                return self._refuse(str(error))
            if outcome == "stopped":
                return 0
            if outcome == STATE_GONE or not self._lock_still_ours():
                log.error("broker_supervisor.state_directory_gone",
                          state_dir=str(self.state_dir), outcome=outcome[:200])
                return EXIT_STATE_GONE
            if outcome == COMPACT:
                # Planned: behind the gate from now on; a gap only when a client may have
                # written after the last record archived (no gate to close before).
                gated, unclean = port is not None, not self._compacted_clean
                self._status("compacting", reason="restart from the archive to bound the "
                             "broker's memory", compactions=self._state.get("compactions", 0) + 1,
                             broker_pid=None, gate_pid=None)
                continue
            failures = 0 if time.monotonic() - began > STABLE_SECONDS else failures + 1
            delay = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS)) - 1] if failures else 0
            self._status("restarting", reason=outcome[:2000], last_restart_reason=outcome[:2000],
                         restarts=self._state.get("restarts", 0) + 1, broker_pid=None,
                         gate_pid=None, retry_in_seconds=delay)
            # Clients know the port (once there is one): restore behind the gate.
            gated, unclean = port is not None, True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
        self._status("stopped", clean_stop=False)
        return 0

    def _ended_unclean(self, previous: Any) -> bool:
        """True when the log's last broker did not stop cleanly (acknowledged records
        may be missing from the archive)."""
        if not any(self.archive.ends().values()):
            return False
        return previous is None or not previous.data.get("clean_stop", False)

    def _refuse(self, reason: str) -> int:
        self._status("failed", error=reason, broker_pid=None, gate_pid=None)
        log.error("broker_supervisor.refused", reason=reason)
        return EXIT_REFUSED

    # -- one broker process ------------------------------------------------------------------
    async def _incarnation(self, port: int | None, *, gated: bool, unclean: bool,
                           cluster_id: str) -> tuple[str, int | None]:
        """Start Tansu, restore, serve until it dies or we stop; returns the outcome and
        the public port (chosen here on a cold start without one)."""
        incarnation = int(self._state.get("incarnation", 0)) + 1
        self._status("restoring", incarnation=incarnation, mode="gated" if gated else "direct",
                     bootstrap=None if not gated else f"127.0.0.1:{port}")
        if unclean:
            self._leave_gap()
        broker = EmbeddedBroker({}, log_dir=self.logs, port=None if gated else port,
                                cluster_id=cluster_id)
        try:
            await broker.start()
        except EmbeddedBrokerError as error:
            return f"could not start: {error}", port
        if not gated:
            port = int(broker.bootstrap.rsplit(":", 1)[1])
        archiver: LogArchiver | None = None
        gate: BrokerGate | None = None
        try:
            report = await self._restore(broker.bootstrap)
            archiver = LogArchiver(self.archive, broker.bootstrap,
                                   fetch_wait_ms=self.settings.broker_archive_fetch_wait_ms,
                                   idle_wait_ms=self.settings.broker_archive_idle_wait_ms,
                                   woken=gated, client_options=self.options)
            await archiver.start()
            if gated:  # every client writes through the gate: it tells the archiver
                gate = BrokerGate(port, broker.bootstrap, log_dir=self.logs,
                                  client_options=self.options, on_produce=archiver.kick)
                await gate.open()
            public = gate.bootstrap if gate is not None else broker.bootstrap
            self._status("ready", bootstrap=public, broker_pid=broker.pid,
                         gate_pid=gate.pid if gate else None, ready_at=_now(),
                         broker_log=str(broker.log_path), restore=_report(report),
                         reason=None, error=None, clean_stop=False)
            return await self._serve(broker, gate, archiver), port
        except EmbeddedBrokerError as error:  # the gate could not open
            return f"could not start: {error}", port
        finally:
            await self._stop_incarnation(broker, gate, archiver)

    def _leave_gap(self) -> None:
        """Resume every partition past any offset its dead broker may have handed out."""
        groups = self.archive.groups()
        gap = self.settings.broker_crash_offset_gap
        for topic, partition in self.archive.partitions():
            archive = self.archive.partition(topic, partition)
            if archive.first_offset is None:
                continue  # nothing to claim the gap with (see log_restore)
            key = (topic, partition)
            highest = max([archive.next_offset, self._observed_high.get(key, 0)]
                          + [offsets.get(key, 0) for offsets in groups.values()])
            archive.append([Skip(highest + gap)])
            archive.sync()
        log.warning("broker_supervisor.offset_gap", gap=gap,
                    reason="the previous broker did not stop cleanly")

    async def _restore(self, bootstrap: str) -> RestoreReport:
        starts = self._retention()
        try:
            report = await restore(self.archive, bootstrap, starts=starts,
                                   client_options=self.options)
        except (RestoreMismatch, ArchiveCorrupt) as error:
            raise Refused(f"restore refused: {error}") from error
        if report.clamped_commits:
            log.warning("broker_supervisor.commits_clamped", commits=report.clamped_commits)
        self._write(retained_from={f"{t}/{p}": start for (t, p), start in sorted(starts.items())})
        return report

    def _retention(self) -> dict[tuple[str, int], int]:
        """Where each partition's restore begins (see `retention_starts`); commits of
        groups active within `GROUP_PIN_SECONDS` keep their records in the broker."""
        now = time.time()
        changed = self.archive.group_changes()
        pinned: dict[tuple[str, int], int] = {}
        for group, offsets in self.archive.groups().items():
            if now - changed.get(group, 0.0) > GROUP_PIN_SECONDS:
                continue  # a group gone quiet long ago does not hold records back
            for key, offset in offsets.items():
                pinned[key] = min(offset, pinned.get(key, offset))
        partitions = {key: (part.first_offset,
                            part.last_offset + 1 if part.last_offset is not None else 0)
                      for key in self.archive.partitions()
                      for part in [self.archive.partition(*key)]}
        return retention_starts(partitions, trim_topics=self.settings.broker_trim_topics,
                                retain=self.settings.broker_retain_records, pinned=pinned)

    async def _serve(self, broker: EmbeddedBroker, gate: BrokerGate | None,
                     archiver: LogArchiver) -> str:
        next_progress = 0.0
        while True:
            if self._stop.is_set():
                await self._shutdown(broker, gate, archiver)
                return "stopped"
            if not broker.running:
                code = broker._process.returncode if broker._process else None  # noqa: SLF001
                self._observed_high.update(archiver.observed_high)
                log.error("broker_supervisor.broker_died", pid=broker.pid, returncode=code,
                          log_tail=_tail(broker.log_path, 5))
                return f"the broker (pid {broker.pid}) exited with {code}"
            if archiver.failure is not None:
                self._observed_high.update(archiver.observed_high)
                return f"archiving failed: {archiver.failure!r}"
            if gate is not None and not gate.running:
                log.error("broker_supervisor.gate_died", pid=gate.pid)
                gate.close()
                await gate.open()
                self._write(gate_pid=gate.pid)
            if not self._lock_still_ours():
                return STATE_GONE  # `_incarnation` stops the broker
            if time.monotonic() >= next_progress:
                self._progress(archiver)
                next_progress = time.monotonic() + PROGRESS_SECONDS
                if self._compaction_due(archiver):
                    outcome = await self._compact(gate, archiver)
                    if outcome is not None:
                        return outcome
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.1)

    def _lock_still_ours(self) -> bool:
        """False once the lock file at its path is not the one this supervisor holds
        (the state directory was deleted, or replaced by another)."""
        if self._lock_fd is None:
            return True
        try:
            held, named = os.fstat(self._lock_fd), os.stat(self._lock_path)
        except FileNotFoundError:
            return False
        return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)

    def _compaction_due(self, archiver: LogArchiver) -> bool:
        """Has the broker taken enough since it started to be restarted from the archive
        (at a quiet moment, or regardless at four times the threshold)?

        Quiet means nothing archived for a while with nothing left to archive: an
        archiver that stalls behind a busy broker archives nothing either, and a
        compaction then would close the gate on writers for nothing (it is postponed
        when the archive cannot catch up)."""
        threshold = self.settings.broker_compact_after_records
        taken = archiver.archived_records
        if threshold <= 0 or taken < threshold or time.monotonic() < self._compact_not_before:
            return False
        if taken >= 4 * threshold:
            return True
        idle = time.monotonic() - archiver.last_archived_at
        return idle >= self.settings.broker_compact_quiet_seconds and not any(
            archiver.lag().values())

    async def _compact(self, gate: BrokerGate | None, archiver: LogArchiver) -> str | None:
        """Stop taking records and archive the rest, for a restart from the archive
        (COMPACT). Behind a gate, when the archive cannot catch up within DRAIN_SECONDS
        (a busy machine), the gate opens again and the broker keeps serving (None): a
        planned restart never drops a record a client was told was written; it is
        tried again after COMPACT_RETRY_SECONDS."""
        log.warning("broker_supervisor.compacting", records_since_start=archiver.archived_records,
                    threshold=self.settings.broker_compact_after_records)
        if gate is not None:
            gate.close()  # exact: nobody writes while the rest is archived
        caught_up = await archiver.drain(DRAIN_SECONDS)
        self._observed_high.update(archiver.observed_high)
        if gate is not None and not caught_up:
            archiver.follow()
            await gate.open()
            self._write(gate_pid=gate.pid)
            self._compact_not_before = time.monotonic() + COMPACT_RETRY_SECONDS
            log.warning("broker_supervisor.compaction_postponed",
                        lag=sum(archiver.lag().values()), retry_in_seconds=COMPACT_RETRY_SECONDS)
            return None
        self._compacted_clean = caught_up and gate is not None
        return COMPACT

    def _progress(self, archiver: LogArchiver) -> None:
        ends = self.archive.ends()
        archived = {f"{t}/{p}": end for (t, p), end in sorted(ends.items())}
        lag = {f"{t}/{p}": n for (t, p), n in sorted(archiver.lag().items()) if n}
        if archived != self._state.get("archived") or lag != self._state.get("archive_lag"):
            self._write(archived=archived, archive_lag=lag)

    async def _shutdown(self, broker: EmbeddedBroker, gate: BrokerGate | None,
                        archiver: LogArchiver) -> None:
        self._status("stopping")
        if gate is not None:
            gate.close()  # nobody can write any more: the drain is exact
        caught_up = await archiver.drain(DRAIN_SECONDS)
        await archiver.stop()
        await broker.stop()
        self._progress(archiver)
        self._status("stopped", clean_stop=caught_up, broker_pid=None, gate_pid=None,
                     stopped_at=_now())
        if not caught_up:
            log.error("broker_supervisor.stopped_behind", lag=self._state.get("archive_lag"))

    async def _stop_incarnation(self, broker: EmbeddedBroker, gate: BrokerGate | None,
                                archiver: LogArchiver | None) -> None:
        if gate is not None:
            gate.close()
        if archiver is not None:
            await archiver.stop()
        await broker.stop()


def _report(report: RestoreReport) -> dict[str, Any]:
    return {"records": report.records, "batches": report.batches, "groups": report.groups,
            "seconds": round(report.seconds, 3),
            "ends": {f"{t}/{p}": end for (t, p), end in sorted(report.ends.items())},
            "clamped_commits": report.clamped_commits,
            "unrestorable_skips": report.unrestorable_skips}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolexec.broker_supervisor",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--gated", action="store_true",
                        help="clients may hold the port already: restore behind a closed gate")
    parser.add_argument("--port", type=int, help="public port (default: a free one)")
    args = parser.parse_args(argv)
    settings = Settings(state_dir=args.state_dir)
    configure_logging(settings)
    # The supervisor watches the broker itself and logs each change once; aiokafka's
    # per-retry errors while the broker is away would only repeat that.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    supervisor = Supervisor(settings, args.state_dir, gated=args.gated, port=args.port)
    if not supervisor.lock():
        state = read_state(args.state_dir)
        pid = state.supervisor_pid if state else None
        print(f"another broker supervisor runs for {args.state_dir} (pid {pid})", file=sys.stderr)
        return EXIT_ANOTHER_SUPERVISOR
    try:
        return asyncio.run(supervisor.run())
    finally:
        supervisor.archive.close()


if __name__ == "__main__":
    sys.exit(main())
