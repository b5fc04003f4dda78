"""Finding, starting and stopping the embedded broker of a state directory.

The broker of the embedded profile is a long-lived process tree of its own
(`python -m toolexec.broker_supervisor`, which runs Tansu, archives its log and
restarts it when it dies). Its state file, `<state_dir>/broker/broker.json`, says
where it listens and how it is doing; this module reads it, starts a supervisor when
none runs (`ensure_broker`), stops one (`stop_broker`), and watches it for a running
`toolexec up` (`BrokerWatch`), starting a new one on the same port when it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from domain.errors import ToolexecError
from toolexec.child_python import module_argv
from toolexec.embedded_broker import _tail
from toolexec.settings import Settings
from toolexec.state_files import DirectoryIdentity

log = structlog.get_logger(__name__)

STATE_FILE = "broker.json"
SUPERVISOR_MODULE = "toolexec.broker_supervisor"
EXIT_ANOTHER_SUPERVISOR = 3
"""Exit code of a supervisor that found another one running for its state directory."""
EXIT_STATE_GONE = 4
"""Exit code of a supervisor whose state directory was deleted or replaced under it."""
STOP_TIMEOUT = 60.0
WATCH_SECONDS = 0.5

Status = str  # starting | restoring | ready | restarting | stopping | stopped | failed
STATE_GONE = "state_gone"
"""`BrokerWatch`'s status once the state directory was deleted or replaced under it."""


class BrokerUnavailable(ToolexecError):
    """E3801: the embedded broker could not be started or reached (the message says why)."""

    code = "E3801"


def broker_dir(state_dir: Path) -> Path:
    return Path(state_dir).resolve() / "broker"


def archive_dir(state_dir: Path) -> Path:
    """Where the embedded log is archived (back this directory up)."""
    return Path(state_dir).resolve() / "log"


def state_path(state_dir: Path) -> Path:
    return broker_dir(state_dir) / STATE_FILE


def supervisor_log_path(state_dir: Path) -> Path:
    return Path(state_dir).resolve() / "logs" / "broker-supervisor.log"


@dataclass(frozen=True)
class BrokerState:
    """The supervisor's own account of itself (its state file)."""

    data: dict[str, Any]

    @property
    def status(self) -> Status:
        return str(self.data.get("status", "unknown"))

    @property
    def supervisor_pid(self) -> int | None:
        pid = self.data.get("supervisor_pid")
        return int(pid) if isinstance(pid, int) else None

    @property
    def bootstrap(self) -> str | None:
        value = self.data.get("bootstrap")
        return str(value) if value else None

    @property
    def port(self) -> int | None:
        bootstrap = self.bootstrap
        return int(bootstrap.rsplit(":", 1)[1]) if bootstrap else None

    @property
    def incarnation(self) -> int:
        return int(self.data.get("incarnation", 0))


def read_state(state_dir: Path) -> BrokerState | None:
    try:
        return BrokerState(json.loads(state_path(state_dir).read_text()))
    except (FileNotFoundError, ValueError):
        return None


def write_state(state_dir: Path, data: dict[str, Any]) -> None:
    """Replace the state file atomically (a reader never sees half of it)."""
    path = state_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)


def process_alive(pid: int | None, *, cmdline_has: str | None = None) -> bool:
    """True when `pid` runs (and, on Linux, its command line mentions `cmdline_has`,
    so a reused pid is not mistaken for the process)."""
    if not pid or pid <= 0:  # 0 and negative pids name process groups, not a process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if cmdline_has is None:
        return True
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: trust the pid
    if raw == b"":  # a zombie: exited, not yet reaped
        return False
    return cmdline_has.encode() in raw


def supervisor_running(state: BrokerState | None) -> bool:
    return state is not None and process_alive(state.supervisor_pid,
                                               cmdline_has=SUPERVISOR_MODULE)


def running_broker(settings: Settings) -> BrokerState | None:
    """The state of the state directory's broker when its supervisor runs and serves."""
    state = read_state(settings.state_dir)
    if supervisor_running(state) and state is not None and state.status == "ready":
        return state
    return None


