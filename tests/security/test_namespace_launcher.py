"""The namespace launcher itself: hostile requests, its death and restart, runs side by
side, and the limits and endings a run reports (the isolation a tool sees is
tests/security/test_sandbox.py, run under the launcher and bubblewrap both)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

from consumers.primitives import launcher_program, namespace_launcher
from consumers.primitives.file_store import ContentStore
from consumers.primitives.namespace_process import current_launcher
from consumers.primitives.subprocess_primitive import run_subprocess
from domain.errors import ExecutionError
from domain.model import PrimitiveOutcome, ResourceLimits, SubprocessPlan, ToolFile
from domain.sandbox_policy import SandboxPolicy
from tests.waiting import WAIT, process_gone, until

pytestmark = [
    pytest.mark.security,
    pytest.mark.skipif(not namespace_launcher.usable(),
                       reason="the namespace launcher needs root"),
]

POLICY = SandboxPolicy()
RUN_UIDS = range(POLICY.run_uid_base, POLICY.run_uid_base + POLICY.run_uid_count)


def _plan(source: str, **changes: Any) -> SubprocessPlan:
    content = textwrap.dedent(source).encode()
    file = ToolFile("main.py", hashlib.sha256(content).hexdigest(), False, content)
    changes.setdefault("timeout_seconds", 60)
    return SubprocessPlan(argv=("python3", "main.py"), files=(file,), **changes)


async def _run(tmp_path: Path, source: str, **changes: Any) -> PrimitiveOutcome:
    return await run_subprocess(_plan(source, **changes), {},
                                store=ContentStore(tmp_path / "cas"),
                                work_root=tmp_path / "work", sandbox="namespaces")


def _marked(code: str, marker: str) -> str:
    """A tool source that becomes `python -c code` with `marker` in its command line,
    where the host can find it."""
    return (f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', "
            f"{textwrap.dedent(code) + '# ' + marker!r}])\n")


def _run_processes(marker: str) -> list[tuple[int, int]]:
    """(host pid, uid) of every host process whose command line holds `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker.encode() not in Path(f"/proc/{entry}/cmdline").read_bytes():
                continue
            status = Path(f"/proc/{entry}/status").read_text()
            uid = int(next(line for line in status.splitlines()
                           if line.startswith("Uid:")).split()[1])
            found.append((int(entry), uid))
    return found


async def _wait_for_run(marker: str) -> list[tuple[int, int]]:
    return await asyncio.to_thread(until, lambda: _run_processes(marker),
                                   f"a process marked {marker}")


async def _start_request(request: dict[str, Any]) -> None:
    """Send `request` to the launcher with three fresh pipes; raises its answer."""
    launcher = current_launcher()
    (stdin, feed), (stdout_read, stdout), (stderr_read, stderr) = (
        os.pipe2(os.O_CLOEXEC) for _ in range(3))
    try:
        handle = await launcher.start_run(request, [stdin, stdout, stderr])
    finally:
        for fd in (stdin, feed, stdout, stderr):
            os.close(fd)
    try:
        status, _usage = await handle.exited
        message = await asyncio.to_thread(os.read, stderr_read, 4096)
    finally:
        os.close(stdout_read)
        os.close(stderr_read)
    raise ExecutionError(f"exited {status}: {message!r}", code="E3401")


_GOOD = {"argv": ["/usr/bin/true"], "env": {"PATH": "/usr/bin"}, "cwd": "/", "uid": 200999,
         "gid": 200999, "rlimits": [], "system": [["ro_bind", "/usr", "/usr"]], "mounts": []}


@pytest.mark.parametrize("hostile", [
    {"argv": []},
    {"argv": ["/usr/bin/true\0--evil"]},
    {"env": {"A=B": "x"}},
    {"uid": 0},
    {"cwd": "relative"},
    {"rlimits": [["a", 1, 2]]},
    {"mounts": "everything"},
    {"system": [["ro_bind", {"not": "a path"}, "/x"]]},
    {"mounts": [[{"deep": "object"}]]},
])
async def test_a_malformed_request_is_refused_and_the_launcher_lives_on(
        tmp_path: Path, hostile: dict[str, Any]) -> None:
    with pytest.raises(ExecutionError) as refused:
        await _start_request(_GOOD | hostile)
    assert refused.value.code == "E3405" and "malformed request" in refused.value.message
    outcome = await _run(tmp_path, "print('still serving')")
    assert outcome.ok and outcome.stdout == b"still serving\n", outcome.error


@pytest.mark.parametrize("step", [
    ["ro_bind", "/usr", "/../../etc"],
    ["ro_bind", "/nonexistent-source", "/x"],
    ["unknown_step", "/x"],
    ["proc"],
    ["tmpfs", "/tmp", "not a mode", 1],
])
@pytest.mark.parametrize("part", ["system", "mounts"])
async def test_a_mount_step_that_cannot_be_made_fails_that_run_only(
        tmp_path: Path, step: list[Any], part: str) -> None:
    with pytest.raises(ExecutionError) as failed:
        await _start_request(_GOOD | {part: [*_GOOD[part], step]})
    # refused by the launcher (a host path it cannot copy), or by the run's PID 1
    assert ("toolexec-launcher: " in failed.value.message
            or "the run cannot start" in failed.value.message), failed.value.message
    outcome = await _run(tmp_path, "print('still serving')")
    assert outcome.ok, outcome.error


async def test_a_request_the_executor_cannot_send_is_E3401_or_E3405(tmp_path: Path) -> None:
    outcome = await _run(tmp_path, "print(1)", env={"BAD": "a\0b"})
    assert not outcome.ok and outcome.error["code"] in ("E3401", "E3405")


async def test_the_launcher_restarts_after_being_killed(tmp_path: Path) -> None:
    first = await _run(tmp_path, "print('one')")
    assert first.ok, first.error
    killed = current_launcher().pid
    os.kill(killed, signal.SIGKILL)
    await asyncio.to_thread(until, lambda: process_gone(killed), "the launcher dead")
    second = await _run(tmp_path, "print('two')")
    assert second.ok and second.stdout == b"two\n", second.error
    assert current_launcher().pid != killed


async def test_a_runs_processes_die_with_the_launcher(tmp_path: Path) -> None:
    marker = "launcher-death-marker"
    run = asyncio.create_task(_run(tmp_path, _marked(f"""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c",
                                  "import os, time; os.setsid(); time.sleep(600)  # {marker}"])
        time.sleep(600)
    """, marker)))
    seen = await asyncio.to_thread(until, lambda: len(found := _run_processes(marker)) >= 2
                                   and found, "the tool and its child running")
    os.kill(current_launcher().pid, signal.SIGKILL)
    outcome = await run
    assert not outcome.ok
    await asyncio.to_thread(until, lambda: all(process_gone(pid) for pid, _ in
                                               _run_processes(marker)),
                            "every process of the run gone")
    assert all(uid in RUN_UIDS for _pid, uid in seen)  # they ran, as the run's own uid


async def test_two_runs_side_by_side_cannot_see_reach_or_signal_each_other(
        tmp_path: Path) -> None:
    listener = asyncio.create_task(_run(tmp_path, _marked("""
        import socket, time
        server = socket.socket()
        server.bind(("127.0.0.1", 47011))
        server.listen()
        time.sleep(600)
    """, "listener-marker")))
    try:
        (listening_pid, listening_uid), = await _wait_for_run("listener-marker")
        await asyncio.to_thread(until, lambda: ":B7A3 " in Path(
            f"/proc/{listening_pid}/net/tcp").read_text(), "the listener listening")
        prober = await _run(tmp_path, """
            import json, os, signal, socket
            pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
            try:
                socket.create_connection(("127.0.0.1", 47011), timeout=5)
                reached = True
            except OSError:
                reached = False
            signalled = []
            for pid in range(1, 1000):
                if pid != os.getpid():
                    try:
                        os.kill(pid, signal.SIGKILL)
                        signalled.append(pid)
                    except OSError:
                        pass
            print(json.dumps({"pids": pids, "reached": reached, "signalled": signalled,
                              "uid": os.getuid()}))
        """)
        assert prober.ok, (prober.error, prober.stderr)
        seen = json.loads(prober.stdout)
        assert seen["reached"] is False
        assert seen["signalled"] == []  # not even its own PID 1 (root, its init)
        assert len(seen["pids"]) <= 3  # its PID 1, itself (and nothing of the other run)
        assert seen["uid"] != listening_uid and listening_uid in RUN_UIDS
        assert not process_gone(listening_pid)
        assert not listener.done()
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
    await asyncio.to_thread(until, lambda: process_gone(listening_pid),
                            "the cancelled run's process gone")


async def test_limits_and_endings_are_reported_as_under_any_sandbox(tmp_path: Path) -> None:
    cpu = await _run(tmp_path, "while True: pass", limits=ResourceLimits(cpu_seconds=1))
    assert cpu.error is not None and cpu.error["code"] == "E3407", cpu.error
    memory = await _run(tmp_path, "blob = bytearray(512 * 1024 * 1024)",
                        limits=ResourceLimits(memory_bytes=64 * 1024 * 1024))
    assert memory.error is not None and memory.error["code"] == "E3403", memory.error
    crash = await _run(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert crash.error is not None and crash.error["code"] == "E3404"
    assert crash.exit_code == -signal.SIGSEGV
    failed = await _run(tmp_path, "raise SystemExit(3)")
    assert failed.error is not None and failed.error["code"] == "E3401"
    assert failed.exit_code == 3
    big = await _run(tmp_path, """
        import os
        fd, written = os.open("big", os.O_WRONLY | os.O_CREAT), 0
        try:
            while written < 8192:
                written += os.write(fd, b"x" * 512)
        except OSError as error:
            print(written, error.errno)
    """, limits=ResourceLimits(max_file_bytes=1024))
    assert big.ok and big.stdout == b"1024 27\n", (big.error, big.stdout)  # EFBIG


async def test_a_timeout_kills_the_whole_namespace(tmp_path: Path) -> None:
    marker = "timeout-marker"
    outcome = await _run(tmp_path, _marked(f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); "
                          "time.sleep(600)  # {marker}"])
        time.sleep(600)
    """, marker), timeout_seconds=3)
    assert outcome.error is not None and outcome.error["code"] == "E3402"
    await asyncio.to_thread(until, lambda: all(process_gone(pid) for pid, _ in
                                               _run_processes(marker)),
                            "every process of the run gone")


def _children(pid: int) -> list[int]:
    """The live children of `pid` (the PID 1s its launcher cloned)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return [child for child in found if not _gone(child)]


def _gone(pid: int) -> bool:
    try:
        return process_gone(pid)
    except ProcessLookupError:  # it went between the open and the read of its stat
        return True


async def test_a_run_goes_straight_to_its_prepared_pid1_even_with_the_launcher_stopped(
        tmp_path: Path) -> None:
    first = await _run(tmp_path, "print('one')")
    assert first.ok, first.error
    launcher = current_launcher().pid
    await asyncio.to_thread(until, lambda: _children(launcher), "a PID 1 cloned ahead")
    os.kill(launcher, signal.SIGSTOP)
    try:  # the launcher cannot answer anything now: the run needs it not
        second = await asyncio.wait_for(_run(tmp_path, "print('two')"), WAIT)
    finally:
        os.kill(launcher, signal.SIGCONT)
    assert second.ok and second.stdout == b"two\n", second.error


async def test_a_prepared_pid1_killed_while_it_waits_is_replaced(tmp_path: Path) -> None:
    first = await _run(tmp_path, "print('one')")
    assert first.ok, first.error
    launcher = current_launcher().pid
    waiting = await asyncio.to_thread(until, lambda: _children(launcher),
                                      "a PID 1 cloned ahead")
    for pid in waiting:
        with contextlib.suppress(ProcessLookupError):  # the last run's, ending
            os.kill(pid, signal.SIGKILL)
    await asyncio.to_thread(until, lambda: all(_gone(pid) for pid in waiting),
                            "the PID 1s killed")
    for text in ("two", "three"):
        outcome = await _run(tmp_path, f"print({text!r})")
        assert outcome.ok and outcome.stdout == f"{text}\n".encode(), outcome.error
    assert current_launcher().pid == launcher
    await asyncio.to_thread(until, lambda: len(_children(launcher)) == 1,
                            "one PID 1 cloned ahead again, not more")


async def test_what_the_executor_holds_of_a_pid1_never_reaches_another_program(
        tmp_path: Path) -> None:
    outcome = await _run(tmp_path, "print('one')")
    assert outcome.ok, outcome.error

    def pidfds() -> list[int]:
        found = []
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[pidfd]":
                    found.append(int(name))
        return found

    held = await asyncio.to_thread(until, pidfds, "a spare PID 1's pidfd held")
    assert not any(os.get_inheritable(fd) for fd in held)


async def test_runs_side_by_side_get_more_pid1s_cloned_ahead_up_to_the_bound(
        tmp_path: Path) -> None:
    first = await _run(tmp_path, "print('one')")
    assert first.ok, first.error
    launcher = current_launcher().pid
    for _ in range(3):  # runs that find no spare while others are in flight ask for more
        outcomes = await asyncio.gather(*(_run(tmp_path, f"print({n})") for n in range(6)))
        assert all(o.ok and o.stdout == f"{n}\n".encode()
                   for n, o in enumerate(outcomes)), [o.error for o in outcomes]
    await asyncio.to_thread(until, lambda: len(_children(launcher)) > 1,
                            "more than one PID 1 cloned ahead")
    assert len(_children(launcher)) <= launcher_program.MAX_SPARES + 6  # + runs ending
    assert current_launcher().pid == launcher


async def test_spares_cloned_for_a_burst_are_retired_once_runs_go_one_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(namespace_launcher, "SPARES_REVIEW_SECONDS", 0.3)
    first = await _run(tmp_path, "print('one')")
    assert first.ok, first.error
    launcher = current_launcher().pid
    for _ in range(3):
        outcomes = await asyncio.gather(*(_run(tmp_path, f"print({n})") for n in range(6)))
        assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    await asyncio.to_thread(until, lambda: len(_children(launcher)) > 1,
                            "more than one PID 1 cloned ahead")

    async def one_spare_left() -> bool:
        outcome = await _run(tmp_path, "print('alone')")  # one at a time: one spare wanted
        assert outcome.ok and outcome.stdout == b"alone\n", outcome.error
        return await asyncio.to_thread(lambda: len(_children(launcher)) == 1)

    for _ in range(600):
        if await one_spare_left():
            break
        await asyncio.sleep(0.2)
    assert len(_children(launcher)) == 1, "the spares of the burst are still there"
    outcome = await _run(tmp_path, "print('still served')")
    assert outcome.ok and outcome.stdout == b"still served\n", outcome.error
    assert current_launcher().pid == launcher


@pytest.mark.parametrize("spares", [0, launcher_program.MAX_SPARES + 1, True, "8", None])
async def test_a_prepare_asking_for_a_bad_number_of_spares_is_refused(
        tmp_path: Path, spares: Any) -> None:
    assert "malformed request: spares" in await _refused_prepare(tmp_path, spares=spares)
    outcome = await _run(tmp_path, "print('still serving')")
    assert outcome.ok and outcome.stdout == b"still serving\n", outcome.error


async def _refused_prepare(tmp_path: Path, **fields: Any) -> str:
    """After a first run, send the launcher a `prepare` with `fields`; the message of
    the refusal it answers (the test fails if it prepares a PID 1 instead)."""
    first = await _run(tmp_path, "print('one')")
    assert first.ok, first.error
    launcher = current_launcher()
    asked: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    launcher._preparing[-1] = ("a system no run has", asked)
    await launcher._send(json.dumps({"prepare": -1, "system": _GOOD["system"],
                                     **fields}).encode())
    with pytest.raises(ExecutionError) as refused:
        await asyncio.wait_for(asked, WAIT)
    return refused.value.message


async def test_a_tool_runs_under_the_executors_policy_while_the_launcher_is_batch(
        tmp_path: Path) -> None:
    """The launcher and its PID 1s' setup never preempt a tool on wake-up
    (SCHED_BATCH); the tool itself is scheduled as the executor is."""
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the suite runs without chrt
    outcome = await _run(tmp_path, """
        import os
        print(os.sched_getscheduler(0))
    """)
    assert outcome.ok, outcome.error
    assert int(outcome.stdout.decode()) == os.SCHED_OTHER
    assert os.sched_getscheduler(current_launcher().pid) == os.SCHED_BATCH


async def test_a_tool_runs_at_the_executors_nice_value_not_the_launchers(
        tmp_path: Path) -> None:
    outcome = await _run(tmp_path, """
        import os
        print(os.getpriority(os.PRIO_PROCESS, 0))
        try:
            os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) - 1)
            print("raised")
        except PermissionError:
            print("refused")
    """)
    assert outcome.ok, outcome.error
    nice, raised = outcome.stdout.decode().split()
    assert int(nice) == os.getpriority(os.PRIO_PROCESS, 0)
    assert raised == "refused"
    launcher = current_launcher().pid
    assert os.getpriority(os.PRIO_PROCESS, launcher) <= os.getpriority(os.PRIO_PROCESS, 0)


_TMP_SIZE = """
    import os
    found = os.statvfs("/tmp")
    print(found.f_blocks * found.f_frsize, sorted(os.listdir("/tmp")))
    open("/tmp/left-behind", "w").close()
"""


async def test_a_run_gets_its_own_tmpfs_whatever_the_spare_made_ahead(tmp_path: Path) -> None:
    """Spares make the last run's tmpfs and folders ahead; a run laid out otherwise
    (here: another disk quota) gets its own, and no run sees what another left."""
    sizes = [8 << 20, 8 << 20, 16 << 20, 8 << 20]
    for size in sizes:
        outcome = await _run(tmp_path, _TMP_SIZE,
                             limits=ResourceLimits(max_file_bytes=size))
        assert outcome.ok, outcome.error
        shown, listed = outcome.stdout.decode().split(" ", 1)
        assert int(shown) == size
        assert "left-behind" not in listed


@pytest.mark.parametrize("layout", [
    [["ro_bind", "/etc", "/tmp"]],
    [["tmpfs", "/tmp", 511, 1024], ["ro_bind", "/etc", "/tmp/etc"]],
    [["tmpfs", "/tmp", 511, 1024], ["dir", "/elsewhere", 511]],
    "everything",
])
async def test_a_prepare_with_a_layout_that_is_not_a_tmpfs_and_its_folders_is_refused(
        tmp_path: Path, layout: Any) -> None:
    assert "malformed request: a layout" in await _refused_prepare(tmp_path, layout=layout)
    outcome = await _run(tmp_path, "print('still serving')")
    assert outcome.ok and outcome.stdout == b"still serving\n", outcome.error
