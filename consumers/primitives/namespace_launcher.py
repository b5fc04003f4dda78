"""The executor's side of the namespace launcher (consumers.primitives.launcher_program).

One launcher process per event loop of the executor, started on the first run that
needs it with `python -I -S launcher_program.py` and connected by nothing but one
end of a SOCK_SEQPACKET socketpair it inherits (no path anyone else could connect
to). The launcher hands over each PID 1 it cloned ahead (its pid, a pidfd of it and
the launcher's end of the PID 1's socketpair, SCM_RIGHTS): one spare at a time, or
one cloned when asked (`prepare`). `start_run` checks the request, makes detached
copies of the host paths the run binds and sends request, pipes and copies straight
to such a PID 1, so the launcher is not on a run's path; it returns a `RunHandle`
whose `exited` future gets the wait status and rusage later (from the PID 1 itself,
or from the launcher when the PID 1 was killed).

A launcher that died (killed, crashed) is noticed by end of file on the socket: every
run it held is killed through its pidfd (their PID 1 also dies with the launcher,
PR_SET_PDEATHSIG) and ends without a status, and the next run starts a new launcher.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import functools
import itertools
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from consumers.primitives import launcher_program
from domain.errors import ExecutionError

log = structlog.get_logger(__name__)

_BUFFER_BYTES = launcher_program.MAX_MESSAGE
_READY_SECONDS = 30.0
_RECEIVE_BYTES = 65536
_MAX_RECEIVED_FDS = 2
_FD_SIZE = array.array("i").itemsize
_SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 32, 33  # Linux; not in the socket module
SPARES_REVIEW_SECONDS = 5.0
"""While more than one spare PID 1 is wanted, how often the number is brought down to
the most runs seen in flight at once since the last review (at least one)."""


@dataclass
class RunHandle:
    """One run: its PID 1, a pidfd of it, and its end."""

    run_id: int
    pid: int = 0
    pidfd: int | None = None
    exited: asyncio.Future[tuple[int | None, Any]] = field(default_factory=lambda: _future())
    on_exit: Callable[[int | None, Any], None] | None = None
    """Called as soon as the end is known (before `exited`'s callbacks run)."""

    def end(self, status: int | None, usage: Any) -> None:
        """The run's end (the first report wins)."""
        if self.exited.done():
            return
        self.exited.set_result((status, usage))
        if self.on_exit is not None:
            self.on_exit(status, usage)

    def kill(self) -> None:
        """SIGKILL the run's PID 1: the kernel then kills its whole namespace."""
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def close(self) -> None:
        if self.pidfd is not None:
            pidfd, self.pidfd = self.pidfd, None
            os.close(pidfd)


@dataclass
class _Prepared:
    """A PID 1 the launcher cloned ahead, waiting for its request on `inbox`."""

    pid: int
    pidfd: int
    inbox: socket.socket
    system: str

    def dead(self) -> bool:
        """Whether this PID 1 has exited (its pidfd is readable)."""
        return bool(select.select([self.pidfd], [], [], 0)[0])

    def drop(self) -> None:
        """Not wanted: an empty message makes it exit."""
        with contextlib.suppress(OSError):
            self.inbox.send(b"")
        self.inbox.close()
        os.close(self.pidfd)


def _future() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


class NamespaceLauncher:
    """A running launcher process and the runs it holds (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, root: Path) -> None:
        self._loop = loop
        self._runs: dict[int, RunHandle] = {}
        self._pids: dict[int, RunHandle] = {}
        self._ids = itertools.count(1)
        self._ready: asyncio.Future[None] = loop.create_future()
        self._spares: list[_Prepared] = []
        self._spares_wanted = 1
        self._layout: list[Any] = []  # what spares make ahead (launcher_program.layout_of)
        self._in_flight = 0
        self._peak_in_flight = 0
        self._review: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._wanted: str | None = None
        # the runs waiting for a PID 1, oldest first: prepare id -> (system key, future)
        self._preparing: dict[int, tuple[str, asyncio.Future[_Prepared]]] = {}
        self.alive = True
        self.max_rss: int | None = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for end in (ours, theirs):
            with contextlib.suppress(OSError):
                end.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, _BUFFER_BYTES)
                end.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, _BUFFER_BYTES)
        self._socket = ours
        try:
            self._process = subprocess.Popen(  # noqa: S603 - our own program, no shell
                [launcher_interpreter(), "-I", "-S", launcher_program.__file__,
                 str(theirs.fileno()), str(os.getpid()), str(root)],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, start_new_session=True)
        finally:
            theirs.close()
        ours.setblocking(False)
        loop.add_reader(ours.fileno(), self._receive)

    @property
    def pid(self) -> int:
        return self._process.pid

    async def ready(self) -> None:
        """Wait for the launcher's first message; E3405 when it never comes."""
        if self._ready.done() and self._ready.exception() is None:
            return  # no round through the event loop on a run's path
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), _READY_SECONDS)
        except (TimeoutError, ConnectionError) as error:
            self.close()
            raise ExecutionError(f"the namespace launcher did not start: {error!r}",
                                 code="E3405", details={"sandbox": "namespaces"}) from error

    async def start_run(self, request: dict[str, Any], fds: list[int], *,
                        steps_checked: bool = False) -> RunHandle:
        """Send one run request (its `id` is set here) with its stdin, stdout and
        stderr straight to a PID 1 the launcher prepared, with detached copies of
        the host paths it binds (launcher_program.detached_trees). `steps_checked`:
        its mount steps were checked when built (run_request). Raises
        ExecutionError E3405 for a malformed request or one that cannot be sent."""
        handle = RunHandle(next(self._ids))
        request = request | {"id": handle.run_id}
        try:
            launcher_program.check_request(request, steps=not steps_checked)
            if len(fds) < 3:
                raise ValueError("a request carries stdin, stdout and stderr")
        except ValueError as error:
            raise _refused(f"malformed request: {error}") from error
        await self.ready()
        self._lay_out(launcher_program.layout_of(request["mounts"]))
        try:
            mounts, trees = launcher_program.detached_trees(request["mounts"])
        except (OSError, launcher_program.SetupError) as error:
            raise _refused(f"the run cannot start: {error}") from error
        try:
            message = launcher_program.run_message(request, mounts)
            attempts = launcher_program.MAX_SPARES + 2
            for attempt in range(1, attempts + 1):
                prepared = await self._prepared_for(request["system"])
                try:
                    socket.send_fds(prepared.inbox, [message], [*fds[:3], *trees])
                except OSError as error:  # that PID 1 died while it waited: another
                    prepared.drop()
                    if attempt == attempts:
                        raise _refused(f"the run cannot start: {error.strerror}") from error
                    continue
                prepared.inbox.close()
                handle.pid, handle.pidfd = prepared.pid, prepared.pidfd
                self._runs[handle.run_id] = self._pids[handle.pid] = handle
                self._in_flight += 1
                self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
                handle.exited.add_done_callback(self._ended)
                return handle
        finally:
            for tree in trees:
                os.close(tree)
        raise AssertionError("unreachable")

    async def _prepared_for(self, system: list[Any]) -> _Prepared:
        """A spare PID 1 prepared for `system` (the oldest), else the first one the
        launcher hands out for it after asking for one; spares for another `system`
        are dropped. Running out while other runs are in flight asks for one more
        spare from then on."""
        key = launcher_program.system_key(system)
        if self._spares and self._spares[0].system != key:
            others, self._spares = self._spares, []
            for spare in others:
                spare.drop()
        if self._spares:
            return self._spares.pop(0)
        if self._in_flight > 0 and self._wanted == key:
            self._spares_wanted = min(self._spares_wanted + 1, launcher_program.MAX_SPARES)
            self._review_later()
        self._wanted = key
        prepare_id = next(self._ids)
        asked: asyncio.Future[_Prepared] = self._loop.create_future()
        self._preparing[prepare_id] = (key, asked)
        try:
            await self._send(json.dumps({"prepare": prepare_id, "system": system,
                                         "spares": self._spares_wanted,
                                         "layout": self._layout}).encode())
            return await asked
        except asyncio.CancelledError:
            if asked.done() and not asked.cancelled() and asked.exception() is None:
                self._spares.append(asked.result())  # handed to a run that went away
            raise
        finally:
            self._preparing.pop(prepare_id, None)

    def _lay_out(self, layout: list[Any]) -> None:
        """Tell the launcher the run's layout when it differs from the last one: the
        spares cloned from then on make it ahead (the next run likely has the same)."""
        if layout != self._layout:
            self._layout = layout
            self._tell({"layout": layout})

    def _tell(self, message: dict[str, Any]) -> None:
        task = self._loop.create_task(self._send(json.dumps(message).encode()))
        self._background.add(task)
        task.add_done_callback(self._sent)

    def _ended(self, _exited: asyncio.Future[Any]) -> None:
        self._in_flight -= 1

    def _review_later(self) -> None:
        if self._review is None and self.alive:
            self._review = self._loop.call_later(SPARES_REVIEW_SECONDS, self._review_spares)

    def _review_spares(self) -> None:
        """Spares grow with runs side by side (`_prepared_for`) and shrink back here:
        to the most runs in flight at once since the last review, at least one. The
        launcher is told first (it stops replacing them), then the surplus held here
        is dropped, oldest first."""
        self._review = None
        if not self.alive:
            return
        wanted = max(1, min(self._spares_wanted, self._peak_in_flight))
        self._peak_in_flight = self._in_flight
        if wanted < self._spares_wanted:
            self._spares_wanted = wanted
            self._tell({"spares": wanted})
            while len(self._spares) > wanted:
                self._spares.pop(0).drop()
        if self._spares_wanted > 1:
            self._review_later()

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("sandbox.launcher_message_lost", error=str(task.exception()))

    async def _send(self, message: bytes) -> None:
        while True:
            if not self.alive:
                raise _refused("the namespace launcher has died")
            try:
                self._socket.send(message)
                return
            except BlockingIOError:
                writable = self._loop.create_future()
                self._loop.add_writer(self._socket.fileno(), writable.set_result, None)
                try:
                    await writable
                finally:
                    self._loop.remove_writer(self._socket.fileno())
            except OSError as error:
                raise _refused(f"the message could not be sent: {error.strerror}") from error

    def _receive(self) -> None:
        while True:
            try:
                data, fds = _receive_fds(self._socket)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            if not data:
                self._died()
                return
            self._dispatch(json.loads(data), fds)

    def _dispatch(self, message: dict[str, Any], fds: list[int]) -> None:
        if "ready" in message:
            self.max_rss = message.get("max_rss")
            if not self._ready.done():
                self._ready.set_result(None)
        elif "prepared" in message and len(fds) == 2:
            self._take(message, fds)
            return
        elif "exit" in message:
            self._exited(message)
        elif "error" in message:
            waiting = self._preparing.pop(message.get("id"), None)  # type: ignore[arg-type]
            if waiting is not None and not waiting[1].done():
                waiting[1].set_exception(_refused(str(message["error"])))
        for fd in fds:
            os.close(fd)

    def _take(self, message: dict[str, Any], fds: list[int]) -> None:
        """A PID 1 handed out, asked for or a spare: it goes to the run that has
        waited longest for one of its `system` (whichever PID 1 comes first), else
        it is kept as a spare when it serves what was last asked for."""
        prepared = _Prepared(int(message["prepared"]), fds[0], socket.socket(fileno=fds[1]),
                             str(message["system"]))
        prepared.inbox.setblocking(False)
        for prepare_id, (system, asked) in self._preparing.items():
            if system == prepared.system and not asked.done():
                del self._preparing[prepare_id]
                asked.set_result(prepared)
                return
        if prepared.system == self._wanted:
            # the launcher replaces a spare once it was used or died: held spares
            # beyond those wanted may be dead ones
            if len(self._spares) >= self._spares_wanted:
                for dead in [spare for spare in self._spares if spare.dead()]:
                    self._spares.remove(dead)
                    dead.drop()
            if len(self._spares) >= self._spares_wanted:
                prepared.drop()  # cloned before the launcher heard of fewer wanted
            else:
                self._spares.append(prepared)
        else:
            prepared.drop()

    def _exited(self, message: dict[str, Any]) -> None:
        """The first report closes the run's books: the PID 1's own (the tool's
        status, by run id; the launcher then sends none), or the launcher's (by pid:
        the PID 1's status, when it was killed or failed before its report)."""
        if "pid" in message:
            handle = self._pids.pop(int(message["pid"]), None)
            if handle is not None:
                self._runs.pop(handle.run_id, None)
        else:
            handle = self._runs.pop(message.get("id"), None)  # type: ignore[arg-type]
            if handle is not None:
                self._pids.pop(handle.pid, None)
        if handle is not None and not handle.exited.done():
            handle.end(int(message["exit"]), resource.struct_rusage(message["rusage"]))

    def _died(self) -> None:
        """End of file: the launcher is gone. Its runs are killed and end without a
        status; the next run starts a new launcher."""
        if not self.alive:
            return
        self.alive = False
        if self._review is not None:
            self._review.cancel()
            self._review = None
        if not self._loop.is_closed():
            self._loop.remove_reader(self._socket.fileno())
        self._socket.close()
        self._process.poll()
        if not self._ready.done():
            self._ready.set_exception(ConnectionError("the launcher exited"))
        spares, self._spares = self._spares, []
        for spare in spares:
            spare.drop()
        for _system, asked in self._preparing.values():
            if not asked.done():
                asked.set_exception(_refused("the namespace launcher died before the run "
                                             "started"))
        for handle in self._runs.values():
            handle.kill()
            handle.end(None, None)
        self._runs.clear()
        self._pids.clear()
        log.warning("sandbox.launcher_died", pid=self._process.pid,
                    returncode=self._process.returncode)

    def exited(self) -> bool:
        return self._process.poll() is not None

    def close(self) -> None:
        """Stop the launcher: end of file makes it kill its runs and exit (it is
        reaped later, as any Popen dropped while running)."""
        if self.alive:
            self._died()


