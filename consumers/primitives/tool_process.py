"""The process core of the subprocess primitive: spawn one tool process and watch it.

Protocol: parameters as one JSON object on stdin (then closed), result on stdout, logs
on stderr, exit 0 = success. The argv list is executed directly, never via a shell.

The child starts in its run directory with exactly the plan's environment plus a
default PATH (when the plan has none) and HOME = TMPDIR = that directory, in its own
session and process group, under rlimits set between fork and exec: by util-linux
`prlimit` in front of the command when it is installed (the same process execs the
tool, so pid, group and limits are the tool's), otherwise by a `preexec_fn`. A
`preexec_fn` forces a full fork of this (large) Python process (~4 ms in an 86 MB
process on these machines against ~0.1 ms for the prlimit exec); without preexec_fn
Popen uses vfork. The Landlock sandbox pays that fork on purpose: its child sets its
rlimits and enters its ruleset there (`Launch.entry`), which is cheaper than a wrapper.
A tool on the host (Landlock, rlimits, none) also dies with the executor: its
parent-death signal is set there, or by util-linux `setpriv` exec'ing it, and its
group is written down until it is killed (`host_groups`).

The hot path avoids helper threads: the process is spawned with `subprocess.Popen`
(as asyncio itself does), its pipes are read by event-loop readers that keep at most
the configured number of bytes (and discard the rest, so the child never blocks), and
its exit is watched through a pidfd and reaped with `wait4`, which also yields the
child's resource usage. At the leader's exit (while it is still a zombie, so its pid
cannot have been reused) and on timeout or cancellation the whole process group is
killed with SIGKILL, so grandchildren never outlive the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import resource
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from consumers.primitives.host_groups import host_groups
from consumers.primitives.run_directory import RunDirectory
from consumers.primitives.sandbox_launch import Launch
from consumers.primitives.sandboxes import PRLIMIT_OPTIONS, RLimit, apply_rlimits, die_with
from domain.errors import ExecutionError
from domain.model import ResourceLimits

TAIL_BYTES = 4096
"""What a capture keeps of a stream past its cap (the out-of-memory scan reads it)."""
EXIT_POLL_SECONDS = 0.005
REAP_GRACE_SECONDS = 5.0
_READ_SIZE = 65536
_PIPE_GRACE_SECONDS = 1.0
_EXIT_READS = 8
"""Reads per pipe at the exit (a writer still alive is left to the pipe's reader)."""


@functools.cache
def _prlimit_binary() -> str | None:
    return shutil.which("prlimit", path="/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin")

def _command(argv: tuple[str, ...], env: dict[str, str], cwd: Path,
             rlimits: tuple[RLimit, ...],
             launch: Launch) -> tuple[list[str], Callable[[], None] | None]:
    """The argv to exec and the preexec_fn (None when prlimit applies the limits). A
    tool on the host (`Launch.host_group`) dies with this process: the preexec_fn,
    or `setpriv` in front of the tool, sets its parent-death signal."""
    wrapper = launch.prefix
    if wrapper or launch.entry is not None:
        require_executable(argv[0], env["PATH"], cwd)  # bwrap would only say "exit 1"
    if launch.entry is not None:  # the child restricts itself: set its limits there too
        return [*argv], functools.partial(_enter, rlimits, launch.entry, os.getpid())
    guard = _death_guard() if launch.host_group else []
    if not rlimits:
        if guard:
            require_executable(argv[0], env["PATH"], cwd)  # setpriv would only say "exit 127"
        return [*guard, *wrapper, *argv], None
    prlimit = _prlimit_binary()
    if prlimit is None:
        if launch.host_group:
            return [*wrapper, *argv], functools.partial(_host_child, rlimits, os.getpid())
        return [*wrapper, *argv], functools.partial(apply_rlimits, rlimits)
    require_executable(argv[0], env["PATH"], cwd)  # prlimit would only say "exit 127"
    options = [f"--{PRLIMIT_OPTIONS[kind]}={soft}:{hard}" for kind, soft, hard in rlimits]
    return [prlimit, *options, "--", *guard, *wrapper, *argv], None


def _death_guard() -> list[str]:
    """`setpriv` setting the parent-death signal of the process it execs (nothing
    where util-linux's setpriv is missing: the sweep of `host_groups` is left)."""
    setpriv = _setpriv_binary()
    return [] if setpriv is None else [setpriv, "--pdeathsig", "KILL", "--"]


@functools.cache
def _setpriv_binary() -> str | None:
    return shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin")


def _enter(rlimits: tuple[RLimit, ...], entry: Callable[[], None], parent: int) -> None:
    """Runs in the child between fork and exec: dies with `parent`, then its limits,
    then its sandbox."""
    _host_child(rlimits, parent)
    entry()


def _host_child(rlimits: tuple[RLimit, ...], parent: int) -> None:
    """Runs in the child between fork and exec: dies with `parent`, then its limits."""
    die_with(parent)
    apply_rlimits(rlimits)


def require_executable(program: str, path: str, cwd: Path) -> None:
    found = (os.access(cwd / program, os.X_OK) and (cwd / program).is_file()) \
        if "/" in program else shutil.which(program, path=path) is not None
    if not found:
        raise ExecutionError(f"executable not found: {program}", code="E3401",
                             details={"argv0": program, "path": path})


def spawn(argv: tuple[str, ...], env: dict[str, str], run_dir: RunDirectory,
          rlimits: tuple[RLimit, ...], launch: Launch) -> subprocess.Popen[bytes]:
    """Start `argv` (behind the launch's wrapper) in its own session and group."""
    if not argv:
        raise ExecutionError("the plan has an empty argv", code="E3401")
    command, preexec = _command(argv, env, run_dir.lookup, rlimits, launch)
    cwd = run_dir.start
    try:
        popen = subprocess.Popen(  # noqa: S603 - an argv list, never a shell
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, cwd=cwd, preexec_fn=preexec,
            start_new_session=True, bufsize=0, pass_fds=launch.pass_fds,
        )
        launch.spawned()
        if launch.host_group and run_dir.host_root is not None:
            entry = host_groups(run_dir.host_root).record(popen.pid, run_dir.path)
            if entry is not None:
                run_dir.forget_with(entry)
        return popen
    except FileNotFoundError as error:
        what = "working directory" if error.filename == str(cwd) else "executable"
        raise ExecutionError(f"{what} not found: {error.filename or argv[0]}", code="E3401",
                             details={"argv0": argv[0], "path": env["PATH"]}) from error
    except PermissionError as error:
        raise ExecutionError(f"executable not runnable (permission denied): {argv[0]}",
                             code="E3401", details={"argv0": argv[0]}) from error
    except subprocess.SubprocessError as error:
        what = "the landlock sandbox" if launch.entry is not None else "the sandbox limits"
        raise ExecutionError(f"could not apply {what} in the tool's process: {error}",
                             code="E3405",
                             details={"rlimits": [list(r) for r in rlimits]}) from error
    except OSError as error:
        raise ExecutionError(f"could not start {argv[0]}: {error.strerror}", code="E3401",
                             details={"argv0": argv[0], "errno": error.errno}) from error


class Capture:
    """Keeps the first `cap` bytes of a stream and a short tail of what came after."""

    __slots__ = ("cap", "data", "truncated", "_tail")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.truncated = False
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if len(chunk) <= room:
            self.data += chunk
            return
        if room > 0:
            self.data += chunk[:room]
            chunk = chunk[room:]
        self.truncated = True
        self._tail = (self._tail + chunk)[-TAIL_BYTES:]

    def tail(self, size: int) -> bytes:
        """The last `size` bytes seen (across the cap when the stream was truncated)."""
        return (bytes(self.data[-size:]) + self._tail)[-size:]


class ToolProcess:
    """One running child: its pipes on event-loop readers, its exit on a pidfd."""

    def __init__(self, popen: subprocess.Popen[bytes], limits: ResourceLimits) -> None:
        self._loop = asyncio.get_running_loop()
        self._popen = popen
        self.pid = popen.pid
        self.stdout = Capture(limits.stdout_max_bytes)
        self.stderr = Capture(limits.stderr_max_bytes)
        self.inherited_rss = self._parent_rss()
        self._exited: asyncio.Future[tuple[int | None, Any]] = self._loop.create_future()
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] = self._loop.create_future()
        self._open_pipes = 0
        self._stdin_rest = memoryview(b"")
        self._watch_pipe(popen.stdout, self.stdout)
        self._watch_pipe(popen.stderr, self.stderr)
        self._pidfd = self._watch_exit()

    def _parent_rss(self) -> int | None:
        """The peak RSS of the process the tool was forked from (this one): a child's
        peak at or below it may be the one it inherited."""
        return max_rss(resource.getrusage(resource.RUSAGE_SELF))

    # -- stdin ---------------------------------------------------------------------

    def send_stdin(self, data: bytes) -> None:
        """Write the parameters and close stdin, without blocking the loop."""
        pipe = self._popen.stdin
        assert pipe is not None
        os.set_blocking(pipe.fileno(), False)
        self._stdin_rest = memoryview(data)
        self._write_stdin(first=True)

    def _write_stdin(self, first: bool = False) -> None:
        pipe = self._popen.stdin
        if pipe is None or pipe.closed:
            return
        try:
            written = os.write(pipe.fileno(), self._stdin_rest) if self._stdin_rest else 0
        except BlockingIOError:
            written = 0
        except OSError:  # the child closed stdin or exited: it does not want the rest
            self._close_stdin()
            return
        self._stdin_rest = self._stdin_rest[written:]
        if not self._stdin_rest:
            self._close_stdin()
        elif first:
            self._loop.add_writer(pipe.fileno(), self._write_stdin)

    def _close_stdin(self) -> None:
        pipe = self._popen.stdin
        if pipe is not None and not pipe.closed:
            self._loop.remove_writer(pipe.fileno())
            pipe.close()

    # -- stdout / stderr -----------------------------------------------------------

    def _watch_pipe(self, pipe: Any, capture: Capture) -> None:
        fd = pipe.fileno()
        os.set_blocking(fd, False)
        self._open_pipes += 1
        self._loop.add_reader(fd, self._read, pipe, capture)

    def _read(self, pipe: Any, capture: Capture) -> None:
        if not drain_into(pipe, capture):
            self._close_pipe(pipe)

    def _read_pipes_now(self) -> None:
        """At the tool's exit its pipes usually hold their last bytes and end of
        file already: read them here rather than in further rounds of the event loop
        (a pipe still held open by another process is left to its reader)."""
        for pipe, capture in ((self._popen.stdout, self.stdout),
                              (self._popen.stderr, self.stderr)):
            if pipe is None or pipe.closed:
                continue
            for _ in range(_EXIT_READS):
                chunk = read_chunk(pipe)
                if chunk is None:
                    break
                if not chunk:
                    self._close_pipe(pipe)
                    break
                capture.feed(chunk)

    def _close_pipe(self, pipe: Any) -> None:
        if pipe.closed:
            return
        self._loop.remove_reader(pipe.fileno())
        pipe.close()
        self._open_pipes -= 1
        if self._open_pipes == 0 and not self._drained.done():
            self._drained.set_result(None)

    # -- exit ----------------------------------------------------------------------

    def _watch_exit(self) -> int | None:
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:  # no pidfd support: poll instead
            self._loop.call_later(EXIT_POLL_SECONDS, self._poll_exit)
            return None
        self._loop.add_reader(pidfd, self._reap)
        return pidfd

    def _poll_exit(self) -> None:
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = True  # reaped elsewhere; _reap records that
        if info is None:
            self._loop.call_later(EXIT_POLL_SECONDS, self._poll_exit)
        else:
            self._reap()

    def _reap(self) -> None:
        # The leader is a zombie now, so its pid (= the group id) is still reserved:
        # killing the group here cannot hit an unrelated process.
        self.kill_group()
        try:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status, usage = self.pid, None, None
        if pid == 0:
            return  # spurious wake-up
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if status is not None:
            self._popen.returncode = os.waitstatus_to_exitcode(status)
        self._set_exited(status, usage)

    def _set_exited(self, status: int | None, usage: Any) -> None:
        """Record the end (the first one wins), read what the pipes hold now and
        wake `wait` at once."""
        if not self._exited.done():
            self._exited.set_result((status, usage))
            self._read_pipes_now()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def kill_group(self) -> None:
        """SIGKILL every process of the child's group (its own session)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    async def wait(self, timeout: float) -> bool:
        """Wait for exit and drained pipes. False when `timeout` expired first (the
        group is then killed and reaped)."""
        try:
            if not self._exited.done():
                # a future of its own, awaited directly: the exit wakes this task in
                # one step (a shield of `_exited` takes two), and a timeout or a
                # cancellation cancels it, never `_exited`
                self._waiter = self._loop.create_future()
                async with asyncio.timeout(timeout):
                    await self._waiter
        except TimeoutError:
            self.kill_group()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exited), REAP_GRACE_SECONDS)
            await self._drain()
            return False
        except asyncio.CancelledError:  # the run was cancelled: same kill as a timeout
            self.kill_group()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exited), REAP_GRACE_SECONDS)
            raise
        await self._drain()
        return True

    async def _drain(self) -> None:
        # Pipes held open by a process that left the group (setsid) are abandoned.
        if self._drained.done():
            return  # no round through the event loop
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._drained), _PIPE_GRACE_SECONDS)

    def exit_status(self) -> tuple[int | None, Any]:
        """(wait status, rusage) once reaped, (None, None) otherwise."""
        return self._exited.result() if self._exited.done() else (None, None)

    def release(self) -> None:
        """Close our ends of the pipes; on an abandoned run (cancellation) kill the
        group. The exit watcher stays armed until the child is reaped."""
        if not self._exited.done():
            self.kill_group()
        self._close_stdin()
        for pipe in (self._popen.stdout, self._popen.stderr):
            if pipe is not None:
                self._close_pipe(pipe)



def drain_into(pipe: Any, capture: Capture) -> bool:
    """Read what a non-blocking pipe holds into `capture`; False at end of file."""
    chunk = read_chunk(pipe)
    if chunk:
        capture.feed(chunk)
    return chunk is None or bool(chunk)


def read_chunk(pipe: Any) -> bytes | None:
    """One read of a non-blocking pipe: its bytes, b"" at end of file (or a read
    error), None when it holds nothing now."""
    try:
        return os.read(pipe.fileno(), _READ_SIZE)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def max_rss(usage: Any) -> int | None:
    return None if usage is None else int(usage.ru_maxrss) * 1024
