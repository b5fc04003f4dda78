"""The embedded log survives restarts: `toolexec up` stopped, killed with SIGKILL along
with its broker, or everything stopped and started again from the state directory
alone. Real processes: `toolexec up`, the broker supervisor, Tansu, the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socketserver
import sqlite3
import subprocess
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from tests.cli_process import REPO, finish, start_up, stop, toolexec
from tests.integration.test_durable_log_restore import read_log
from tests.log_reading import terminal_event_ids
from tests.waiting import WAIT, until
from toolexec.broker_control import read_state, stop_broker
from toolexec.settings import Settings

# each test starts `up` twice or more (up to START_WAIT each on a loaded machine)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

# rlimits: the tools reach the test's gate on the host's loopback (no network namespace)
ENV = {"TOOLEXEC_SANDBOX": "rlimits"}
FAST, IN_FLIGHT = 16, 4
HELD_TIMEOUT = 900
"""napper's attempt timeout: a held run must reach the fault within it (it normally
takes seconds). Far longer than WAIT on purpose: after a SIGKILL the restarted `up`
must end the runs left in flight without waiting out their claims' lease (this
timeout + LEASE_GRACE_SECONDS), as their owner is gone."""


def napper(directory: Path) -> Path:
    """A tool published with `toolexec publish`: echoes `text`; given a `gate` (a
    loopback port), only once the test holding that gate opens it."""
    tool = directory / "napper"
    tool.mkdir(parents=True)
    (tool / "tool.yaml").write_text(textwrap.dedent("""\
        tool_id: napper
        version: "1.0.0"
        tool_type: script
        executor: python_runtime
        description: Echoes its text, once its gate (if it has one) opens.
        config:
          entrypoint: main.py
        parameters:
          type: object
          properties:
            text: {type: string}
            gate: {type: integer, minimum: 1, maximum: 65535}
          required: [text]
        """) + f"timeout_default: {HELD_TIMEOUT}\n")
    (tool / "main.py").write_text(textwrap.dedent("""\
        import json, socket, sys
        params = json.load(sys.stdin)
        if params.get("gate"):
            # (a bound, so that a run orphaned by a killed `up` never waits forever)
            with socket.create_connection(("127.0.0.1", params["gate"]), timeout=900) as gate:
                gate.sendall(params["text"].encode() + b"\\n")
                gate.recv(1)  # the gate answers (or closes) when the test opens it
        print(json.dumps({"echo": params["text"]}))
        """))
    return tool


class Gate:
    """A loopback server the test holds: each tool run that connects waits until
    `open()` (a run held there is in flight for as long as the test needs, however
    slowly the machine starts it)."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.arrived: list[str] = []
        gate = self

        class Hold(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                gate.arrived.append(self.rfile.readline().decode().strip())
                gate.opened.wait()
                self.wfile.write(b"go\n")

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Hold)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def open(self) -> None:
        self.opened.set()

    def close(self) -> None:
        self.open()  # runs still held (e.g. orphans of a killed `up`) end
        self._server.shutdown()
        self._server.server_close()


