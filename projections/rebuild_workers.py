"""One share of a rebuild: a runner over some partitions, in this process or another.

`run_share` replays the given partitions of the given read models up to the given end
offsets with the models' rebuild copies (`catalog.rebuilding`), writing rows and
offsets batch by batch exactly as the incremental runner does, so an interrupted
rebuild is resumed by the runner from the stored offsets. `start_workers` runs several
shares in worker processes (forkserver: the modules are imported once, each worker is
a fork of that process) and reports their progress and results through one queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import queue as queues
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from aiokafka import TopicPartition
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts.fact_signature import FactVerifier
from projections.catalog import model_named, rebuilding
from projections.kafka_connection import live_client_options
from projections.runner import ArchivedLog, ProjectionRunner, WriteTurn
from projections.store import ReadModel

Place = tuple[str, int]
PROGRESS_EVERY_SECONDS = 0.2
GO_POLL_SECONDS = 0.5
WORKER_MODULES = ("projections.rebuild_workers", "projections.database")
"""Imported once by the fork server, before any worker is forked from it."""
REBUILD_FETCH = {"fetch_max_bytes": 16 * 1024 * 1024, "max_partition_fetch_bytes": 4 * 1024 * 1024}
"""A rebuild reads the log as fast as it can: large fetches, few batches."""


@dataclass(frozen=True)
class RebuildShare:
    """What one worker rebuilds: models by (name, topics), its partitions and where to
    stop (the log end seen when the rebuild began)."""

    index: int
    database_url: str
    bootstrap: str
    models: tuple[tuple[str, tuple[str, ...]], ...]
    partitions: tuple[Place, ...]
    ends: tuple[tuple[Place, int], ...]
    consumer_options: dict[str, Any] = field(default_factory=dict)
    client_options: dict[str, Any] = field(default_factory=dict)
    """Connection options in their picklable form (`portable_client_options`)."""
    batch_size: int = 2000
    fact_keys: tuple[bytes, ...] | None = None
    """Raw public keys of the pipeline's fact signatures (None: facts unchecked)."""
    signed_topics: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShareResult:
    """What one share did, per model: (records, applied, undecodable, duplicates)."""

    index: int
    per_model: dict[str, tuple[int, int, int, int]]
    records: int
    cpu_seconds: float
    untrusted: int = 0
    """Facts whose signature did not verify (kept out of state)."""


Progress = Callable[[int], None]
"""Called with the records this share has consumed so far."""


async def run_share(engine: AsyncEngine, models: Sequence[ReadModel], bootstrap: str, *,
                    partitions: Sequence[Place] | None, ends: Mapping[Place, int] | None,
                    consumer_options: Mapping[str, Any] | None = None,
                    client_options: Mapping[str, Any] | None = None,
                    batch_size: int = 2000, progress: Progress | None = None,
                    index: int = 0, archive: ArchivedLog | None = None,
                    verifier: FactVerifier | None = None,
                    signed_topics: Sequence[str] = (),
                    write_turn: WriteTurn | None = None) -> ShareResult:
    """Replay `partitions` (None: all of the models' topics) of `models` into `engine`
    until `ends` (None: the log end now), reading first from `archive` what the broker
    no longer holds."""
    cpu = time.process_time()
    with _collected_between_steps() as settle:
        runner = await _replay(engine, models, bootstrap, partitions, ends, consumer_options,
                               batch_size, progress, archive, client_options, verifier,
                               signed_topics, write_turn, settle)
    per_model = {name: (s.records, s.applied, s.undecodable, s.duplicates)
                 for name, s in runner.model_stats.items()}
    return ShareResult(index, per_model, runner.stats.records, time.process_time() - cpu,
                       runner.stats.untrusted)


@contextlib.contextmanager
def _collected_between_steps() -> Iterator[Callable[[], None]]:
    """No automatic collection while a share runs; the function yielded, called after
    each step, collects what that step left (its young objects: cycles among them
    are freed) and sets the survivors aside (`gc.freeze`), so that no collection
    scans them again. Everything is handed back to the collector at the end.

    A step holds its thousands of records, envelopes, models and rows alive until it
    ends, so automatic collections (even every 20,000 allocations) scanned them and
    moved them up again and again while finding nothing to free: 0.83 s of the 8.7 s
    of CPU of a sequential rebuild of 100,000 events (126 young, 11 middle, 1 full
    collection); one young collection per step, 0.07 s."""
    enabled = gc.isenabled()
    gc.freeze()
    gc.disable()

    def settle() -> None:
        gc.collect(0)
        gc.freeze()

    try:
        yield settle
    finally:
        if enabled:
            gc.enable()
        gc.unfreeze()


