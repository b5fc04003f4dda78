"""The subprocess primitive: runs one tool process and reports what it observed.

Protocol: parameters as one JSON object on stdin (then closed), result on stdout, logs
on stderr, exit 0 = success. The argv list is executed directly, never via a shell.

Each run gets a fresh directory under `work_root` (removed afterwards) holding the
tool's files; the child starts there with exactly `plan.env` plus a default PATH (when
the plan has none) and HOME = TMPDIR = that directory, in its own session and process
group, under rlimits set between fork and exec.

Rlimits are set between fork and exec by util-linux `prlimit` when it is installed
(`prlimit --as=S:H ... -- argv`: the same process execs the tool, so pid, group and
limits are the tool's), otherwise by a `preexec_fn`. A `preexec_fn` forces a full
fork of this (large) Python process and costs ~6 ms per spawn in a 70 MB process on
these machines against ~1.4 ms for the prlimit exec; without preexec_fn Popen uses
vfork.

The hot path avoids helper threads: the process is spawned with `subprocess.Popen`
(as asyncio itself does), its pipes are read by event-loop readers that keep at most
the configured number of bytes (and discard the rest, so the child never blocks), and
its exit is watched through a pidfd and reaped with `wait4`, which also yields the
child's resource usage. At the leader's exit (while it is still a zombie, so its pid
cannot have been reused) and on timeout or cancellation the whole process group is
killed with SIGKILL, so grandchildren never outlive the run.

Out-of-memory heuristic (E3403), applied to a run that failed (non-zero exit or a
signal) and did not time out:
1. the last 4 KiB of stderr hold a well-known allocation-failure message: Python
   `MemoryError`, `Cannot allocate memory` (ENOMEM), C++ `std::bad_alloc`,
   `out of memory` (Go, Node, many C programs), Java `OutOfMemoryError`, Rust
   `memory allocation of N bytes failed`; or
2. a memory limit was set and the child died of SIGKILL that we did not send (under
   rlimits the only usual sender is the kernel's OOM killer); or
3. a memory limit was set, the child died of SIGSEGV/SIGBUS/SIGABRT (unchecked
   allocation failures) and its own peak RSS reached 75 % of the limit. Linux keeps
   the peak RSS of the address space a process leaves at exec, and a vfork child
   leaves ours, so `ru_maxrss` up to our own peak says nothing about the tool: only
   a peak above ours counts as the tool's.
A crash that meets none of these is E3404, so an ordinary segfault is not reported
as OOM; the cost is that a C program that crashes on a failed allocation of
untouched (virtual, not resident) memory is reported as a crash.
CPU time (SIGXCPU, or SIGKILL past the hard CPU limit) and file size (SIGXFSZ)
limits are reported as E3407.

Sandboxes (`sandbox=`): "bwrap" runs the tool inside bubblewrap (see
consumers.primitives.bubblewrap) with the same rlimits, set by prlimit outside it;
"landlock" runs it through the Landlock exec wrapper (consumers.primitives.landlock,
landlock_exec), also under prlimit; "rlimits" applies rlimits only; "none" nothing.
What the sandbox gets — the run's own uid, disk quota, paths, egress relay and
proxy — comes from the operator's SandboxPolicy (consumers.primitives.sandbox_launch),
and the plan's limits and timeout are first brought under the policy's ceilings
(domain.sandbox_policy; each value cut down is logged as `sandbox.limits_narrowed`).
A sandbox that cannot be set up (bwrap missing, a kernel without Landlock, or the
wrapper failing before the tool starts) fails the run closed with E3405; falling back
is the operator's explicit choice ("auto" via `resolve_sandbox`).
Under bwrap a tool killed by signal N is seen as exit status 128+N (bwrap's init
reports it so) and is mapped back to the signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from consumers.primitives import bubblewrap, egress_relay, landlock, landlock_exec
from consumers.primitives.file_store import ContentStore, relative_parts
from consumers.primitives.sandbox_launch import Launch, prepare_launch
from domain.errors import ExecutionError, ToolexecError, ValidationFailed
from domain.model import PrimitiveOutcome, ResourceLimits, SubprocessPlan
from domain.sandbox_policy import SandboxPolicy, narrow_subprocess

log = structlog.get_logger(__name__)

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
SANDBOXES: frozenset[str] = frozenset({"bwrap", "landlock", "rlimits", "none"})
NO_SANDBOX = "unavailable"
"""What a strict "auto" resolves to when neither bubblewrap nor Landlock is usable:
every run then fails closed with E3405."""
DEFAULT_POLICY = SandboxPolicy()
_BWRAP_SETUP_FAILURE = b"bwrap: "
STDERR_TAIL_BYTES = 2048
_OOM_SCAN_BYTES = 4096
_READ_SIZE = 65536
_REAP_GRACE_SECONDS = 5.0
_PIPE_GRACE_SECONDS = 1.0
_EXIT_POLL_SECONDS = 0.005
_OOM_RSS_FRACTION = 0.75
_OOM_MARKERS = re.compile(
    rb"\bMemoryError\b|Cannot allocate memory|std::bad_alloc|out of memory"
    rb"|OutOfMemoryError|memory allocation of \d+ bytes failed",
    re.IGNORECASE,
)
_CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT})

RLimit = tuple[int, int, int]
_PRLIMIT_OPTIONS: dict[int, str] = {
    resource.RLIMIT_AS: "as", resource.RLIMIT_CPU: "cpu", resource.RLIMIT_NOFILE: "nofile",
    resource.RLIMIT_FSIZE: "fsize", resource.RLIMIT_NPROC: "nproc",
}


def resolve_sandbox(requested: str, *, strict: bool = False) -> str:
    """The sandbox to run with. "auto" is "bwrap" when bubblewrap is installed, else
    "landlock" when the kernel supports Landlock, else "rlimits" — or, when `strict`
    (the production profile), NO_SANDBOX, so that every run fails closed with E3405.
    Any other name is taken as it is (checked at run time)."""
    if requested != "auto":
        return requested
    if bubblewrap.bwrap_binary() is not None:
        return "bwrap"
    if landlock.available():
        return "landlock"
    return NO_SANDBOX if strict else "rlimits"


async def run_subprocess(plan: SubprocessPlan, params: Mapping[str, Any], *,
                         store: ContentStore, work_root: Path,
                         sandbox: str = "rlimits",
                         policy: SandboxPolicy = DEFAULT_POLICY) -> PrimitiveOutcome:
    """Run `plan` once with `params` on stdin and return what was observed.

    Never raises for tool or plan problems: they come back as an outcome with
    `error = {code, message, details}` (E3301 parameters not JSON, E3105 tampered or
    missing file, E3401 failure / unsafe path / executable not found, E3402 timeout,
    E3403 out of memory, E3404 killed by a signal, E3405 sandbox, E3407 resource
    limit). `duration_ms` covers the whole run, materialisation included.
    """
    started = time.perf_counter()
    plan = narrowed(plan, policy)
    try:
        stdin = _encode_params(params)
        _check_sandbox(sandbox)
        cwd_parts = relative_parts(plan.cwd, allow_root=True)
        workdir = _make_workdir(work_root)
    except ToolexecError as error:
        return _failed(error, started, sandbox)
    launch: Launch | None = None
    try:
        store.materialise(plan.files, workdir)
        cwd = _working_directory(workdir, cwd_parts)
        env = _environment(plan, workdir)
        launch = prepare_launch(sandbox, plan, workdir, cwd, env["PATH"], policy)
        env.update(launch.env)
        rlimits = _rlimits_for(plan.limits, sandbox, launch)
        process = _ToolProcess(_spawn(plan.argv, env, cwd, rlimits, launch), plan.limits)
        return await _supervise(process, stdin, plan, started, sandbox)
    except ToolexecError as error:
        return _failed(error, started, sandbox)
    except OSError as error:  # the run directory could not be prepared (disk full...)
        return _failed(ExecutionError(f"could not prepare the run directory: {error}",
                                      code="E3405"), started, sandbox)
    finally:
        if launch is not None:
            await launch.close()
        _remove_tree(workdir)


def narrowed(plan: SubprocessPlan, policy: SandboxPolicy) -> SubprocessPlan:
    """`plan` under the operator's ceilings; every value cut down is logged."""
    plan, cuts = narrow_subprocess(plan, policy)
    if cuts:
        log.info("sandbox.limits_narrowed", argv0=plan.argv[0] if plan.argv else None,
                 narrowed=[cut.to_dict() for cut in cuts])
    return plan


