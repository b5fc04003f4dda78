"""Tool process groups on the host, kept so that none outlives the executor that ran it.

Under bubblewrap and the namespace launcher a run's processes live in a PID namespace
that dies with the executor. Under Landlock, rlimits and no sandbox they live on the
host, in a session and process group of their own: the executor kills the group when
the run ends, but an executor that is SIGKILLed kills nothing. The group's leader dies
with it (`PR_SET_PDEATHSIG`, set where the tool is spawned); processes the leader
forked would go on, orphaned, past every limit of the run.

So each such group is written down while it runs, outside every run directory, as an
empty file under ``<work root>/.groups`` whose name says everything (created in one
step, never half written): the boot it was made in, the executor's pid and start
time, the group's id (its leader's pid) and its leader's start time, and the run
directory's name. The run directory's removal also removes the file. An executor
starting on the same work root (`sweep`) kills the groups whose executor is gone and
removes their run directories.

Why killing such a group cannot hit an unrelated process: the kernel does not give a
pid out again while any process still has it as its group id, so if the recorded
leader is gone, the processes still in that group are the run's. A leader found alive
with another start time means the pid was given out again (the run's group had
emptied): it is left alone. An entry of an earlier boot has no process left: only its
run directory is removed. A process that left the group (`setsid`) is out of reach:
this is a safety net for hung tools and forgotten children, not a sandbox; the
sandboxes with a PID namespace contain a hostile tool.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import structlog

from consumers.primitives.run_directory import remove_tree

log = structlog.get_logger(__name__)

FOLDER = ".groups"


def boot_id() -> str:
    """This boot's id (hex digits), as the kernel gives it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return boot.read().strip().replace("-", "")
    except OSError:
        return "0"


def start_time(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks since boot), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19])  # field 22 of proc(5); fields[0] is field 3


@dataclass(frozen=True, slots=True)
class GroupEntry:
    """One recorded group: when and whose it is, which it is, and where it ran."""

    boot: str
    owner_pid: int
    owner_start: int
    group: int
    leader_start: int
    run_dir: str

    @property
    def name(self) -> str:
        return (f"{self.boot}-{self.owner_pid}-{self.owner_start}-{self.group}-"
                f"{self.leader_start}-{self.run_dir}")

    @classmethod
    def parse(cls, name: str) -> GroupEntry | None:
        parts = name.split("-", 5)
        if len(parts) != 6 or not parts[0].isalnum() \
                or not all(p.isdigit() for p in parts[1:5]) \
                or not parts[5].startswith("run-") or "/" in parts[5]:
            return None
        owner_pid, owner_start, group, leader_start = (int(p) for p in parts[1:5])
        return cls(parts[0], owner_pid, owner_start, group, leader_start, parts[5])

    def owner_alive(self) -> bool:
        return start_time(self.owner_pid) == self.owner_start


class HostGroups:
    """The groups this process started under one work root (see the module docstring)."""

    def __init__(self, work_root: Path) -> None:
        self.work_root = work_root
        self.folder = work_root / FOLDER
        self._boot = boot_id()
        self._owner = (os.getpid(), start_time(os.getpid()) or 0)

    def record(self, group: int, run_dir: Path) -> Path | None:
        """Write down the group led by `group` (just spawned) running in `run_dir`;
        the path to remove once the group is killed (None: it could not be written,
        which only loses the safety net, logged)."""
        leader_start = start_time(group)
        if leader_start is None:
            return None  # already reaped: its group was killed then
        entry = GroupEntry(self._boot, *self._owner, group, leader_start, run_dir.name)
        path = self.folder / entry.name
        try:
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            except FileNotFoundError:
                self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except OSError as error:
            log.warning("sandbox.group_not_recorded", group=group, error=str(error))
            return None
        return path

    def sweep(self) -> int:
        """Kill the recorded groups whose executor is gone, remove their run
        directories and entries; returns how many groups were found still running."""
        if os.getpid() != self._owner[0]:  # a fork: its own owner
            self._owner = (os.getpid(), start_time(os.getpid()) or 0)
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return 0
        running = 0
        for name in names:
            entry = GroupEntry.parse(name)
            if entry is None or (entry.boot == self._boot and entry.owner_alive()):
                continue
            if entry.boot == self._boot and _kill_group(entry):
                running += 1
                log.warning("sandbox.orphans_killed", group=entry.group, run_dir=entry.run_dir,
                            executor=entry.owner_pid)
            _remove_run_dir(self.work_root / entry.run_dir)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.folder / name)
        return running


def _kill_group(entry: GroupEntry) -> bool:
    """SIGKILL the entry's group if it is the run's (see the module docstring); True
    when some process of it was there to kill."""
    leader = start_time(entry.group)
    if leader is not None and leader != entry.leader_start:
        return False  # the pid was given out again: not the run's group
    try:
        os.killpg(entry.group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _remove_run_dir(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        remove_tree(path)


_SHARED: dict[Path, HostGroups] = {}


def host_groups(work_root: Path) -> HostGroups:
    """The HostGroups of `work_root` in this process; made (and swept) on first use."""
    key = work_root.absolute()
    groups = _SHARED.get(key)
    if groups is None or groups._owner[0] != os.getpid():
        groups = _SHARED[key] = HostGroups(key)
        groups.sweep()
    return groups