@dataclass
class System:
    """`toolexec up` in `cwd` and an HTTP client on its gateway."""

    cwd: Path
    gate: Gate
    process: subprocess.Popen[str] | None = None
    http: httpx.Client | None = None
    invocations: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def settings(self) -> Settings:
        return Settings(state_dir=self.cwd / ".toolexec")

    def start(self) -> None:
        # start_up waits for the runtime file: not the one a killed `up` left behind
        (self.cwd / ".toolexec" / "runtime.json").unlink(missing_ok=True)
        self.process = start_up(self.cwd, "--tools", str(REPO / "examples" / "tools"), env=ENV)
        url = json.loads((self.cwd / ".toolexec" / "runtime.json").read_text())["gateway_url"]
        self.http = httpx.Client(base_url=url, timeout=WAIT)

    def close_http(self) -> None:
        if self.http is not None:
            self.http.close()
            self.http = None

    def bootstrap(self) -> str:
        state = read_state(self.settings.state_dir)
        assert state is not None and state.bootstrap
        return state.bootstrap

    def invoke(self, text: str, held: bool) -> str:
        """Invoke napper asynchronously; `held` runs wait at the gate."""
        assert self.http is not None
        parameters: dict[str, Any] = {"text": text, **({"gate": self.gate.port} if held else {})}
        answer = self.http.post("/v1/tools/invoke", json={
            "tool_id": "napper", "parameters": parameters, "execution_mode": "async"})
        assert answer.status_code == 202, answer.text
        invocation_id = answer.json()["invocation_id"]
        self.invocations[invocation_id] = parameters
        return invocation_id

    def terminate(self) -> None:
        """SIGTERM `up` with the held runs in flight, then open the gate: `up` waits
        for its runs to end before it exits."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.gate.open()
        assert self.process.wait(timeout=WAIT) == 0

    def status(self, invocation_id: str) -> dict[str, Any]:
        assert self.http is not None
        answer = self.http.get(f"/v1/invocations/{invocation_id}")
        assert answer.status_code == 200, answer.text
        return answer.json()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return toolexec(*args, cwd=self.cwd, env=ENV)


@pytest.fixture
def system(tmp_path: Path) -> Iterator[System]:
    running = System(tmp_path / "project", Gate())
    running.cwd.mkdir()
    yield running
    running.close_http()
    if running.process is not None:
        stop(running.process)
    stop_broker(running.settings)
    running.gate.close()


async def raw_log(bootstrap: str) -> list[tuple[Any, ...]]:
    """Every record of every topic, as a raw Kafka consumer reads it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = await admin.list_topics()
        described = await admin.describe_topics(names)
    finally:
        await admin.close()
    return await read_log(bootstrap, {t["topic"]: len(t["partitions"]) for t in described})


def archived_through(system: System, records: list[tuple[Any, ...]]) -> bool:
    """True once the broker's archive holds every record of `records`."""
    state = read_state(system.settings.state_dir)
    archived = (state.data.get("archived") or {}) if state else {}
    ends: dict[str, int] = {}
    for topic, partition, offset, *_ in records:
        key = f"{topic}/{partition}"
        ends[key] = max(ends.get(key, 0), offset + 1)
    return all(archived.get(key, 0) >= end for key, end in ends.items())


def prepare(system: System, tmp_path: Path) -> tuple[list[str], list[str]]:
    """Publish napper, invoke it 20 times, `IN_FLIGHT` of them held running at the
    gate (until the test opens it); the fast ones have completed."""
    system.start()
    published = system.cli("publish", str(napper(tmp_path / "sources")), "--json")
    assert published.returncode == 0, published.stderr
    until(lambda: system.http.get("/v1/tools/napper").status_code == 200, "napper registered")
    fast = [system.invoke(f"fast {n}", held=False) for n in range(FAST)]
    slow = [system.invoke(f"slow {n}", held=True) for n in range(IN_FLIGHT)]
    until(lambda: all(system.status(i)["status"] == "completed" for i in fast),
          "the fast invocations completed")
    until(lambda: len(system.gate.arrived) == IN_FLIGHT, "the slow runs at the gate")
    until(lambda: all(system.status(i)["status"] == "running" for i in slow),
          "the slow invocations running")
    return fast, slow


def fault(system: System, kind: str, tmp_path: Path) -> None:
    """Stop the system the way `kind` says, then start `up` again."""
    assert system.process is not None
    system.close_http()
    if kind == "sigterm":
        system.terminate()
    elif kind == "sigkill":
        state = read_state(system.settings.state_dir)
        assert state is not None
        for pid in (system.process.pid, state.data["broker_pid"], state.supervisor_pid):
            os.kill(pid, signal.SIGKILL)
        system.process.wait(timeout=WAIT)
        system.gate.open()  # the killed `up`'s orphaned runs end, unseen
    else:  # stop everything, then start from a copy of the state directory alone
        system.terminate()
        stopped = system.cli("broker", "stop", "--json")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        moved = tmp_path / "restored"
        moved.mkdir()
        shutil.copytree(system.cwd / ".toolexec", moved / ".toolexec")
        shutil.rmtree(system.cwd / ".toolexec")
        system.cwd = moved
    system.process = None
    system.start()


