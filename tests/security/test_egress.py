"""Issue 14, door 3: a network policy opens the listed hosts and ports, not the host.

Repros of the hole: any `allowed_domains` entry gave a script tool the whole host
network, loopback included (it registered a tool through the gateway, invoked others,
reached the broker); an API tool deprecated another tool through the gateway on
loopback; an empty `allowed_ports` meant any port. Now a script tool's only way out
is the egress proxy, which allows the listed hosts and ports and never loopback,
link-local or private addresses unless the operator allows them; the http primitive
applies the same address rules after resolving the host.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from consumers.primitives.file_store import ContentStore
from consumers.primitives.runner import Primitives
from consumers.primitives.subprocess_primitive import run_subprocess
from domain.integrity import seal
from domain.model import HttpPlan, NetworkPolicy, ResolvedChain, SubprocessPlan, ToolSource
from domain.plan import build_plan
from domain.sandbox_policy import SandboxPolicy
from toolexec.sources import load_builtin_sources, load_source

pytestmark = [pytest.mark.security]

TOOLS = Path(__file__).parent / "tools"


class _Recorder(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._answer()

    def do_POST(self) -> None:  # noqa: N802
        self._answer()

    def _answer(self) -> None:
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        body = f"{self.server.name} answered".encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _serve(host: str, name: str) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, 0), _Recorder)
    server.seen = []  # type: ignore[attr-defined]
    server.name = name  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def gateway() -> Iterator[ThreadingHTTPServer]:
    """Stands for toolexec's own control plane on loopback (gateway, broker)."""
    server = _serve("127.0.0.1", "gateway")
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def permitted() -> Iterator[ThreadingHTTPServer]:
    """A destination the operator allows although it is loopback (127.0.0.2)."""
    server = _serve("127.0.0.2", "permitted")
    yield server
    server.shutdown()
    server.server_close()


def _port(server: ThreadingHTTPServer) -> int:
    return server.server_address[1]


def _probe(**policy: Any) -> SubprocessPlan:
    source = load_source(TOOLS / "egress_probe")
    manifest = {**source.manifest,
                "network_policy": {**source.manifest["network_policy"], **policy}}
    builtins = {s.manifest["tool_id"]: s for s in load_builtin_sources()}
    plan = build_plan(ResolvedChain((
        seal(ToolSource(manifest=manifest, files=source.files, origin="test")),
        seal(builtins["python_runtime"]), seal(builtins["subprocess"]))))
    assert isinstance(plan, SubprocessPlan)
    return plan


async def _probe_run(sandbox: str, tmp_path: Path, plan: SubprocessPlan, params: dict[str, Any],
                     **options: Any) -> dict[str, str]:
    outcome = await run_subprocess(plan, params, store=ContentStore(tmp_path / "cas"),
                                   work_root=tmp_path / "work", sandbox=sandbox, **options)
    assert outcome.ok, (outcome.error, outcome.stderr)
    return json.loads(outcome.stdout)


async def test_a_script_tool_cannot_reach_loopback_although_its_policy_names_it(
        tmp_path: Path, gateway: ThreadingHTTPServer, sandbox: str) -> None:
    port = _port(gateway)
    url = f"http://127.0.0.1:{port}/v1/tools/register"
    seen = await _probe_run(sandbox, tmp_path, _probe(allowed_ports=[port]),
                            {"urls": [url, f"http://localhost:{port}/"],
                             "direct": [f"127.0.0.1:{port}"]})
    assert seen[url] == "refused: 403"
    assert seen[f"http://localhost:{port}/"] == "refused: 403"
    assert seen[f"127.0.0.1:{port}"].startswith("failed")
    assert gateway.seen == []  # type: ignore[attr-defined]


async def test_only_the_listed_hosts_and_ports_are_reached(
        tmp_path: Path, gateway: ThreadingHTTPServer,
        permitted: ThreadingHTTPServer, sandbox: str) -> None:
    allowed, other = _port(permitted), _port(gateway)
    urls = {"permitted": f"http://127.0.0.2:{allowed}/data",
            "unlisted_port": f"http://127.0.0.2:{other}/",
            "loopback": f"http://127.0.0.1:{allowed}/",
            "unlisted_host": f"http://example.invalid:{allowed}/"}
    seen = await _probe_run(sandbox,
        tmp_path, _probe(allowed_ports=[allowed]), {"urls": list(urls.values())},
        policy=SandboxPolicy(egress_allowed_networks=("127.0.0.2/32",)))
    assert seen[urls["permitted"]] == "reached: permitted answered"
    assert seen[urls["unlisted_port"]] == "refused: 403"
    assert seen[urls["loopback"]] == "refused: 403"
    assert seen[urls["unlisted_host"]] == "refused: 403"
    assert permitted.seen == ["/data"]  # type: ignore[attr-defined]
    assert gateway.seen == []  # type: ignore[attr-defined]


async def test_an_empty_allowed_ports_lets_a_script_tool_reach_no_port(
        tmp_path: Path, permitted: ThreadingHTTPServer, sandbox: str) -> None:
    url = f"http://127.0.0.2:{_port(permitted)}/"
    seen = await _probe_run(sandbox, tmp_path, _probe(), {"urls": [url]},
                            policy=SandboxPolicy(egress_allowed_networks=("127.0.0.2/32",)))
    assert seen[url] == "refused: 403"
    assert permitted.seen == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_an_api_tool_cannot_reach_the_control_plane_on_loopback(
        tmp_path: Path, gateway: ThreadingHTTPServer, host: str) -> None:
    port = _port(gateway)
    source = load_source(TOOLS / "lifecycle_poker.yaml")
    builtins = {s.manifest["tool_id"]: s for s in load_builtin_sources()}
    plan = build_plan(ResolvedChain((seal(source), seal(builtins["http_client"]))))
    assert isinstance(plan, HttpPlan)
    plan = dataclasses.replace(plan, network=dataclasses.replace(plan.network,
                                                                 allowed_ports=(port,)))
    runner = Primitives(ContentStore(tmp_path / "cas"), tmp_path / "work")
    try:
        outcome = await runner.run(plan, {"host": host, "port": port, "tool": "hello",
                                          "state": "deprecated"}, secrets=lambda name: None)
    finally:
        await runner.aclose()
    assert outcome.error is not None and outcome.error["code"] == "E3406", outcome
    assert gateway.seen == []  # type: ignore[attr-defined]


async def test_an_api_tool_with_an_empty_allowed_ports_reaches_no_port(
        tmp_path: Path, permitted: ThreadingHTTPServer) -> None:
    runner = Primitives(ContentStore(tmp_path / "cas"), tmp_path / "work",
                        policy=SandboxPolicy(egress_allowed_networks=("127.0.0.2/32",)))
    plan = HttpPlan(method="GET", url_template=f"http://127.0.0.2:{_port(permitted)}/",
                    network=NetworkPolicy(allowed_domains=("127.0.0.2",), allowed_ports=()))
    try:
        outcome = await runner.run(plan, {}, secrets=lambda name: None)
    finally:
        await runner.aclose()
    assert outcome.error is not None and outcome.error["code"] == "E3406"
    assert permitted.seen == []  # type: ignore[attr-defined]