@dataclass
class SupervisedBroker:
    """A handle on the state directory's embedded broker, as a running stack sees it."""

    settings: Settings
    bootstrap: str
    supervisor_pid: int
    started_here: bool
    process: subprocess.Popen[bytes] | None = None
    _processes: tuple[tuple[int, int, int], list[int]] | None = field(
        default=None, init=False, repr=False, compare=False)

    @property
    def pid(self) -> int | None:
        """Process id of the broker (Tansu) serving right now."""
        state = read_state(self.settings.state_dir)
        return state.data.get("broker_pid") if state is not None else None

    def processes(self) -> list[int]:
        """Process ids of the Tansu processes serving right now (the broker, and the
        gate in front of it when there is one). The state file is parsed again only
        when it was replaced (`write_state` renames a new file over it)."""
        try:
            stat = state_path(self.settings.state_dir).stat()
        except FileNotFoundError:
            return []
        version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if self._processes is None or self._processes[0] != version:
            state = read_state(self.settings.state_dir)
            pids = [] if state is None else [
                pid for pid in (state.data.get("broker_pid"), state.data.get("gate_pid"))
                if isinstance(pid, int)]
            self._processes = (version, pids)
        return list(self._processes[1])

    async def stop(self) -> None:
        """Stop the supervisor (it archives what is left first) and wait for it."""
        await asyncio.to_thread(stop_broker, self.settings)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=1)


async def ensure_broker(settings: Settings, *, gated: bool = False,
                        port: int | None = None) -> SupervisedBroker:
    """The state directory's embedded broker, started when none runs; waits (bounded
    by `broker_start_timeout_seconds`) until it serves its restored log.

    `gated` (with `port`): clients may already hold that address (a running `up`
    whose broker vanished), so the new broker is restored behind a closed gate.
    """
    deadline = time.monotonic() + settings.broker_start_timeout_seconds
    process: subprocess.Popen[bytes] | None = None
    while True:
        state = read_state(settings.state_dir)
        if supervisor_running(state):
            assert state is not None
            ready = await _wait_ready(settings, state.supervisor_pid, deadline)
            return SupervisedBroker(settings, ready.bootstrap or "", ready.supervisor_pid or 0,
                                    started_here=process is not None
                                    and process.pid == ready.supervisor_pid, process=process)
        if process is not None and process.poll() is not None:
            if process.returncode != EXIT_ANOTHER_SUPERVISOR:
                raise BrokerUnavailable(_start_failure(settings, process.returncode))
            process = None  # another one won the race: wait for it
        if process is None:
            process = _spawn_supervisor(settings, gated=gated, port=port)
        if time.monotonic() > deadline:
            raise BrokerUnavailable(
                f"the embedded broker did not start within "
                f"{settings.broker_start_timeout_seconds:.0f} s; see "
                f"{supervisor_log_path(settings.state_dir)}")
        await asyncio.sleep(0.05)


async def _wait_ready(settings: Settings, pid: int | None, deadline: float) -> BrokerState:
    last: Status | None = None
    while True:
        state = read_state(settings.state_dir)
        if state is None or state.supervisor_pid != pid or not supervisor_running(state):
            raise BrokerUnavailable(_start_failure(settings, None))
        if state.status == "ready" and state.bootstrap:
            return state
        if state.status == "failed":
            raise BrokerUnavailable(f"the embedded broker refused to start: "
                                    f"{state.data.get('error')}")
        if state.status != last:
            log.info("broker.waiting", status=state.status, pid=pid)
            last = state.status
        if time.monotonic() > deadline:
            raise BrokerUnavailable(
                f"the embedded broker (supervisor pid {pid}) is still {state.status} after "
                f"{settings.broker_start_timeout_seconds:.0f} s; see "
                f"{supervisor_log_path(settings.state_dir)}")
        await asyncio.sleep(0.05)