async def _supervise(process: _ToolProcess, stdin: bytes, plan: SubprocessPlan,
                     started: float, sandbox: str) -> PrimitiveOutcome:
    try:
        process.send_stdin(stdin)
        timed_out = not await process.wait(plan.timeout_seconds)
        status, usage = process.exit_status()
        if sandbox == "bwrap":
            status = _unwrap_bwrap_status(status, process.stderr)
        elif sandbox == "landlock":
            _check_landlock_setup(status, process.stderr)
        _check_setup(status, process.stderr, egress_relay.MESSAGE_PREFIX, sandbox)
        error = _error_for(status, usage, timed_out, process.stderr, plan,
                           inherited_rss=process.inherited_rss)
        return PrimitiveOutcome(
            ok=error is None,
            stdout=bytes(process.stdout.data), stderr=bytes(process.stderr.data),
            exit_code=None if status is None else os.waitstatus_to_exitcode(status),
            stdout_truncated=process.stdout.truncated,
            stderr_truncated=process.stderr.truncated,
            duration_ms=_elapsed_ms(started), error=error, sandbox=sandbox,
        )
    finally:
        process.release()


def _encode_params(params: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(dict(params), ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode()
    except (TypeError, ValueError) as error:
        raise ValidationFailed(f"parameters are not JSON-serialisable: {error}",
                               code="E3301") from error


def _check_sandbox(sandbox: str) -> None:
    if sandbox == NO_SANDBOX:
        raise ExecutionError(
            "no sandbox is available: bubblewrap is not installed and this kernel does not "
            "support Landlock; install bubblewrap, or set TOOLEXEC_SANDBOX=rlimits to run "
            "tools with resource limits only", code="E3405", details={"sandbox": sandbox})
    if sandbox not in SANDBOXES:
        raise ExecutionError(f"sandbox {sandbox!r} is not available here", code="E3405",
                             details={"sandbox": sandbox, "available": sorted(SANDBOXES)})


def _rlimits_for(limits: ResourceLimits, sandbox: str,
                 launch: Launch | None = None) -> tuple[RLimit, ...]:
    """The (resource, soft, hard) triples to set in the child, computed in the parent
    and capped at the current hard limits (which only root may raise)."""
    _check_sandbox(sandbox)
    if sandbox == "none":
        return ()
    cpu = limits.cpu_seconds
    processes = limits.max_processes if launch is None else launch.max_processes
    if launch is not None and not launch.nproc_outside:
        processes = None  # set inside the sandbox instead (see bubblewrap)
    wanted = (
        (resource.RLIMIT_AS, limits.memory_bytes, limits.memory_bytes),
        # soft < hard: SIGXCPU first (reported as E3407), SIGKILL a second later
        (resource.RLIMIT_CPU, cpu, None if cpu is None else cpu + 1),
        (resource.RLIMIT_NOFILE, limits.max_open_files, limits.max_open_files),
        (resource.RLIMIT_FSIZE, limits.max_file_bytes, limits.max_file_bytes),
        (resource.RLIMIT_NPROC, processes, processes),
    )
    return tuple(_capped(kind, soft, hard) for kind, soft, hard in wanted
                 if soft is not None and hard is not None)


def _capped(kind: int, soft: int, hard: int) -> RLimit:
    current_hard = resource.getrlimit(kind)[1]
    if os.geteuid() != 0 and current_hard != resource.RLIM_INFINITY:
        hard = min(hard, current_hard)
    return kind, min(soft, hard), hard


def _apply_rlimits(rlimits: tuple[RLimit, ...]) -> None:
    """Runs in the child between fork and exec."""
    for kind, soft, hard in rlimits:
        resource.setrlimit(kind, (soft, hard))


def _make_workdir(work_root: Path) -> Path:
    try:
        return Path(tempfile.mkdtemp(prefix="run-", dir=work_root))
    except FileNotFoundError:
        work_root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="run-", dir=work_root))