async def _replay(engine: AsyncEngine, models: Sequence[ReadModel], bootstrap: str,
                  partitions: Sequence[Place] | None, ends: Mapping[Place, int] | None,
                  consumer_options: Mapping[str, Any] | None, batch_size: int,
                  progress: Progress | None,
                  archive: ArchivedLog | None = None,
                  client_options: Mapping[str, Any] | None = None,
                  verifier: FactVerifier | None = None,
                  signed_topics: Sequence[str] = (),
                  write_turn: WriteTurn | None = None,
                  settle: Callable[[], None] | None = None) -> ProjectionRunner:
    runner = ProjectionRunner(engine, [rebuilding(m) for m in models], bootstrap,
                              consumer_options={**REBUILD_FETCH, **(consumer_options or {})},
                              batch_size=batch_size, poll_ms=50, partitions=partitions,
                              archive=archive, check_log=False, client_options=client_options,
                              verifier=verifier, signed_topics=signed_topics,
                              write_turn=write_turn)
    await runner.open()
    try:
        if ends is None:
            targets = await runner.end_offsets()
        else:
            targets = {TopicPartition(t, p): end for (t, p), end in ends.items()
                       if partitions is None or (t, p) in partitions}
        while not runner.reached(targets):
            await runner.step()
            if settle is not None:
                settle()
            if progress is not None:
                progress(runner.stats.records)
    finally:
        await runner.close()
    return runner


# --- worker processes ------------------------------------------------------------------

def _worker_main(share: RebuildShare, reports: Any, go: Any = None,
                 write_lock: Any = None) -> None:
    """Entry point of a worker process: wait for `go` (set once the parent has reset
    the models), run `share` (taking `write_lock` to write, if any), report progress
    and the result."""
    from projections.database import make_engine

    if go is not None and not _wait_for(go):
        return
    last = [0.0]

    def progress(records: int) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_EVERY_SECONDS:
            last[0] = now
            reports.put(("progress", share.index, records))

    async def work() -> ShareResult:
        engine = make_engine(share.database_url)
        try:
            models = [model_named(name, topics) for name, topics in share.models]
            return await run_share(engine, models, share.bootstrap,
                                   partitions=share.partitions, ends=dict(share.ends),
                                   consumer_options=share.consumer_options,
                                   client_options=live_client_options(share.client_options),
                                   batch_size=share.batch_size, progress=progress,
                                   index=share.index, verifier=None if share.fact_keys is None
                                   else FactVerifier.from_raw(share.fact_keys),
                                   signed_topics=share.signed_topics,
                                   write_turn=None if write_lock is None
                                   else WriteTurn(write_lock))
        finally:
            await engine.dispose()

    try:
        result = asyncio.run(work())
    except BaseException as error:  # boundary: the parent reports it and stops the rest
        reports.put(("failed", share.index, type(error).__name__, str(error)[:2000]))
        raise SystemExit(1) from None
    reports.put(("progress", share.index, result.records))
    reports.put(("done", share.index, result))


class WorkerFailed(Exception):
    """A rebuild worker stopped with an error (`kind` is the exception's class name)."""

    def __init__(self, index: int, kind: str, message: str) -> None:
        super().__init__(f"rebuild worker {index} failed: {kind}: {message}")
        self.kind = kind


def _wait_for(go: Any) -> bool:
    """Wait until `go` is set (True) or the parent process is gone (False)."""
    parent = multiprocessing.parent_process()
    while not go.wait(GO_POLL_SECONDS):
        if parent is not None and not parent.is_alive():
            return False
    return True