@pytest.mark.parametrize("kind", ["sigterm", "sigkill", "cold"])
def test_the_log_and_the_read_models_survive(system: System, tmp_path: Path,
                                             kind: str) -> None:
    fast, slow = prepare(system, tmp_path)
    before = asyncio.run(raw_log(system.bootstrap()))
    until(lambda: archived_through(system, before), "the archive caught up")
    results_before = {i: system.status(i)["result"] for i in fast}

    fault(system, kind, tmp_path)

    # the published tool resolves and runs
    ran = system.cli("run", "napper", "--params", '{"text": "after"}', "--json")
    assert ran.returncode == 0, ran.stderr
    new_id = json.loads(ran.stdout)["invocation_id"]
    assert json.loads(ran.stdout)["result"] == {"echo": "after"}
    # every old invocation is queryable with its status and result
    assert {i: system.status(i)["result"] for i in fast} == results_before
    assert {i: system.status(i)["status"] for i in fast} == dict.fromkeys(fast, "completed")
    for invocation_id in slow:
        assert system.status(invocation_id)["invocation_id"] == invocation_id
    # new invocations show up in every read model
    assert until(lambda: system.status(new_id)["status"] == "completed", "new invocation")
    audit = system.http.get("/v1/audit", params={"invocation": new_id}).json()
    assert {r["type"] for r in audit["records"]} >= {"tool.invoke.requested",
                                                      "tool.invoke.completed"}
    assert system.http.get("/v1/tools/napper").status_code == 200
    verified = system.cli("audit", "verify", "--json")
    assert verified.returncode == 0, verified.stdout
    # a raw Kafka consumer reads the same records at the same offsets as before
    after = asyncio.run(raw_log(system.bootstrap()))
    assert set(before) <= set(after)
    health = system.http.get("/health").json()
    projections = {k: v for k, v in health["checks"]["consumers"]["consumers"].items()
                   if k.startswith("projection.")}
    assert set(projections.values()) == {"running"}, projections


@pytest.mark.parametrize("kind", ["sigterm", "sigkill", "cold"])
def test_every_invocation_in_flight_at_the_fault_ends_with_exactly_one_terminal_event(
        system: System, tmp_path: Path, kind: str) -> None:
    _, slow = prepare(system, tmp_path)
    fault(system, kind, tmp_path)

    def ended() -> dict[str, set[str]]:
        found = asyncio.run(terminal_event_ids(system.bootstrap(), set(slow)))
        return found if len(found) == len(slow) else {}

    terminals = until(ended, "a terminal event for every invocation in flight")
    assert {i: len(terminals[i]) for i in slow} == dict.fromkeys(slow, 1)
    ends = {i: system.status(i) for i in slow}
    if kind == "sigkill":  # the executor died with them: the outcome is unknown
        assert {e["status"] for e in ends.values()} == {"failed"}, ends
        assert {e["error"]["code"] for e in ends.values()} == {"E3404"}, ends
    else:  # `up` waited for its runs before it stopped
        assert {i: e["result"] for i, e in ends.items()} == {
            i: {"echo": system.invocations[i]["text"]} for i in slow}


def invocation_rows(database: Path) -> int:
    with sqlite3.connect(database) as db:
        return int(db.execute("SELECT count(*) FROM invocations").fetchone()[0])


def test_read_models_pointed_at_a_foreign_log_are_refused_and_reported(
        system: System, tmp_path: Path) -> None:
    fast, _ = prepare(system, tmp_path)
    database = system.cwd / ".toolexec" / "toolexec.db"
    system.terminate()
    system.close_http()
    rows = invocation_rows(database)

    other = System(tmp_path / "other", system.gate)  # its own state directory, so its own log
    other.cwd.mkdir()
    other_env = {**ENV, "TOOLEXEC_DATABASE_URL": f"sqlite:///{database}"}
    process = start_up(other.cwd, env=other_env)
    try:
        url = json.loads((other.cwd / ".toolexec" / "runtime.json").read_text())["gateway_url"]
        with httpx.Client(base_url=url, timeout=WAIT) as http:
            health = http.get("/health")
            consumers = health.json()["checks"]["consumers"]["consumers"]
            old = http.get(f"/v1/invocations/{fast[0]}")
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = finish(process)
        stop_broker(other.settings)

    assert health.status_code == 503 and health.json()["status"] == "degraded"
    for model in ("registry", "invocations", "audit"):  # circuits: nothing applied yet
        state = consumers[f"projection.{model}"]
        assert state.startswith("diverged:") and "cluster" in state, consumers
    assert "projection.diverged" in stderr and "foreign" in stderr
    assert old.status_code == 200  # refused, not wiped: the rows of the other log stay
    assert invocation_rows(database) == rows


