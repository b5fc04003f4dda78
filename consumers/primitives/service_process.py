"""The long-lived service process: a stdio MCP server started from a SubprocessPlan.

Prepared like a one-shot run (materialised files, clean environment, rlimits,
sandbox), but its stdin and stdout stay open for the caller's protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path

from consumers.primitives.exit_status import STDERR_TAIL_BYTES
from consumers.primitives.file_store import ContentStore, relative_parts
from consumers.primitives.run_directory import RunDirectory, environment, on_host
from consumers.primitives.sandbox_launch import Launch, prepare_launch
from consumers.primitives.sandboxes import check_sandbox, rlimits_for, through_launcher
from consumers.primitives.subprocess_primitive import DEFAULT_POLICY, narrowed
from consumers.primitives.tool_process import (
    EXIT_POLL_SECONDS,
    REAP_GRACE_SECONDS,
    Capture,
    drain_into,
    spawn,
)
from domain.errors import ExecutionError
from domain.model import ResourceLimits, SubprocessPlan
from domain.sandbox_policy import SandboxPolicy
from domain.system_strings import check_process


class ServiceProcess:
    """A long-lived tool process (a stdio MCP server) started from a SubprocessPlan.

    Prepared exactly like a one-shot run (materialised files, clean environment,
    rlimits, sandbox), but its stdin and stdout stay open for the caller's protocol;
    stderr is drained into a capped buffer so the process never blocks on it.
    """

    def __init__(self, popen: subprocess.Popen[bytes], run_dir: RunDirectory,
                 limits: ResourceLimits, sandbox: str, launch: Launch | None = None) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.sandbox = sandbox
        self.stderr = Capture(limits.stderr_max_bytes)
        self._run_dir = run_dir
        self._launch = launch
        self._loop = asyncio.get_running_loop()
        self._stderr_closed = asyncio.Event()
        assert popen.stderr is not None
        os.set_blocking(popen.stderr.fileno(), False)
        self._loop.add_reader(popen.stderr.fileno(), self._read_stderr)

    def _read_stderr(self) -> None:
        pipe = self.popen.stderr
        assert pipe is not None
        if drain_into(pipe, self.stderr):
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
            await asyncio.sleep(EXIT_POLL_SECONDS)
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
            deadline = time.monotonic() + REAP_GRACE_SECONDS
            while self.popen.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(EXIT_POLL_SECONDS)
        for pipe in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if pipe is not None and not pipe.closed:
                if pipe is self.popen.stderr:
                    self._loop.remove_reader(pipe.fileno())
                with contextlib.suppress(OSError):
                    pipe.close()
        if self._launch is not None:
            await self._launch.close()
        self._run_dir.close()


def start_service(plan: SubprocessPlan, *, store: ContentStore, work_root: Path,
                  sandbox: str = "rlimits",
                  policy: SandboxPolicy = DEFAULT_POLICY) -> ServiceProcess:
    """Start `plan` as a long-lived process whose stdin/stdout the caller speaks over.

    Raises ToolexecError for what a one-shot run reports as an outcome: E3105 tampered
    or missing file, E3401 executable not found or an argument or variable the OS
    refuses, E3405 sandbox. The operator's
    ceilings apply as to any run, except that no default CPU time limit is set (the
    process serves many calls); a CPU limit the manifest asks for is kept (capped)."""
    asked_cpu = plan.limits.cpu_seconds
    plan = narrowed(plan, policy)
    if asked_cpu is None:
        plan = dataclasses.replace(plan, limits=dataclasses.replace(plan.limits,
                                                                    cpu_seconds=None))
    check_process(plan.argv, plan.env)  # under every sandbox, before any is set up
    sandbox = through_launcher(sandbox, service=True)
    check_sandbox(sandbox)
    cwd_parts = relative_parts(plan.cwd, allow_root=True)
    launch: Launch | None = None
    run_dir: RunDirectory | None = None
    try:
        run_dir = on_host(store, plan.files, work_root, cwd_parts)
        env = environment(plan, run_dir.path)
        launch = prepare_launch(sandbox, plan, run_dir, env["PATH"], policy)
        env.update(launch.env)
        popen = spawn(plan.argv, env, run_dir, rlimits_for(plan.limits, sandbox, launch),
                      launch)
    except OSError as error:
        _close_later(launch)
        if run_dir is not None:
            run_dir.close()
        raise ExecutionError(f"could not prepare the run directory: {error}",
                             code="E3405") from error
    except BaseException:
        _close_later(launch)
        if run_dir is not None:
            run_dir.close()
        raise
    return ServiceProcess(popen, run_dir, plan.limits, sandbox, launch)


def _close_later(launch: Launch | None) -> None:
    """Close `launch` from synchronous code (on the running loop, in the background)."""
    if launch is not None:
        task = asyncio.get_running_loop().create_task(launch.close())
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)


_BACKGROUND: set[asyncio.Task[None]] = set()
