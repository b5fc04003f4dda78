"""A running `toolexec up` and its HTTP gateway, as the gateway tests use it."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.cli_process import REPO, start_up, stop, toolexec
from tests.waiting import START_WAIT, WAIT

TEST_TOOLS = Path(__file__).parent / "tools"
EXAMPLES = REPO / "examples" / "tools"


@dataclass
class RunningGateway:
    """`toolexec up` in `cwd`, its process, and an HTTP client on its gateway."""

    cwd: Path
    process: subprocess.Popen[str]
    url: str
    http: httpx.Client
    env: Mapping[str, str]

    def invoke(self, tool_id: str, parameters: dict[str, Any] | None = None,
               **fields: Any) -> httpx.Response:
        body = {"tool_id": tool_id, "parameters": parameters or {}}
        headers = fields.pop("headers", {})
        return self.http.post("/v1/tools/invoke", json={**body, **fields}, headers=headers)

    def register(self, manifest: dict[str, Any], files: list[dict[str, Any]] | None = None,
                 headers: Mapping[str, str] | None = None) -> httpx.Response:
        return self.http.post("/v1/tools/register",
                              json={"manifest": manifest, "files": files or []},
                              headers=dict(headers or {}))

    def token(self, *grants: str, scopes: tuple[str, ...] = (),
              subject: str = "did:example:gateway-test") -> str:
        """A token invoking `grants` (ID[@RANGE]) with `scopes` as `token issue` flags
        (e.g. ("--publish", "acme_*", "--audit"))."""
        tools = [arg for grant in grants for arg in ("--tool", grant)]
        done = toolexec("token", "issue", "--sub", subject, *tools, *scopes,
                        "--ttl", "300", "--json", cwd=self.cwd, env=self.env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["token"]


@contextmanager
def running_gateway(cwd: Path, *args: str,
                    env: Mapping[str, str] | None = None) -> Iterator[RunningGateway]:
    """`toolexec up --tools examples --tools tests/integration/tools ARGS` in `cwd`.
    The tests' stand-ins for external services listen on loopback, which tools may
    reach only with the operator's allowance: it is given unless `env` says otherwise."""
    env = dict(env or {})
    env.setdefault("TOOLEXEC_EGRESS_ALLOWED_NETWORKS", '["127.0.0.1/32"]')
    process = start_up(cwd, "--tools", str(EXAMPLES), "--tools", str(TEST_TOOLS), *args,
                       env=env)
    try:
        url = json.loads((cwd / ".toolexec" / "runtime.json").read_text())["gateway_url"]
        # a synchronous invoke starts the tool's process: as slow as starting `up`
        with httpx.Client(base_url=url, timeout=START_WAIT) as http:
            yield RunningGateway(cwd, process, url, http, env)
    finally:
        stop(process)


def interrupt(process: subprocess.Popen[str], timeout: float = WAIT) -> int:
    """Ctrl-C the process; its exit code."""
    process.send_signal(signal.SIGINT)
    return process.wait(timeout=timeout)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    return free_port()


def refused_api_tool(tool_id: str, service_id: str) -> dict[str, Any]:
    """An API tool whose service refuses connections; its breaker opens on one failure."""
    port = closed_port()
    return {
        "tool_id": tool_id, "version": "1.0.0", "tool_type": "api", "executor": "http_client",
        "description": "Calls a local port where nothing listens.",
        "config": {"method": "GET", "url_template": f"http://127.0.0.1:{port}/ping"},
        "external_service": service_id,
        "circuit_breaker_config": {"failure_threshold": 1, "success_threshold": 1,
                                   "timeout_seconds": 600, "half_open_max_calls": 1},
        "retry_policy": {"max_attempts": 1},
        "network_policy": {"allowed_domains": ["127.0.0.1"], "allowed_ports": [port]},
        "timeout_default": 5,
    }


def wait_until(predicate: Any, timeout: float = WAIT, interval: float = 0.1) -> Any:
    """Poll `predicate()` until it returns a truthy value; that value (the bound only
    fails a hang, see tests/waiting.py)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)
