"""The executor's end of the tool-side report protocol (domain.tool_reports).

For each run of a subprocess tool the executor makes a report file the tool appends
to (`TOOLEXEC_REPORT_FILE`), a file with the last checkpoint's state when the run
resumes one (`TOOLEXEC_CHECKPOINT_FILE`), and puts the helper module `toolexec_tool`
on `PYTHONPATH`. Where they live:
- on the host (rlimits, Landlock): in `.toolexec/` of the run directory, which the
  tool may write anyway;
- under bubblewrap and the namespace launcher the run directory is a tmpfs inside
  the sandbox, so they are made in a private folder of the executor process (one for
  all runs: the helper module once, and each run's report and checkpoint file, named
  at random and removed when the run is over) and each bound at the same place
  inside: the report file read-write, the others read-only. Only that one file is
  writable, and its size is held by the run's file-size limit.

The executor opens the report file before the tool starts (O_NOFOLLOW) and reads that
open file: a tool replacing or linking the name reaches nothing else. While the tool
runs, `follow` polls it, bounded in every way (bytes and lines per poll, line length),
hands the reports to the run's ToolSession, and drops malformed lines with a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from consumers.primitives import run_directory
from consumers.primitives.run_directory import RunDirectory
from domain.checkpoints import DEFAULT_MAX_STATE_BYTES
from domain.tool_reports import MalformedReport, Report, parse_report

log = structlog.get_logger(__name__)

FOLDER = ".toolexec"
REPORT_NAME = "report.jsonl"
CHECKPOINT_NAME = "checkpoint.json"
HELPER_FOLDER = "python"
HELPER_SOURCE = Path(__file__).parent / "tool_side" / "toolexec_tool.py"

LINE_MAX = DEFAULT_MAX_STATE_BYTES + 64 * 1024
"""Longest line read (a checkpoint at the state cap, with room for its wrapping)."""
READ_MAX = 1 << 20
"""Bytes read per poll; more wait for the next one."""
LINES_MAX = 1000
"""Lines parsed per poll; more wait for the next one."""
POLL_SECONDS = 0.05
DRAIN_MAX = 4 * LINE_MAX
"""Bytes read after the tool ended (a tool that wrote gigabytes is not read to the end)."""
WARNINGS_MAX = 20
"""Malformed lines named in the log per run (the rest are counted)."""


@dataclass
class ReportChannel:
    """The report files of one run: `env` for the tool, `binds` (host, inside) for
    bubblewrap (the first one read-write), and the executor's reader."""

    env: dict[str, str]
    binds: list[tuple[Path, Path]]
    reader: ReportReader
    _own_files: tuple[Path, ...] = ()

    def close(self) -> None:
        self.reader.close()
        _remove(self._own_files)


def open_channel(run_dir: RunDirectory, sandbox: str, reports: Path,
                 resume_state: bytes | None) -> ReportChannel:
    """Make the report files of a run in `run_dir` (see the module docstring); under
    bubblewrap and the namespace launcher in `reports`, a private folder of this
    process (`shared_folder`) holding the helper module once and each run's own
    report (and checkpoint) file, removed when the run is over."""
    inside = run_dir.path / FOLDER
    fresh_root = sandbox in run_directory.FRESH_ROOT_SANDBOXES
    own: list[Path] = []
    try:
        if fresh_root:
            name = secrets.token_hex(8)
            report, checkpoint = reports / f"{name}.jsonl", reports / f"{name}.checkpoint.json"
            helper = reports / HELPER_SOURCE.name
        else:
            inside.mkdir(mode=0o700)
            (inside / HELPER_FOLDER).mkdir()
            report, checkpoint = inside / REPORT_NAME, inside / CHECKPOINT_NAME
            helper = inside / HELPER_FOLDER / HELPER_SOURCE.name
            shutil.copyfile(HELPER_SOURCE, helper)
        descriptor = os.open(report,
                             os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o666)
        own.append(report)
        os.fchmod(descriptor, 0o666)  # the sandbox's uid appends to it (umask aside)
        env = {"TOOLEXEC_REPORT_FILE": str(inside / REPORT_NAME),
               "PYTHONPATH": str(inside / HELPER_FOLDER)}
        binds = [(report, inside / REPORT_NAME),
                 (helper, inside / HELPER_FOLDER / HELPER_SOURCE.name)]
        if resume_state is not None:
            own.append(checkpoint)
            checkpoint.write_bytes(resume_state)
            os.chmod(checkpoint, 0o644)
            env["TOOLEXEC_CHECKPOINT_FILE"] = str(inside / CHECKPOINT_NAME)
            binds.append((checkpoint, inside / CHECKPOINT_NAME))
    except BaseException:
        if fresh_root:
            _remove(own)
        raise
    return ReportChannel(env, binds, ReportReader(descriptor),
                         tuple(own) if fresh_root else ())