def _working_directory(workdir: Path, parts: tuple[str, ...]) -> Path:
    if not parts:
        return workdir
    cwd = workdir.joinpath(*parts)
    cwd.mkdir(parents=True, exist_ok=True)
    if not cwd.resolve().is_relative_to(workdir.resolve()):
        raise ExecutionError("the working directory escapes the tool root", code="E3401",
                             details={"cwd": "/".join(parts)})
    return cwd


def _environment(plan: SubprocessPlan, workdir: Path) -> dict[str, str]:
    """Exactly the plan's variables, a default PATH when it has none, and HOME and
    TMPDIR pointing at the run's own directory. Nothing comes from os.environ."""
    env = dict(plan.env)
    env.setdefault("PATH", DEFAULT_PATH)
    env["HOME"] = env["TMPDIR"] = str(workdir)
    return env


@functools.cache
def _prlimit_binary() -> str | None:
    return shutil.which("prlimit", path="/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin")


def _unwrap_bwrap_status(status: int | None, stderr: _Capture) -> int | None:
    """bwrap reports a tool killed by signal N as exit 128+N: give the signal back.
    A failure of bwrap itself (exit 1, "bwrap: ..." on stderr) raises E3405."""
    if status is None or not os.WIFEXITED(status):
        return status
    code = os.WEXITSTATUS(status)
    if code == 1 and bytes(stderr.data[:len(_BWRAP_SETUP_FAILURE)]) == _BWRAP_SETUP_FAILURE:
        raise ExecutionError("the bwrap sandbox could not be set up: "
                             + bytes(stderr.data[:500]).decode("utf-8", "replace").strip(),
                             code="E3405", details={"sandbox": "bwrap"})
    if 128 < code < 128 + 65:
        return code - 128  # a raw wait status for "killed by signal code-128"
    return status


