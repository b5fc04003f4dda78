"""A tool on the host (Landlock, rlimits) does not outlive an executor killed with
SIGKILL: its leader dies with the executor, and the processes it forked are killed by
the next executor that starts on the same work root (consumers.primitives.host_groups).
Real processes throughout: an executor process runs a tool that forks a child, and
the test kills the executor."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.primitives import landlock
from consumers.primitives.file_store import ContentStore
from consumers.primitives.host_groups import FOLDER, GroupEntry, HostGroups, boot_id, start_time
from consumers.primitives.runner import Primitives
from domain.model import SubprocessPlan
from tests.waiting import until

pytestmark = pytest.mark.security

SANDBOXES = [
    "rlimits",
    pytest.param("landlock", marks=pytest.mark.skipif(not landlock.available(),
                                                      reason="no Landlock in this kernel")),
]

EXECUTOR = """
import asyncio, hashlib, sys
from pathlib import Path
from consumers.primitives.file_store import ContentStore
from consumers.primitives.runner import Primitives
from domain.model import SubprocessPlan
from domain.model import SubprocessPlan, ToolFile

root, sandbox = Path(sys.argv[1]), sys.argv[2]
source = b'''
import os, subprocess, time
child = subprocess.Popen(["sleep", "600"])
home = os.environ["HOME"]
with open(os.path.join(home, "pids.tmp"), "w") as pids:
    pids.write(f"{os.getpid()} {child.pid}")
os.rename(os.path.join(home, "pids.tmp"), os.path.join(home, "pids"))
time.sleep(600)
'''
plan = SubprocessPlan(argv=("python3", "main.py"), timeout_seconds=300, files=(
    ToolFile("main.py", hashlib.sha256(source).hexdigest(), False, source),))

async def main():
    primitives = Primitives(ContentStore(root / "cas"), root / "work", sandbox=sandbox)
    await primitives.run(plan, {}, secrets=lambda name: None)

asyncio.run(main())
"""


def _gone(pid: int) -> bool:
    """True once `pid` has exited (gone, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except FileNotFoundError:
        return True


def _pids(work: Path) -> tuple[int, int] | None:
    for found in work.glob("run-*/pids"):
        leader, child = found.read_text().split()
        return int(leader), int(child)
    return None


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_tool_and_its_children_do_not_outlive_a_killed_executor(tmp_path: Path,
                                                                   sandbox: str) -> None:
    work = tmp_path / "work"
    executor = subprocess.Popen([sys.executable, "-c", EXECUTOR, str(tmp_path), sandbox],
                                cwd=Path(__file__).resolve().parents[2])
    group: int | None = None
    try:
        leader, child = until(lambda: _pids(work), "the tool started and forked")
        group = leader
        entries = [GroupEntry.parse(name) for name in os.listdir(work / FOLDER)]
        assert [(e.owner_pid, e.group) for e in entries if e] == [(executor.pid, leader)]
        executor.send_signal(signal.SIGKILL)
        executor.wait()
        until(lambda: _gone(leader), "the tool's leader died with its executor")
        assert not _gone(child), "the forked child is left for the next executor"
        Primitives(ContentStore(tmp_path / "cas"), work, sandbox=sandbox)  # the next one
        until(lambda: _gone(child), "the next executor killed the forked child")
        assert os.listdir(work / FOLDER) == []
        assert list(work.glob("run-*")) == []
    finally:
        executor.kill()
        executor.wait()
        if group is not None:  # whatever a failure left
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


async def test_a_finished_run_leaves_no_entry(tmp_path: Path) -> None:
    primitives = Primitives(ContentStore(tmp_path / "cas"), tmp_path / "work",
                            sandbox="rlimits")
    plan = SubprocessPlan(argv=("sh", "-c", "sleep 600 & cat"), timeout_seconds=60)
    outcome = await primitives.run(plan, {"x": 1}, secrets=lambda name: None)
    assert outcome.ok, outcome.error
    assert json.loads(outcome.stdout) == {"x": 1}
    assert os.listdir(tmp_path / "work" / FOLDER) == []
    assert list((tmp_path / "work").glob("run-*")) == []


def _dead_pid() -> int:
    probe = subprocess.Popen(["true"])
    probe.wait()
    return probe.pid


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process leading a group of its own, standing for a tool's."""
    process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _recorded(root: Path, entry: GroupEntry, *, run_dir: bool = False) -> Path:
    (root / FOLDER).mkdir()
    (root / FOLDER / entry.name).touch()
    if run_dir:
        (root / entry.run_dir).mkdir()
    return root / FOLDER / entry.name


def test_a_group_of_a_live_executor_is_left_alone(tmp_path: Path,
                                                  sleeper: subprocess.Popen[bytes]) -> None:
    entry = _recorded(tmp_path, GroupEntry(boot_id(), os.getpid(), start_time(os.getpid()) or 0,
                                           sleeper.pid, start_time(sleeper.pid) or 0, "run-live"))
    assert HostGroups(tmp_path).sweep() == 0
    assert sleeper.poll() is None
    assert entry.exists()


def test_a_pid_given_out_again_is_not_killed(tmp_path: Path,
                                             sleeper: subprocess.Popen[bytes]) -> None:
    """The recorded leader's pid now belongs to another process (another start time):
    the entry goes, the process stays."""
    _recorded(tmp_path, GroupEntry(boot_id(), _dead_pid(), 1, sleeper.pid,
                                   (start_time(sleeper.pid) or 0) - 1, "run-old"), run_dir=True)
    assert HostGroups(tmp_path).sweep() == 0
    assert sleeper.poll() is None
    assert os.listdir(tmp_path / FOLDER) == []
    assert not (tmp_path / "run-old").exists()


def test_a_group_of_a_dead_executor_is_killed(tmp_path: Path,
                                              sleeper: subprocess.Popen[bytes]) -> None:
    _recorded(tmp_path, GroupEntry(boot_id(), _dead_pid(), 1, sleeper.pid,
                                   start_time(sleeper.pid) or 0, "run-orphaned"), run_dir=True)
    assert HostGroups(tmp_path).sweep() == 1
    assert sleeper.wait() == -signal.SIGKILL
    assert not (tmp_path / "run-orphaned").exists()


def test_an_entry_of_an_earlier_boot_kills_nothing(tmp_path: Path,
                                                   sleeper: subprocess.Popen[bytes]) -> None:
    """After a reboot no process of that entry is left: whatever has its numbers now
    is another's. Its run directory goes."""
    _recorded(tmp_path, GroupEntry("0" * 32, _dead_pid(), 1, sleeper.pid,
                                   start_time(sleeper.pid) or 0, "run-before"), run_dir=True)
    assert HostGroups(tmp_path).sweep() == 0
    assert sleeper.poll() is None
    assert os.listdir(tmp_path / FOLDER) == []
    assert not (tmp_path / "run-before").exists()


@pytest.mark.parametrize("name", ["b-1-2-3-4-run-../../etc", "b-1-2-3-4-notarun",
                                  "b-x-2-3-4-run-a", "b-1-2-3-run-a", "1-2-3-4-run-a",
                                  ".hidden"])
def test_names_that_are_not_entries_are_ignored(name: str) -> None:
    assert GroupEntry.parse(name) is None