def _receive_fds(channel: socket.socket) -> tuple[bytes, list[int]]:
    """One message and the fds it carries, received close-on-exec (never into another
    program). socket.recv_fds of Python 3.11 drops its flags, hence recvmsg here."""
    data, ancillary, _flags, _address = channel.recvmsg(
        _RECEIVE_BYTES, socket.CMSG_LEN(_MAX_RECEIVED_FDS * _FD_SIZE), socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % _FD_SIZE])
    return data, list(fds)


def _refused(message: str) -> ExecutionError:
    return ExecutionError(message, code="E3405", details={"sandbox": "namespaces"})


_LAUNCHERS: dict[asyncio.AbstractEventLoop, NamespaceLauncher] = {}


def launcher_for(root: Path) -> NamespaceLauncher:
    """The running loop's launcher, started (or restarted after it died) on demand.
    Launchers of closed loops are stopped."""
    loop = asyncio.get_running_loop()
    for other in [other for other in _LAUNCHERS if other.is_closed()]:
        _LAUNCHERS.pop(other).close()
    launcher = _LAUNCHERS.get(loop)
    if launcher is not None and launcher.alive and launcher.exited():
        launcher.close()  # its end of file is still on its way
    if launcher is None or not launcher.alive:
        root.mkdir(mode=0o700, exist_ok=True)
        launcher = _LAUNCHERS[loop] = NamespaceLauncher(loop, root)
    return launcher


@functools.cache
def launcher_interpreter() -> str:
    """The real interpreter running toolexec: the launcher needs its standard library only."""
    return os.path.realpath(sys.executable)


@functools.cache
def usable() -> bool:
    """Whether this host can run the launcher: root, and the kernel lets it make the
    namespaces (probed once by cloning a child that exits at once)."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux") or os.uname().machine != "x86_64":
        return False
    try:
        done = subprocess.run(  # noqa: S603 - our own program, no shell
            [launcher_interpreter(), "-I", "-S", launcher_program.__file__, "--probe"],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0