def _check_landlock_setup(status: int | None, stderr: _Capture) -> None:
    """The wrapper exits SETUP_FAILED with "landlock_exec: ..." when it could not
    restrict itself (the tool never started): E3405."""
    _check_setup(status, stderr, landlock_exec.MESSAGE_PREFIX, "landlock")


def _check_setup(status: int | None, stderr: _Capture, prefix: bytes, sandbox: str) -> None:
    """A wrapper in front of the tool (landlock_exec, the egress relay) that failed
    before the tool started exits SETUP_FAILED with "<its name>: <why>": E3405."""
    if (status is not None and os.WIFEXITED(status)
            and os.WEXITSTATUS(status) == landlock_exec.SETUP_FAILED
            and bytes(stderr.data[:len(prefix)]) == prefix):
        raise ExecutionError(f"the {sandbox} sandbox could not be set up: "
                             + bytes(stderr.data[:500]).decode("utf-8", "replace").strip(),
                             code="E3405", details={"sandbox": sandbox})


def _command(argv: tuple[str, ...], env: dict[str, str], cwd: Path,
             rlimits: tuple[RLimit, ...],
             wrapper: list[str]) -> tuple[list[str], Callable[[], None] | None]:
    """The argv to exec and the preexec_fn (None when prlimit applies the limits)."""
    if wrapper:
        _require_executable(argv[0], env["PATH"], cwd)  # bwrap would only say "exit 1"
    if not rlimits:
        return [*wrapper, *argv], None
    prlimit = _prlimit_binary()
    if prlimit is None:
        return [*wrapper, *argv], functools.partial(_apply_rlimits, rlimits)
    _require_executable(argv[0], env["PATH"], cwd)  # prlimit would only say "exit 127"
    options = [f"--{_PRLIMIT_OPTIONS[kind]}={soft}:{hard}" for kind, soft, hard in rlimits]
    return [prlimit, *options, "--", *wrapper, *argv], None


def _require_executable(program: str, path: str, cwd: Path) -> None:
    found = (os.access(cwd / program, os.X_OK) and (cwd / program).is_file()) \
        if "/" in program else shutil.which(program, path=path) is not None
    if not found:
        raise ExecutionError(f"executable not found: {program}", code="E3401",
                             details={"argv0": program, "path": path})


