"""Callbacks of async callers against a real `toolexec up`: the terminal result reaches
a local HTTP server once, signed with the state directory's callback key, and is
recorded on the log (`callback.delivered`); a receiver that keeps failing gets the
retries and then `callback.failed` E3704; a host the operator did not list is refused
at request time (E3406) on HTTP and the CLI alike; a restart sends nothing again."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from domain.callbacks import EVENT_ID_HEADER, SIGNATURE_HEADER, verify_signature
from tests.cli_process import REPO, halt, runtime, start_up, toolexec
from tests.waiting import WAIT, until

pytestmark = [pytest.mark.integration]

EXAMPLES = REPO / "examples" / "tools"
UP_ENV = {"TOOLEXEC_SANDBOX": "rlimits", "TOOLEXEC_CALLBACK_HOSTS": '["127.0.0.1"]',
          "TOOLEXEC_CALLBACK_MAX_ATTEMPTS": "3",
          "TOOLEXEC_CALLBACK_FIRST_BACKOFF_SECONDS": "0.05"}


class Receiver:
    """A local HTTP server recording every POST; `/fail...` paths answer 500."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, str], bytes]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.received.append((self.path, dict(self.headers), body))
                self.send_response(500 if self.path.startswith("/fail") else 204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def posts(self, path: str) -> list[tuple[str, dict[str, str], bytes]]:
        with self._lock:
            return [post for post in self.received if post[0] == path]


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.server.shutdown()


def _start(cwd: Path) -> tuple[subprocess.Popen[str], str]:
    process = start_up(cwd, "--tools", str(EXAMPLES), env=UP_ENV)
    return process, runtime(cwd)["gateway_url"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("callbacks")


def _invoke_async(gateway: str, callback_url: str, name: str) -> str:
    answer = httpx.post(f"{gateway}/v1/tools/invoke", timeout=WAIT, json={
        "tool_id": "hello", "parameters": {"name": name}, "execution_mode": "async",
        "callback_url": callback_url})
    assert answer.status_code == 202, answer.text
    return str(answer.json()["invocation_id"])


def _recorded(gateway: str, kind: str, invocation_id: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{gateway}/v1/audit", timeout=WAIT,
                       params={"type": kind, "invocation": invocation_id})
    return list(answer.json()["records"]) if answer.status_code == 200 else []


def test_a_callback_is_received_once_signed_and_recorded(receiver: Receiver,
                                                         workdir: Path) -> None:
    process, gateway = _start(workdir)
    try:
        invocation_id = _invoke_async(gateway, receiver.url + "/done", "Ada")
        path, headers, body = until(lambda: (receiver.posts("/done") or [None])[0],
                                    "the callback POST")
        secret = (workdir / ".toolexec" / "keys" / "callback.key").read_bytes().strip()
        assert verify_signature(secret, headers[SIGNATURE_HEADER], body, now=time.time())
        assert not verify_signature(secret, headers[SIGNATURE_HEADER], body + b" ",
                                    now=time.time())
        event = json.loads(body)
        assert event["type"] == "tool.invoke.completed"
        assert event["data"]["invocation_id"] == invocation_id
        assert event["data"]["result"] == {"greeting": "Hello, Ada!"}
        assert headers[EVENT_ID_HEADER] == event["id"]
        delivered = until(lambda: _recorded(gateway, "callback.delivered", invocation_id),
                          "callback.delivered on the log")
        assert delivered[0]["event"]["data"]["terminal_event_id"] == event["id"]
        assert delivered[0]["event"]["data"]["status_code"] == 204
    finally:
        halt(process)

    process, gateway = _start(workdir)  # a restarted deliverer: nothing is sent again
    try:
        later = _invoke_async(gateway, receiver.url + "/after-restart", "Bo")
        until(lambda: receiver.posts("/after-restart"), "the next callback after a restart")
        until(lambda: _recorded(gateway, "callback.delivered", later), "its record")
        assert len(receiver.posts("/done")) == 1
    finally:
        halt(process)


def test_a_failing_receiver_gets_the_retries_then_E3704(receiver: Receiver,
                                                       workdir: Path) -> None:
    process, gateway = _start(workdir)
    try:
        invocation_id = _invoke_async(gateway, receiver.url + "/fail", "Cy")
        failed = until(lambda: _recorded(gateway, "callback.failed", invocation_id),
                       "callback.failed on the log")
        assert failed[0]["event"]["data"]["error"]["code"] == "E3704"
        assert failed[0]["event"]["data"]["attempts"] == 3
        assert len(receiver.posts("/fail")) == 3
    finally:
        halt(process)


def test_a_host_not_listed_is_refused_at_request_time(workdir: Path) -> None:
    process, gateway = _start(workdir)
    try:
        for url, code in (("https://hooks.example.net/x", "E3406"),
                          ("http://10.0.0.8/x", "E3406"), ("ftp://127.0.0.1/x", "E3004")):
            answer = httpx.post(f"{gateway}/v1/tools/invoke", timeout=WAIT, json={
                "tool_id": "hello", "parameters": {"name": "Di"}, "execution_mode": "async",
                "callback_url": url})
            assert answer.json()["error"]["code"] == code, url
            assert answer.status_code == (403 if code == "E3406" else 422)
        cli = toolexec("run", "hello", "-p", "name=Di", "--callback-url",
                       "https://hooks.example.net/x", "--json", cwd=workdir, env=UP_ENV)
        assert cli.returncode == 1 and json.loads(cli.stdout)["error"]["code"] == "E3406"
    finally:
        halt(process)
