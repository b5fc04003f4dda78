"""The gate in front of the embedded broker: a Kafka-protocol relay on the public port.

A broker restarted under connected clients comes back empty and is refilled from the
archive; a client reconnecting in the middle would write at offsets the restore has
not reached yet. So the broker listens on a private port, the restore runs there,
and only then does the gate open: `toolexec.kafka_relay` on the public port (the one
clients know), relaying each client connection to the broker over one of its own and
advertising itself in metadata. While the gate is closed, clients see the port refuse
connections, exactly as while the broker is down. Closing it is also what makes a
compaction exact (no writer between the archive's last catch-up and the broker's
stop), so with compactions on a cold start serves through it too; the relay costs a
hop per request, which a broker with compactions off saves by listening on the
public port itself.

(`tansu proxy` 0.6 was the gate before: it forwards every client over four broker
connections, one request at a time, and a second replica's consumers, whose
JoinGroups and long-poll fetches wait at the broker, starved the first one's
heartbeats past their session timeout.)

Given `on_produce`, the gate calls it (in the opener's event loop) with the partitions
produces were acknowledged to through it (None: some could not be read): every client
writes through the gate, so the log's archiver need not poll the broker to learn that
there is something to archive.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from toolexec.embedded_broker import (
    HOST,
    EmbeddedBrokerError,
    _port_open,
    _signal_group,
    _stop_process,
    _tail,
    gate_argv,
    spawn_broker_process,
)
from toolexec.kafka_fetches import Place
from toolexec.kafka_relay import read_news

log = structlog.get_logger(__name__)

READY_TIMEOUT = 20.0


class BrokerGate:
    """The relay listening on `port`, forwarding to `origin` (`host:port`)."""

    def __init__(self, port: int, origin: str, *, log_dir: Path, stop_grace: float = 5.0,
                 client_options: Mapping[str, Any] | None = None,
                 on_produce: Callable[[frozenset[Place] | None], None] | None = None
                 ) -> None:
        self.port = port
        self.on_produce = on_produce
        self._bell: int | None = None  # the reading end of the relay's produce pipe
        self._partial = b""  # a line the last read of it cut
        self.client_options = dict(client_options or {})
        self.origin = origin
        self.log_dir = log_dir
        self.stop_grace = stop_grace
        self._process: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    async def open(self) -> None:
        """Start the relay and wait until a metadata request through it is answered."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"gate-{self.port}-{secrets.token_hex(3)}.log"
        self._silence()
        notify: int | None = None
        if self.on_produce is not None:
            self._bell, notify = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            with self.log_path.open("wb") as log_file:
                self._process = spawn_broker_process(
                    gate_argv(self.bootstrap, self.origin, notify_fd=notify), log_file,
                    pass_fds=(notify,) if notify is not None else ())
        except BaseException:
            self._silence()
            raise
        finally:
            if notify is not None:
                os.close(notify)
        if self._bell is not None:
            asyncio.get_running_loop().add_reader(self._bell, self._rung)
        deadline = time.monotonic() + READY_TIMEOUT
        try:
            while not await _port_open(self.port):
                self._check_alive()
                if time.monotonic() > deadline:
                    raise self._failure("the gate did not listen")
                await asyncio.sleep(0.01)
            await self._metadata_round_trip(deadline)
        except BaseException:
            self.close()
            raise
        log.info("broker_gate.open", port=self.port, origin=self.origin, pid=self.pid)

    async def _metadata_round_trip(self, deadline: float) -> None:
        while True:
            self._check_alive()
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=3000,
                                        **self.client_options)
            try:
                await admin.start()
                await admin.list_topics()
                return
            except KafkaError as error:
                if time.monotonic() > deadline:
                    raise self._failure(f"no metadata through the gate: {error}") from error
                await asyncio.sleep(0.05)
            finally:
                await admin.close()

    def _check_alive(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            raise self._failure(f"the gate exited with {self._process.returncode}")

    def _failure(self, reason: str) -> EmbeddedBrokerError:
        return EmbeddedBrokerError(f"{reason} (port {self.port}); log {self.log_path}:\n"
                                   f"{_tail(self.log_path)}")

    def _rung(self) -> None:
        assert self._bell is not None and self.on_produce is not None
        try:
            chunk = os.read(self._bell, 65536)
        except BlockingIOError:
            return
        if not chunk:  # the relay is gone: its end of the pipe closed
            self._silence()
            return
        whole, _, self._partial = (self._partial + chunk).rpartition(b"\n")
        places, everything = read_news(whole)
        if everything:
            self.on_produce(None)
        elif places:
            self.on_produce(frozenset(places))

    def _silence(self) -> None:
        bell, self._bell = self._bell, None
        self._partial = b""
        if bell is not None:
            with contextlib.suppress(RuntimeError):  # no loop (closed from sync code)
                asyncio.get_running_loop().remove_reader(bell)
            os.close(bell)

    def close(self) -> None:
        """Stop forwarding: clients see the port refuse connections."""
        self._silence()
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                _signal_group(process, signal.SIGTERM)
            _stop_process(process, self.stop_grace)
            log.info("broker_gate.closed", port=self.port, pid=process.pid)
