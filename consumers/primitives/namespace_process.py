"""A tool process started by the namespace launcher, watched like any tool process.

`spawn_namespaced` sends the run's request (consumers.primitives.namespace_launcher)
with the child's ends of fresh stdin/stdout/stderr pipes,
and returns a `NamespacedProcess`: tool_process.ToolProcess's pipes, captures,
timeout and cancellation, except that the process is not our child. Its exit (wait
status and rusage of the run's PID 1, the tool's included) comes from the launcher,
and killing it — at the tool's exit, on timeout or cancellation — is a SIGKILL to
the PID 1 through its pidfd, which takes the whole PID namespace down with it.
"""

from __future__ import annotations

import os
from typing import IO, Any

from consumers.primitives.bubblewrap import SYSTEM_ETC_ENTRIES
from consumers.primitives.namespace_launcher import NamespaceLauncher, RunHandle, launcher_for
from consumers.primitives.run_directory import RunDirectory
from consumers.primitives.sandbox_cache import shared_cache
from consumers.primitives.sandbox_launch import Launch
from consumers.primitives.sandboxes import RLimit
from consumers.primitives.tool_process import ToolProcess, require_executable
from domain.errors import ExecutionError
from domain.model import ResourceLimits

_NEW_ROOT = "launcher-root"


class _Pipes:
    """The parts of a Popen that ToolProcess uses: our ends of the pipes and the pid."""

    def __init__(self, pid: int, stdin: int, stdout: int, stderr: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdin: IO[bytes] | None = open(stdin, "wb", buffering=0)  # noqa: SIM115
        self.stdout: IO[bytes] | None = open(stdout, "rb", buffering=0)  # noqa: SIM115
        self.stderr: IO[bytes] | None = open(stderr, "rb", buffering=0)  # noqa: SIM115


class NamespacedProcess(ToolProcess):
    """A run held by the launcher (see the module docstring)."""

    def __init__(self, handle: RunHandle, pipes: _Pipes, limits: ResourceLimits,
                 launcher_rss: int | None) -> None:
        self._handle = handle
        self._launcher_rss = launcher_rss
        super().__init__(pipes, limits)  # type: ignore[arg-type]

    def _parent_rss(self) -> int | None:
        # the tool is forked from the small launcher, not from this process
        return self._launcher_rss

    def _watch_exit(self) -> int | None:
        # called at once by the launcher's socket reader: no round through the loop
        self._handle.on_exit = self._on_exit
        if self._handle.exited.done():
            self._on_exit(*self._handle.exited.result())
        return None

    def _on_exit(self, status: int | None, usage: Any) -> None:
        self._handle.close()
        if status is not None:
            self._popen.returncode = os.waitstatus_to_exitcode(status)
        self._set_exited(status, usage)

    def kill_group(self) -> None:
        """SIGKILL the run's PID 1, and so every process of its namespace."""
        self._handle.kill()


async def spawn_namespaced(argv: tuple[str, ...], env: dict[str, str], run_dir: RunDirectory,
                           rlimits: tuple[RLimit, ...], launch: Launch,
                           limits: ResourceLimits) -> NamespacedProcess:
    """Start `argv` through the launcher under `launch.request`."""
    if not argv:
        raise ExecutionError("the plan has an empty argv", code="E3401")
    assert launch.request is not None
    if any("\0" in text for text in (*argv, *env, *env.values())):
        raise ExecutionError("the argv or environment holds a NUL character", code="E3401")
    if not launch.program_found:  # the launcher would say 127
        require_executable(argv[0], env["PATH"], run_dir.lookup)
    request = launch.request | {"argv": list(argv), "env": env,
                                "rlimits": [list(limit) for limit in rlimits]}
    ours: list[int] = []
    theirs: list[int] = []
    try:
        for reading in (False, True, True):
            read_end, write_end = os.pipe2(os.O_CLOEXEC)
            ours.append(read_end if reading else write_end)
            theirs.append(write_end if reading else read_end)
        launcher = current_launcher()
        handle = await launcher.start_run(request, theirs, steps_checked=True)
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
        launch.spawned()
    try:
        pipes = _Pipes(handle.pid, *ours)
    except BaseException:
        handle.kill()
        handle.close()
        raise
    return NamespacedProcess(handle, pipes, limits, launcher.max_rss)


def current_launcher() -> NamespaceLauncher:
    """The running event loop's launcher (started, or restarted, on demand)."""
    return launcher_for(shared_cache(SYSTEM_ETC_ENTRIES).root / _NEW_ROOT)