def _spawn(argv: tuple[str, ...], env: dict[str, str], cwd: Path,
           rlimits: tuple[RLimit, ...], launch: Launch) -> subprocess.Popen[bytes]:
    if not argv:
        raise ExecutionError("the plan has an empty argv", code="E3401")
    command, preexec = _command(argv, env, cwd, rlimits, launch.prefix)
    try:
        popen = subprocess.Popen(  # noqa: S603 - an argv list, never a shell
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, cwd=cwd, preexec_fn=preexec,
            start_new_session=True, bufsize=0, pass_fds=launch.pass_fds,
        )
        launch.spawned()
        return popen
    except FileNotFoundError as error:
        what = "working directory" if error.filename == str(cwd) else "executable"
        raise ExecutionError(f"{what} not found: {error.filename or argv[0]}", code="E3401",
                             details={"argv0": argv[0], "path": env["PATH"]}) from error
    except PermissionError as error:
        raise ExecutionError(f"executable not runnable (permission denied): {argv[0]}",
                             code="E3401", details={"argv0": argv[0]}) from error
    except subprocess.SubprocessError as error:
        raise ExecutionError(f"could not apply the sandbox limits: {error}", code="E3405",
                             details={"rlimits": [list(r) for r in rlimits]}) from error
    except OSError as error:
        raise ExecutionError(f"could not start {argv[0]}: {error.strerror}", code="E3401",
                             details={"argv0": argv[0], "errno": error.errno}) from error


class _Capture:
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
        self._tail = (self._tail + chunk)[-_OOM_SCAN_BYTES:]

    def tail(self, size: int) -> bytes:
        """The last `size` bytes seen (across the cap when the stream was truncated)."""
        return (bytes(self.data[-size:]) + self._tail)[-size:]