def test_read_models_whose_log_lost_records_rebuild_from_it_loudly(
        system: System, tmp_path: Path) -> None:
    fast, slow = prepare(system, tmp_path)
    system.gate.open()
    until(lambda: all(system.status(i)["status"] == "completed" for i in slow), "all done")
    system.terminate()
    system.close_http()
    assert system.cli("broker", "stop").returncode == 0
    # The log loses the second half of the requests' and the facts' partitions (as a
    # broker would that died before archiving them, without the supervisor's offset gap
    # to keep them apart).
    lost = _cut_invocation_partitions_in_half(system.cwd / ".toolexec" / "log")
    system.process = None

    system.start()

    def rebuilt() -> bool:
        health = system.http.get("/health").json()
        states = health["checks"]["consumers"]["consumers"]
        return states.get("projection.invocations") == "running"
    until(rebuilt, "the invocations read model rebuilt")
    gone = [i for i in fast + slow if system.http.get(f"/v1/invocations/{i}").status_code == 404]
    assert lost and gone  # what the log lost is gone from the read model too
    _, stderr = _stop_and_read(system)
    assert "projection.diverged" in stderr and "rebuild" in stderr


def _cut_invocation_partitions_in_half(log_dir: Path) -> int:
    from toolexec.log_archive import ArchivedRecord, LogArchive

    archive = LogArchive(log_dir, fsync="never")
    lost = 0
    for topic, partition in archive.partitions():
        if topic not in ("toolexec.invocations", "toolexec.requests"):
            continue
        entries = [e for e in archive.partition(topic, partition).read()
                   if isinstance(e, ArchivedRecord)]
        if len(entries) < 2:
            continue
        keep = entries[: len(entries) // 2]
        lost += len(entries) - len(keep)
        directory = log_dir / "topics" / topic / str(partition)
        archive.close()
        shutil.rmtree(directory)
        archive = LogArchive(log_dir, fsync="never")
        archive.partition(topic, partition).append(keep)  # type: ignore[arg-type]
    archive.close()
    return lost


def _stop_and_read(system: System) -> tuple[str, str]:
    assert system.process is not None
    system.close_http()
    system.process.send_signal(signal.SIGTERM)
    out, err = finish(system.process)
    system.process = None
    return out, err


def test_read_models_older_than_their_log_are_refused_until_rebuilt(
        system: System, tmp_path: Path) -> None:
    fast, _ = prepare(system, tmp_path)
    system.terminate()
    system.close_http()
    assert system.cli("broker", "stop").returncode == 0
    # As after an upgrade from a memory-only log: the log is gone, and the read models
    # do not know which log their rows came from.
    shutil.rmtree(system.cwd / ".toolexec" / "log")
    with sqlite3.connect(system.cwd / ".toolexec" / "toolexec.db") as db:
        db.execute("DELETE FROM projection_sources")
    rows = invocation_rows(system.cwd / ".toolexec" / "toolexec.db")
    system.process = None

    system.start()
    states = system.http.get("/health").json()["checks"]["consumers"]["consumers"]
    old = system.http.get(f"/v1/invocations/{fast[0]}")
    rebuilt = system.cli("projections", "rebuild", "--json")

    assert "predate" in states["projection.invocations"], states
    assert old.status_code == 200  # refused, not wiped
    assert rows > 0
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert invocation_rows(system.cwd / ".toolexec" / "toolexec.db") == 0  # this log's rows
    # the running `up` follows the rebuilt read models again
    until(lambda: system.http.get("/health").status_code == 200, "healthy again")
    ran = system.cli("run", "word_stats", "--params", '{"text": "a new log"}', "--json")
    assert ran.returncode == 0, ran.stderr
    new_id = json.loads(ran.stdout)["invocation_id"]
    assert until(lambda: system.status(new_id)["status"] == "completed", "folded")