def _start_failure(settings: Settings, returncode: int | None) -> str:
    state = read_state(settings.state_dir)
    reason = state.data.get("error") if state is not None else None
    logfile = supervisor_log_path(settings.state_dir)
    code = f" (exit code {returncode})" if returncode is not None else ""
    return (f"the embedded broker's supervisor stopped{code}: {reason or 'see its log'}; "
            f"{logfile}:\n{_tail(logfile)}")


def _spawn_supervisor(settings: Settings, *, gated: bool,
                      port: int | None) -> subprocess.Popen[bytes]:
    """Start a supervisor in a session of its own: it outlives the command that
    started it (and Ctrl-C in that command's terminal)."""
    logfile = supervisor_log_path(settings.state_dir)
    logfile.parent.mkdir(parents=True, exist_ok=True)
    argv = module_argv(SUPERVISOR_MODULE, "--state-dir", str(Path(settings.state_dir).resolve()))
    if gated:
        argv.append("--gated")
    if port:
        argv += ["--port", str(port)]
    env = dict(os.environ)
    env.setdefault("TOOLEXEC_LOG_LEVEL", "INFO")
    with logfile.open("ab") as output:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=str(Path(settings.state_dir).resolve().parent), env=env)


def stop_broker(settings: Settings, timeout: float = STOP_TIMEOUT) -> BrokerState | None:
    """SIGTERM the state directory's supervisor and wait (bounded) until it exited;
    returns its last state, None when none was running."""
    state = read_state(settings.state_dir)
    if not supervisor_running(state):
        return None
    assert state is not None and state.supervisor_pid is not None
    pid = state.supervisor_pid
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while process_alive(pid, cmdline_has=SUPERVISOR_MODULE):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            log.error("broker.stop_timeout", pid=pid, seconds=timeout)
            break
        time.sleep(0.05)
    return read_state(settings.state_dir)


def state_gone_error(state_dir: Path) -> BrokerUnavailable:
    """E3801 for a command whose state directory was deleted, moved or replaced while it
    ran (`BrokerWatch`'s `STATE_GONE`)."""
    return BrokerUnavailable(
        f"the state directory {Path(state_dir).resolve()} was deleted or moved while "
        "toolexec ran (its log, read models and keys with it): stopped, and no new broker "
        "was started. Put the directory back from a backup, or start afresh (an empty log)")


class BrokerWatch:
    """Keeps the embedded broker of a running `up` alive: logs each change of its
    status once, and starts a new supervisor on the same port when it is gone, unless
    the state directory is gone too (`STATE_GONE`, final: the log, the read models and
    the keys were in it, so a new broker would serve an empty log nothing keeps)."""

    def __init__(self, settings: Settings, broker: SupervisedBroker,
                 on_change: Callable[[str], None] | None = None,
                 state: DirectoryIdentity | None = None) -> None:
        self.settings = settings
        self.broker = broker
        self.on_change = on_change
        self.state = state or DirectoryIdentity(Path(settings.state_dir).resolve())
        self.status: str = "ready"
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="broker-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.state.close()

    def _changed(self, status: str, **details: Any) -> None:
        if status == self.status:
            return
        # warning level both ways: a quiet CLI shows the outage and the recovery alike
        log.warning("broker.status", status=status, previous=self.status, **details)
        self.status = status
        if self.on_change is not None:
            self.on_change(status)

    async def _run(self) -> None:
        port = int(self.broker.bootstrap.rsplit(":", 1)[1])
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            if self.broker.process is not None:
                self.broker.process.poll()  # reap it if it exited (no zombie)
            if not self.state.still_there():
                self._changed(STATE_GONE, state_dir=str(self.state.path))
                return
            state = read_state(self.settings.state_dir)
            if supervisor_running(state):
                assert state is not None
                self._changed(state.status, incarnation=state.incarnation,
                              reason=state.data.get("last_restart_reason"))
                continue
            if self.status not in ("gone", "failed"):
                self._changed("gone", supervisor_pid=state.supervisor_pid if state else None)
            try:
                self.broker = await ensure_broker(self.settings, gated=True, port=port)
            except BrokerUnavailable as error:
                self._changed("failed", error=str(error)[:500])
                await asyncio.sleep(5.0)