class _ToolProcess:
    """One running child: its pipes on event-loop readers, its exit on a pidfd."""

    def __init__(self, popen: subprocess.Popen[bytes], limits: ResourceLimits) -> None:
        self._loop = asyncio.get_running_loop()
        self._popen = popen
        self.pid = popen.pid
        self.stdout = _Capture(limits.stdout_max_bytes)
        self.stderr = _Capture(limits.stderr_max_bytes)
        self.inherited_rss = _max_rss(resource.getrusage(resource.RUSAGE_SELF))
        self._exited: asyncio.Future[tuple[int | None, Any]] = self._loop.create_future()
        self._drained: asyncio.Future[None] = self._loop.create_future()
        self._open_pipes = 0
        self._stdin_rest = memoryview(b"")
        self._watch_pipe(popen.stdout, self.stdout)
        self._watch_pipe(popen.stderr, self.stderr)
        self._pidfd = self._watch_exit()

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

    def _watch_pipe(self, pipe: Any, capture: _Capture) -> None:
        fd = pipe.fileno()
        os.set_blocking(fd, False)
        self._open_pipes += 1
        self._loop.add_reader(fd, self._read, pipe, capture)

    def _read(self, pipe: Any, capture: _Capture) -> None:
        if not _drain_into(pipe, capture):
            self._close_pipe(pipe)

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
            self._loop.call_later(_EXIT_POLL_SECONDS, self._poll_exit)
            return None
        self._loop.add_reader(pidfd, self._reap)
        return pidfd

    def _poll_exit(self) -> None:
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = True  # reaped elsewhere; _reap records that
        if info is None:
            self._loop.call_later(_EXIT_POLL_SECONDS, self._poll_exit)
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
        if not self._exited.done():
            self._exited.set_result((status, usage))

    def kill_group(self) -> None:
        """SIGKILL every process of the child's group (its own session)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    async def wait(self, timeout: float) -> bool:
        """Wait for exit and drained pipes. False when `timeout` expired first (the
        group is then killed and reaped)."""
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._exited)
        except TimeoutError:
            self.kill_group()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exited), _REAP_GRACE_SECONDS)
            await self._drain()
            return False
        except asyncio.CancelledError:  # the run was cancelled: same kill as a timeout
            self.kill_group()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exited), _REAP_GRACE_SECONDS)
            raise
        await self._drain()
        return True

    async def _drain(self) -> None:
        # Pipes held open by a process that left the group (setsid) are abandoned.
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


def _error_for(status: int | None, usage: Any, timed_out: bool, stderr: _Capture,
               plan: SubprocessPlan, *, inherited_rss: int | None = None,
               ) -> dict[str, Any] | None:
    if timed_out:
        return _error("E3402", f"tool timed out after {plan.timeout_seconds:g}s; "
                      "its process group was killed", timeout_seconds=plan.timeout_seconds)
    if status is None:
        return _error("E3404", "the tool process vanished without an exit status")
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return None
    tail = stderr.tail(_OOM_SCAN_BYTES)
    details: dict[str, Any] = {
        "exit_code": code,
        "stderr_tail": tail[-STDERR_TAIL_BYTES:].decode("utf-8", errors="replace"),
    }
    limit_error = _resource_limit_error(code, usage, plan.limits)
    if limit_error is not None:
        return limit_error | {"details": {**limit_error["details"], **details}}
    peak_rss = _own_peak_rss(usage, inherited_rss)
    if _out_of_memory(code, tail, peak_rss, plan.limits):
        return _error("E3403", "tool ran out of memory", memory_bytes=plan.limits.memory_bytes,
                      max_rss_bytes=peak_rss, **details)
    if code < 0:
        name = _signal_name(-code)
        return _error("E3404", f"tool was killed by {name}", signal=name, **details)
    return _error("E3401", f"tool exited with status {code}", **details)


def _resource_limit_error(code: int, usage: Any,
                          limits: ResourceLimits) -> dict[str, Any] | None:
    if code == -signal.SIGXFSZ:
        return _error("E3407", "tool exceeded its file size limit",
                      max_file_bytes=limits.max_file_bytes)
    cpu_spent = None if usage is None else usage.ru_utime + usage.ru_stime
    out_of_cpu = (limits.cpu_seconds is not None and cpu_spent is not None
                  and cpu_spent >= limits.cpu_seconds)
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and out_of_cpu):
        return _error("E3407", "tool exceeded its CPU time limit",
                      cpu_seconds=limits.cpu_seconds)
    return None


def _out_of_memory(code: int, stderr_tail: bytes, peak_rss: int | None,
                   limits: ResourceLimits) -> bool:
    """The heuristic of the module docstring."""
    if _OOM_MARKERS.search(stderr_tail):
        return True
    if limits.memory_bytes is None or code >= 0:
        return False
    if code == -signal.SIGKILL:
        return True
    return (-code in _CRASH_SIGNALS and peak_rss is not None
            and peak_rss >= _OOM_RSS_FRACTION * limits.memory_bytes)


def _drain_into(pipe: Any, capture: _Capture) -> bool:
    """Read what a non-blocking pipe holds into `capture`; False at end of file."""
    try:
        chunk = os.read(pipe.fileno(), _READ_SIZE)
    except BlockingIOError:
        return True
    except OSError:
        chunk = b""
    if chunk:
        capture.feed(chunk)
        return True
    return False


def _max_rss(usage: Any) -> int | None:
    return None if usage is None else int(usage.ru_maxrss) * 1024


def _own_peak_rss(usage: Any, inherited_rss: int | None) -> int | None:
    """The child's peak RSS, or None when it may be the one inherited from us."""
    peak = _max_rss(usage)
    if peak is None or (inherited_rss is not None and peak <= inherited_rss):
        return None
    return peak


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _error(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"code": code, "message": message, "details": details}


def _failed(error: ToolexecError, started: float, sandbox: str) -> PrimitiveOutcome:
    return PrimitiveOutcome(ok=False, error=error.to_dict(), duration_ms=_elapsed_ms(started),
                            sandbox=sandbox)


def _elapsed_ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def _remove_tree(path: Path) -> None:
    def unlock_and_retry(func: Any, target: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), 0o700)
            func(target)

    shutil.rmtree(path, onerror=unlock_and_retry)


# ------------------------------------------------------------- long-lived processes


