"""Hostile tools under the Landlock sandbox (the fallback when bubblewrap is missing):
each attempt is refused by the kernel and the host is unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from consumers.primitives import bubblewrap, landlock, landlock_exec, namespace_launcher
from consumers.primitives.file_store import ContentStore
from consumers.primitives.subprocess_primitive import NO_SANDBOX, resolve_sandbox, run_subprocess
from domain.model import (
    NetworkPolicy,
    PrimitiveOutcome,
    ResourceLimits,
    SubprocessPlan,
    ToolFile,
)
from domain.sandbox_policy import SandboxPolicy
from tests.waiting import WAIT

ABI = landlock_exec.abi_version()
pytestmark = [
    pytest.mark.security,
    pytest.mark.skipif(ABI < landlock.MIN_NETWORK_ABI,
                       reason=f"this kernel's Landlock ABI is {ABI}: Landlock with network "
                              f"rules (ABI {landlock.MIN_NETWORK_ABI}) is not available"),
]


def _plan(source: str, **changes: Any) -> SubprocessPlan:
    content = textwrap.dedent(source).encode()
    file = ToolFile("main.py", hashlib.sha256(content).hexdigest(), False, content)
    return SubprocessPlan(argv=("python3", "main.py"), files=(file,), timeout_seconds=20,
                          **changes)


async def _run(tmp_path: Path, source: str, params: dict[str, Any] | None = None,
               **changes: Any) -> PrimitiveOutcome:
    return await run_subprocess(_plan(source, **changes), params or {},
                                store=ContentStore(tmp_path / "cas"),
                                work_root=tmp_path / "work", sandbox="landlock")


@pytest.fixture
def listener() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


async def test_a_normal_tool_reads_params_and_writes_in_its_dir(tmp_path: Path) -> None:
    outcome = await _run(tmp_path, """
        import json, os, sys
        params = json.load(sys.stdin)
        with open(os.path.join(os.environ["TMPDIR"], "scratch.txt"), "w") as file:
            file.write(params["text"])
        print(json.dumps({"echo": open(os.environ["TMPDIR"] + "/scratch.txt").read()}))
    """, {"text": "hello"})
    assert outcome.ok, (outcome.error, outcome.stderr)
    assert outcome.sandbox == "landlock"
    assert json.loads(outcome.stdout) == {"echo": "hello"}


async def test_reading_etc_shadow_fails(tmp_path: Path) -> None:
    outcome = await _run(tmp_path, "print(open('/etc/shadow').read())")
    assert not outcome.ok and outcome.error["code"] == "E3401"
    assert b"Permission denied" in outcome.stderr


async def test_reading_a_host_file_outside_its_dir_fails(tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host secret")
    outcome = await _run(tmp_path, f"print(open({str(secret)!r}).read())")
    assert not outcome.ok and outcome.error["code"] == "E3401"
    assert b"host secret" not in outcome.stdout
    assert b"Permission denied" in outcome.stderr


async def test_writing_outside_its_temp_dir_fails_and_the_host_is_unchanged(
        tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    outcome = await _run(tmp_path, f"""
        open("inside.txt", "w").write("fine")
        for path in ({str(target)!r}, "/tmp/landlock-escaped.txt", "/usr/escaped.txt"):
            try:
                open(path, "w").write("x")
                print("WROTE", path)
            except OSError as error:
                print("refused", path, error.errno)
    """)
    assert outcome.ok, outcome.error
    assert outcome.stdout.count(b"refused") == 3 and b"WROTE" not in outcome.stdout
    assert not target.exists() and not Path("/tmp/landlock-escaped.txt").exists()


async def test_tcp_connect_fails_without_network_permission(tmp_path: Path,
                                                            listener: int) -> None:
    outcome = await _run(tmp_path, f"""
        import socket
        socket.create_connection(("127.0.0.1", {listener}), timeout=2)
        print("CONNECTED")
    """)
    assert not outcome.ok and b"CONNECTED" not in outcome.stdout
    assert b"Permission denied" in outcome.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the empty network namespace needs root")
async def test_udp_datagrams_do_not_leave_the_sandbox(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.settimeout(0.5)
        outcome = await _run(tmp_path, f"""
            import socket
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                s.sendto(b"exfiltrated", ("127.0.0.1", {server.getsockname()[1]}))
                print("sent")
            except OSError as error:
                print("refused", error.errno)
        """)
        with pytest.raises(TimeoutError):
            server.recvfrom(100)
    assert outcome.ok, outcome.error
    assert outcome.stdout.startswith(b"refused")


@pytest.mark.skipif(os.geteuid() != 0, reason="the egress relay needs a network namespace")
async def test_network_policy_reaches_allowed_hosts_through_the_egress_proxy_only(
        tmp_path: Path, listener: int) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        outcome = await run_subprocess(
            _plan(f"""
                import socket, urllib.request
                print(urllib.request.urlopen("http://127.0.0.1:{port}/", timeout=10).read().decode())
                for target in ({port}, {listener}):
                    try:
                        socket.create_connection(("127.0.0.1", target), timeout=2)
                        print("DIRECT")
                    except OSError:
                        print("no direct route")
            """, network=NetworkPolicy(allowed_domains=("127.0.0.1",), allowed_ports=(port,))),
            {}, store=ContentStore(tmp_path / "cas"), work_root=tmp_path / "work",
            sandbox="landlock", policy=SandboxPolicy(egress_allowed_networks=("127.0.0.1/32",)))
    finally:
        server.shutdown()
        server.server_close()
    assert outcome.ok, (outcome.error, outcome.stderr)
    assert outcome.stdout.split(b"\n")[:3] == [b"hello", b"no direct route", b"no direct route"]


@pytest.mark.skipif(os.geteuid() == 0, reason="as root the egress relay is available")
async def test_without_root_a_network_policy_fails_closed(tmp_path: Path) -> None:
    outcome = await _run(tmp_path, "print(1)", network=NetworkPolicy(
        allowed_domains=("example.com",)))
    assert not outcome.ok and outcome.error["code"] == "E3405"


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args: Any) -> None:
        pass


async def test_signalling_toolexec_is_refused(tmp_path: Path) -> None:
    outcome = await _run(tmp_path, f"""
        import os, signal
        try:
            os.kill({os.getpid()}, signal.SIGTERM)
            print("SIGNALLED")
        except PermissionError:
            print("refused")
    """)
    assert outcome.stdout.strip() == b"refused"  # and this test process is still alive


async def test_rlimits_still_apply_under_landlock(tmp_path: Path) -> None:
    outcome = await _run(tmp_path, "x = bytearray(600 * 1024 * 1024)",
                         limits=ResourceLimits(memory_bytes=200 * 1024 * 1024))
    assert not outcome.ok and outcome.error["code"] == "E3403"


@pytest.mark.skipif(os.geteuid() != 0, reason="capabilities are dropped only as root")
async def test_as_root_the_tool_has_no_capabilities(tmp_path: Path) -> None:
    outcome = await _run(tmp_path, """
        import os
        print(os.getuid())
        try:
            os.setuid(12345)
            os.setuid(0)
            print("ESCALATED")
        except PermissionError:
            print("no caps")
    """)
    assert outcome.ok, outcome.error
    assert outcome.stdout.splitlines() == [b"0", b"no caps"]


async def test_a_kernel_without_landlock_fails_closed_with_E3405(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(landlock_exec, "abi_version", lambda: 0)
    outcome = await _run(tmp_path, "print(1)")
    assert not outcome.ok and outcome.error["code"] == "E3405"
    assert "Landlock" in outcome.error["message"]


async def test_a_tool_process_that_cannot_restrict_itself_fails_closed_with_E3405(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: Any) -> None:
        raise landlock_exec.SetupError("landlock_restrict_self: refused")

    monkeypatch.setattr(landlock_exec, "enter", refuse)
    outcome = await _run(tmp_path, "print('TOOL RAN')")
    assert not outcome.ok and outcome.error["code"] == "E3405"
    assert "landlock" in outcome.error["message"]
    assert b"TOOL RAN" not in outcome.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the relay (and so the wrapper) needs root")
async def test_a_wrapper_that_cannot_restrict_itself_fails_closed_with_E3405(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_prefix = landlock.landlock_prefix

    def unusable_rules(*args: Any, **kwargs: Any) -> list[str]:
        return [*real_prefix(*args, **kwargs)[:-1], "--net", "ports:eighty", "--"]

    monkeypatch.setattr(landlock, "landlock_prefix", unusable_rules)
    outcome = await _run(tmp_path, "print('TOOL RAN')", network=NetworkPolicy(
        allowed_domains=("example.com",)))
    assert not outcome.ok and outcome.error["code"] == "E3405"
    assert "landlock_exec" in outcome.error["message"]
    assert b"TOOL RAN" not in outcome.stdout


def test_auto_falls_back_from_bwrap_to_landlock_then_fails_closed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(namespace_launcher, "usable", lambda: False)
    monkeypatch.setattr(bubblewrap, "bwrap_binary", lambda: None)
    assert resolve_sandbox("auto", strict=True) == "landlock"
    monkeypatch.setattr(landlock_exec, "abi_version", lambda: 0)
    assert resolve_sandbox("auto", strict=True) == NO_SANDBOX
    assert resolve_sandbox("auto") == "rlimits"  # the embedded profile's fallback
    assert resolve_sandbox("rlimits", strict=True) == "rlimits"  # the explicit opt-out


async def test_with_no_sandbox_available_every_run_fails_with_E3405(tmp_path: Path) -> None:
    outcome = await run_subprocess(_plan("print(1)"), {}, store=ContentStore(tmp_path / "c"),
                                   work_root=tmp_path / "w", sandbox=NO_SANDBOX)
    assert not outcome.ok and outcome.error["code"] == "E3405"
    assert "TOOLEXEC_SANDBOX=rlimits" in outcome.error["message"]


@pytest.mark.integration
async def test_a_tool_runs_end_to_end_under_landlock_and_the_log_says_so(
        tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from contracts.envelope import Envelope
    from toolexec.client import InvocationClient
    from toolexec.publishing import publish_event
    from toolexec.settings import Settings
    from toolexec.sources import load_builtin_sources, load_source
    from toolexec.stack import Stack

    tools = Path(__file__).parents[1] / "integration" / "tools"
    settings = Settings(state_dir=tmp_path / "state", tools_dir=tmp_path / "none",
                        user_tools_dir=None, sandbox="landlock")
    seen: list[Envelope] = []
    async with Stack(settings, group_prefix="landlock") as stack:
        for source in [*load_builtin_sources(), load_source(tools / "py_echo"),
                       load_source(tools / "sh_upper")]:
            await stack.publish(publish_event(source, now=datetime.now(UTC)))
        async with InvocationClient(stack.bootstrap, verifier=stack.verifier) as client:
            python = await client.invoke("py_echo", {"text": "ab", "times": 2},
                                         progress=seen.append, timeout=WAIT)
            shell = await client.invoke("sh_upper", {"text": "quiet words"},
                                        progress=seen.append, timeout=WAIT)
    assert python.type == "tool.invoke.completed", python.data
    assert python.data.result == {"echo": "abab", "keys": 2}
    assert shell.type == "tool.invoke.completed", shell.data
    assert "QUIET WORDS" in shell.data.result["upper"]
    started = [e for e in seen if e.type == "tool.execution.started"]
    assert [e.data.sandbox for e in started] == ["landlock", "landlock"]