def _remove(paths: Iterable[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def shared_folder(root: Path) -> Path:
    """This process's folder for the report files of fresh-root runs, made in `root`
    (a private folder of this process) on first use with the helper module in it."""
    folder = root / "reports"
    if not folder.is_dir():
        staging = root / f".reports-{secrets.token_hex(4)}"
        staging.mkdir(mode=0o755)
        shutil.copyfile(HELPER_SOURCE, staging / HELPER_SOURCE.name)
        os.chmod(staging / HELPER_SOURCE.name, 0o644)
        try:
            os.rename(staging, folder)
        except OSError:  # made meanwhile (another event loop of this process)
            run_directory.remove_tree(staging)
            if not folder.is_dir():
                raise
    return folder


def tool_environment(env: dict[str, str], channel: ReportChannel) -> dict[str, str]:
    """The tool's environment with the channel's variables (the helper's folder in
    front of any PYTHONPATH the plan sets)."""
    merged = dict(env)
    for name, value in channel.env.items():
        if name == "PYTHONPATH" and env.get(name):
            value = f"{value}{os.pathsep}{env[name]}"
        merged[name] = value
    return merged


@dataclass
class ReportReader:
    """Reads whole lines from the report file as the tool appends them."""

    descriptor: int
    _partial: bytearray = field(default_factory=bytearray)
    _skipping: bool = False
    malformed: int = 0

    def poll(self) -> list[Report]:
        """The reports appended since the last poll (bounded, see the module)."""
        reports: list[Report] = []
        try:
            chunk = os.read(self.descriptor, READ_MAX)
        except OSError:
            return reports
        lines = chunk.split(b"\n")
        for index, piece in enumerate(lines):
            if index == len(lines) - 1:  # no line break yet: the rest of a line
                self._keep(piece)
                break
            line = self._take(piece)
            if line is None:
                continue
            try:
                reports.append(parse_report(line))
            except MalformedReport as error:
                self._malformed(str(error))
            if len(reports) >= LINES_MAX:
                rest = b"\n".join(lines[index + 1:])
                os.lseek(self.descriptor, -len(rest), os.SEEK_CUR)  # for the next poll
                break
        return reports

    def _take(self, piece: bytes) -> bytes | None:
        """A complete line from its last piece (None: too long, skipped)."""
        if self._skipping:
            self._skipping = False
            self._partial.clear()
            return None
        if len(self._partial) + len(piece) > LINE_MAX:
            self._partial.clear()
            self._malformed(f"a line longer than {LINE_MAX} bytes")
            return None
        line = bytes(self._partial) + piece
        self._partial.clear()
        return line if line.strip() else None

    def _keep(self, piece: bytes) -> None:
        if self._skipping:
            return
        if len(self._partial) + len(piece) > LINE_MAX:
            self._partial.clear()
            self._skipping = True
            self._malformed(f"a line longer than {LINE_MAX} bytes")
            return
        self._partial += piece

    def _malformed(self, why: str) -> None:
        self.malformed += 1
        if self.malformed <= WARNINGS_MAX:
            log.warning("tool.report_malformed", why=why[:200], seen=self.malformed)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.descriptor)


async def follow(reader: ReportReader, receive: Callable[[list[Report]], Awaitable[None]],
                 ended: asyncio.Event, *, interval: float = POLL_SECONDS) -> None:
    """Hand the reports to `receive` while the tool runs, then what it wrote last,
    once `ended` is set: the rest of the file, up to DRAIN_MAX bytes (a line left
    without its line break is dropped). An exception of `receive` ends the following."""
    drained_from: int | None = None
    while True:
        finished = ended.is_set()
        if finished and drained_from is None:
            drained_from = _position(reader)
        reports = reader.poll()
        await receive(reports)
        if finished and (not _more(reader) or _position(reader) - drained_from > DRAIN_MAX):
            return
        if not reports and not finished:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended.wait(), interval)


def _position(reader: ReportReader) -> int:
    return os.lseek(reader.descriptor, 0, os.SEEK_CUR)


def _more(reader: ReportReader) -> bool:
    return os.fstat(reader.descriptor).st_size > _position(reader)