class ServiceProcess:
    """A long-lived tool process (a stdio MCP server) started from a SubprocessPlan.

    Prepared exactly like a one-shot run (materialised files, clean environment,
    rlimits, sandbox), but its stdin and stdout stay open for the caller's protocol;
    stderr is drained into a capped buffer so the process never blocks on it.
    """

    def __init__(self, popen: subprocess.Popen[bytes], workdir: Path, limits: ResourceLimits,
                 sandbox: str, launch: Launch | None = None) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.sandbox = sandbox
        self.stderr = _Capture(limits.stderr_max_bytes)
        self._workdir = workdir
        self._launch = launch
        self._loop = asyncio.get_running_loop()
        self._stderr_closed = asyncio.Event()
        assert popen.stderr is not None
        os.set_blocking(popen.stderr.fileno(), False)
        self._loop.add_reader(popen.stderr.fileno(), self._read_stderr)

    def _read_stderr(self) -> None:
        pipe = self.popen.stderr
        assert pipe is not None
        if _drain_into(pipe, self.stderr):
            return
        self._loop.remove_reader(pipe.fileno())
        self._stderr_closed.set()

    async def stderr_settled(self, timeout: float) -> None:
        """Wait (bounded) until the process closed stderr, so its tail is complete."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stderr_closed.wait(), timeout)

    async def exit_code(self, timeout: float) -> int | None:
        """The exit code once the process has exited, waiting (bounded) for it."""
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            await asyncio.sleep(_EXIT_POLL_SECONDS)
        return self.popen.returncode

    def stderr_tail(self) -> str:
        return self.stderr.tail(STDERR_TAIL_BYTES).decode("utf-8", errors="replace")

    def alive(self) -> bool:
        """False once the process has exited (its group is then killed and it is reaped)."""
        if self.popen.returncode is not None:
            return False
        try:
            exited = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            exited = True
        if exited is None:
            return True
        # a zombie still reserves its pid (= the group id): killing the group is safe
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.poll()
        return False

    async def stop(self) -> None:
        """Kill the process group, reap the leader and remove the run directory."""
        if self.popen.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            deadline = time.monotonic() + _REAP_GRACE_SECONDS
            while self.popen.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(_EXIT_POLL_SECONDS)
        for pipe in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if pipe is not None and not pipe.closed:
                if pipe is self.popen.stderr:
                    self._loop.remove_reader(pipe.fileno())
                with contextlib.suppress(OSError):
                    pipe.close()
        if self._launch is not None:
            await self._launch.close()
        _remove_tree(self._workdir)


def start_service(plan: SubprocessPlan, *, store: ContentStore, work_root: Path,
                  sandbox: str = "rlimits",
                  policy: SandboxPolicy = DEFAULT_POLICY) -> ServiceProcess:
    """Start `plan` as a long-lived process whose stdin/stdout the caller speaks over.

    Raises ToolexecError for what a one-shot run reports as an outcome: E3105 tampered
    or missing file, E3401 executable not found, E3405 sandbox. The operator's
    ceilings apply as to any run, except that no default CPU time limit is set (the
    process serves many calls); a CPU limit the manifest asks for is kept (capped)."""
    asked_cpu = plan.limits.cpu_seconds
    plan = narrowed(plan, policy)
    if asked_cpu is None:
        plan = dataclasses.replace(plan, limits=dataclasses.replace(plan.limits,
                                                                    cpu_seconds=None))
    _check_sandbox(sandbox)
    cwd_parts = relative_parts(plan.cwd, allow_root=True)
    workdir = _make_workdir(work_root)
    launch: Launch | None = None
    try:
        store.materialise(plan.files, workdir)
        cwd = _working_directory(workdir, cwd_parts)
        env = _environment(plan, workdir)
        launch = prepare_launch(sandbox, plan, workdir, cwd, env["PATH"], policy)
        env.update(launch.env)
        popen = _spawn(plan.argv, env, cwd, _rlimits_for(plan.limits, sandbox, launch), launch)
    except OSError as error:
        _close_later(launch)
        _remove_tree(workdir)
        raise ExecutionError(f"could not prepare the run directory: {error}",
                             code="E3405") from error
    except BaseException:
        _close_later(launch)
        _remove_tree(workdir)
        raise
    return ServiceProcess(popen, workdir, plan.limits, sandbox, launch)


def _close_later(launch: Launch | None) -> None:
    """Close `launch` from synchronous code (on the running loop, in the background)."""
    if launch is not None:
        task = asyncio.get_running_loop().create_task(launch.close())
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)


_BACKGROUND: set[asyncio.Task[None]] = set()
