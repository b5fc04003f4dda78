"""Cancellation end to end on `toolexec up`: real broker, executor, tool processes and
read models, driven through the HTTP gateway and the CLI as users do."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_process import toolexec
from tests.integration.gateway_support import (
    TEST_TOOLS,
    RunningGateway,
    running_gateway,
    wait_until,
)
from tests.waiting import START_WAIT, WAIT

pytestmark = pytest.mark.integration

SLEEPER = TEST_TOOLS / "sleeper"
LONG_SLEEPER = {
    "tool_id": "long_sleeper", "version": "1.0.0", "tool_type": "script",
    "executor": "python_runtime",
    "description": "The sleeper tool (a grandchild and a long sleep) with a long timeout.",
    "config": {"entrypoint": "main.py"}, "timeout_default": START_WAIT,
    "parameters": {"type": "object", "properties": {"pidfile": {"type": "string"}},
                   "required": ["pidfile"]},
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    # rlimits: the tool reports host pids in a file on the host; bubblewrap would give
    # it a private /tmp and its own PID namespace.
    with running_gateway(tmp_path_factory.mktemp("cancel"),
                         env={"TOOLEXEC_SANDBOX": "rlimits"}) as running:
        code = (SLEEPER / "main.py").read_text()
        registered = running.register(LONG_SLEEPER, [{"path": "main.py", "content": code}])
        assert registered.status_code == 201, registered.text
        yield running


def _start_sleeper(gateway: RunningGateway, pidfile: Path) -> tuple[str, list[int]]:
    accepted = gateway.invoke("long_sleeper", {"pidfile": str(pidfile)}, execution_mode="async")
    assert accepted.status_code == 202, accepted.text
    wait_until(lambda: pidfile.exists() and len(pidfile.read_text().split()) == 2)
    pids = [int(p) for p in pidfile.read_text().split()]
    assert all(_running(pid) for pid in pids)
    return accepted.json()["invocation_id"], pids


def _ended(gateway: RunningGateway, invocation_id: str) -> dict:
    def view() -> dict | None:
        body = gateway.http.get(f"/v1/invocations/{invocation_id}").json()
        return body if body["status"] in ("completed", "failed", "cancelled") else None
    return wait_until(view)


def _terminal_events(gateway: RunningGateway, invocation_id: str) -> list[dict]:
    records = gateway.http.get("/v1/audit", params={"invocation": invocation_id}).json()
    return [r for r in records["records"]
            if r["type"] in ("tool.invoke.completed", "tool.invoke.failed")]


def _running(pid: int) -> bool:
    """Alive and not a zombie (killed orphans stay zombies where PID 1 does not reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def test_cancelling_a_running_tool_kills_its_process_group_and_ends_cancelled(
        gateway: RunningGateway, tmp_path: Path) -> None:
    invocation_id, pids = _start_sleeper(gateway, tmp_path / "pids")
    response = gateway.http.post(f"/v1/invocations/{invocation_id}/cancel",
                                 json={"reason": "changed my mind"})
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "cancel_requested"

    view = _ended(gateway, invocation_id)
    assert view["status"] == "cancelled" and view["cancel_requested"] is True
    assert view["error"]["code"] == "E3703"
    assert [pid for pid in pids if _running(pid)] == []  # leader and grandchild

    terminal = wait_until(lambda: _terminal_events(gateway, invocation_id))
    assert [(t["type"], t["event"]["data"]["error"]["code"]) for t in terminal] == [
        ("tool.invoke.failed", "E3703")]
    finished = gateway.http.get("/v1/audit", params={
        "invocation": invocation_id, "type": "tool.execution.finished"}).json()["records"]
    assert [f["event"]["data"]["error"]["code"] for f in finished] == ["E3703"]


class _HangingHandler(http.server.BaseHTTPRequestHandler):
    """Answers only once the test lets it (`release`); tells when a request arrived."""

    arrived = threading.Event()
    release = threading.Event()

    def do_GET(self) -> None:  # noqa: N802
        type(self).arrived.set()
        type(self).release.wait(START_WAIT)  # (bounded: never hangs the server)
        body = b'{"late": true}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hanging_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HangingHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    _HangingHandler.release.set()
    server.shutdown()


def test_cancelling_a_pending_http_call_ends_it_before_the_service_answers(
        gateway: RunningGateway, hanging_server: int) -> None:
    tool = {"tool_id": "hanging_api", "version": "1.0.0", "tool_type": "api",
            "executor": "http_client", "description": "Calls a service that does not answer.",
            "config": {"method": "GET", "url_template": f"http://127.0.0.1:{hanging_server}/x"},
            "retry_policy": {"max_attempts": 3}, "timeout_default": START_WAIT,
            "network_policy": {"allowed_domains": ["127.0.0.1"],
                               "allowed_ports": [hanging_server]}}
    assert gateway.register(tool).status_code == 201
    accepted = gateway.invoke("hanging_api", execution_mode="async")
    invocation_id = accepted.json()["invocation_id"]
    assert _HangingHandler.arrived.wait(WAIT)
    response = gateway.http.post(f"/v1/invocations/{invocation_id}/cancel")
    assert response.status_code == 202, response.text
    view = _ended(gateway, invocation_id)
    assert not _HangingHandler.release.is_set()  # the service has still not answered
    assert view["status"] == "cancelled" and view["attempts"] == 1


def test_cancelling_a_finished_invocation_is_a_no_op_that_changes_nothing(
        gateway: RunningGateway) -> None:
    done = gateway.invoke("py_echo", {"text": "done"})
    assert done.status_code == 200, done.text
    invocation_id = done.json()["invocation_id"]
    response = gateway.http.post(f"/v1/invocations/{invocation_id}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "already_ended"
    assert response.json()["ended_as"] == "completed"
    assert response.json()["event_id"] is None
    assert gateway.http.get(f"/v1/invocations/{invocation_id}").json()["status"] == "completed"
    assert [t["type"] for t in _terminal_events(gateway, invocation_id)] == [
        "tool.invoke.completed"]


def test_cancelling_an_unknown_invocation_is_404_with_E3702(gateway: RunningGateway) -> None:
    response = gateway.http.post("/v1/invocations/no-such-invocation/cancel")
    assert response.status_code == 404 and response.json()["error"]["code"] == "E3702"


def test_cli_cancel_stops_an_invocation_of_the_running_up(
        gateway: RunningGateway, tmp_path: Path) -> None:
    invocation_id, pids = _start_sleeper(gateway, tmp_path / "pids")
    done = toolexec("cancel", invocation_id, "--json", cwd=gateway.cwd, env=gateway.env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "cancel_requested"
    assert _ended(gateway, invocation_id)["status"] == "cancelled"
    assert [pid for pid in pids if _running(pid)] == []

    again = toolexec("cancel", invocation_id, "--json", cwd=gateway.cwd, env=gateway.env)
    assert again.returncode == 0, again.stdout  # a no-op once it ended, as the README says
    assert json.loads(again.stdout)["status"] == "already_ended"
    assert json.loads(again.stdout)["ended_as"] == "cancelled"
    assert len(_terminal_events(gateway, invocation_id)) == 1