def start_fork_server() -> None:
    """Start the fork server that worker processes are forked from, in the background:
    its imports take about a second, which a command can overlap with its own set-up
    before it rebuilds (the rebuild then forks its workers at once)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        threading.Thread(target=_ensure_fork_server, name="toolexec-fork-server",
                         daemon=True).start()


def _ensure_fork_server() -> None:
    from multiprocessing import forkserver

    _context()  # the modules it preloads
    forkserver.ensure_running()


def _context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(preloaded_modules())
        return context
    return multiprocessing.get_context("spawn")


def preloaded_modules() -> list[str]:
    """What the fork server imports before forking any worker: `WORKER_MODULES`, and
    the modules (imported here already) that this process's main script took its
    names from. A worker runs that script again (as `__mp_main__`) before its target,
    and multiprocessing's own `"__main__"` preload never reaches the fork server in
    Python 3.11 (it looks for a `main_path` key its preparation data does not have):
    each worker imported the script's modules itself, ~0.6-1 s from its start to its
    share in the bench's rebuilds (the `toolexec` command's CLI), ~0.02 s now."""
    main = sys.modules.get("__main__")
    names = set()
    for value in vars(main).values() if main is not None else ():
        name = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if (isinstance(name, str) and name in sys.modules
                and name not in sys.builtin_module_names and not name.startswith("_")):
            names.add(name)
    return [*WORKER_MODULES, *sorted(names - set(WORKER_MODULES))]


class Workers:
    """Worker processes, one per share, held after they start until `run`: `start`
    them first, and their start (the fork server's imports, the forks) overlaps with
    what the parent does before the rows may be written (resetting the models)."""

    def __init__(self, shares: Sequence[RebuildShare]) -> None:
        context = _context()
        self._shares = list(shares)
        self._reports = context.Queue()
        self._go = context.Event()
        # Workers sharing one SQLite file take turns at writing (`WriteTurn`).
        # Kept: a lock (like the event) is unlinked once the parent drops it, and a
        # process started drops its arguments before the worker has unpickled them.
        self._lock = (context.Lock() if shares and shares[0].database_url.startswith("sqlite")
                      else None)
        self._processes = [context.Process(target=_worker_main,
                                           args=(share, self._reports, self._go, self._lock),
                                           name=f"toolexec-rebuild-{share.index}", daemon=True)
                           for share in shares]
        self._started: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the processes in the background (the first start waits for the fork
        server's imports, which must not hold up the event loop)."""
        if self._started is None:
            self._started = asyncio.create_task(asyncio.to_thread(self._start_all))

    def _start_all(self) -> None:
        for process in self._processes:
            process.start()

    async def run(self, progress: Progress | None = None) -> list[ShareResult]:
        """Let the workers go and wait for their results; `progress` gets the records
        consumed by all of them. The first failure stops the others and is raised as
        `WorkerFailed`. The processes are ended either way."""
        try:
            self.start()
            assert self._started is not None
            await self._started
            self._go.set()
            return await _results(self._processes, self._shares, self._reports, progress)
        finally:
            await self.stop()

    async def stop(self) -> None:
        """End every process still running (idempotent)."""
        if self._started is not None:
            await asyncio.gather(self._started, return_exceptions=True)
        for process in self._processes:
            if process.is_alive() and (process.pid is not None):
                process.terminate()
        for process in self._processes:
            if process.pid is not None:  # started (a failed start leaves the rest not)
                await asyncio.to_thread(process.join, 10)
        self._processes = []
        self._reports.close()


async def run_workers(shares: Sequence[RebuildShare],
                      progress: Progress | None = None) -> list[ShareResult]:
    """Run every share in a process of its own (see `Workers.run`)."""
    return await Workers(shares).run(progress)


async def _results(processes: Sequence[Any], shares: Sequence[RebuildShare], reports: Any,
                   progress: Progress | None) -> list[ShareResult]:
    done: dict[int, ShareResult] = {}
    seen = {share.index: 0 for share in shares}
    while len(done) < len(shares):
        try:
            message = await asyncio.to_thread(reports.get, True, 0.2)
        except queues.Empty:
            if not _all_alive(processes, shares, done):
                try:  # its last words, if it said any
                    message = await asyncio.to_thread(reports.get, True, 1.0)
                except queues.Empty:
                    index = _dead(processes, shares, done)
                    raise WorkerFailed(index, "WorkerDied",
                                       "worker process exited without a result") from None
            else:
                continue
        if message[0] == "progress":
            seen[message[1]] = message[2]
            if progress is not None:
                progress(sum(seen.values()))
        elif message[0] == "done":
            done[message[1]] = message[2]
        else:
            raise WorkerFailed(message[1], message[2], message[3])
    return [done[share.index] for share in shares]


def _all_alive(processes: Sequence[Any], shares: Sequence[RebuildShare],
               done: Mapping[int, ShareResult]) -> bool:
    return _dead(processes, shares, done) < 0


def _dead(processes: Sequence[Any], shares: Sequence[RebuildShare],
          done: Mapping[int, ShareResult]) -> int:
    """Index of a share whose process ended without its result, else -1."""
    for process, share in zip(processes, shares, strict=True):
        if share.index not in done and not process.is_alive():
            return share.index
    return -1
