"""Hostile tools under the bubblewrap sandbox and the namespace launcher (the same
isolation): each attempt is contained, reported, and leaves the host unchanged (spec
12.6.1). Every test runs under both where both are available."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from consumers.primitives import bubblewrap, namespace_launcher
from consumers.primitives.file_store import ContentStore
from consumers.primitives.subprocess_primitive import resolve_sandbox, run_subprocess
from domain.model import NetworkPolicy, PrimitiveOutcome, ResourceLimits, SubprocessPlan, ToolFile
from domain.sandbox_policy import SandboxPolicy
from tests.security.conftest import NO_BWRAP

pytestmark = [pytest.mark.security]


def _plan(source: str, **changes: Any) -> SubprocessPlan:
    content = textwrap.dedent(source).encode()
    file = ToolFile("main.py", hashlib.sha256(content).hexdigest(), False, content)
    return SubprocessPlan(argv=("python3", "main.py"), files=(file,), timeout_seconds=20,
                          **changes)


async def _run(tmp_path: Path, sandbox: str, source: str,
               params: dict[str, Any] | None = None, **changes: Any) -> PrimitiveOutcome:
    return await run_subprocess(_plan(source, **changes), params or {},
                                store=ContentStore(tmp_path / "cas"),
                                work_root=tmp_path / "work", sandbox=sandbox)


async def test_tool_runs_unprivileged_in_its_own_pid_namespace(tmp_path: Path, sandbox: str) -> None:
    outcome = await _run(tmp_path, sandbox, """
        import json, os
        print(json.dumps({"uid": os.getuid(), "pid": os.getpid()}))
    """)
    assert outcome.ok, outcome.error
    assert outcome.sandbox == sandbox
    seen = __import__("json").loads(outcome.stdout)
    # as root each run has a uid of its own (sandbox_uids), else 65534 in a user namespace
    unprivileged = (range(200_000, 200_000 + 1024) if os.geteuid() == 0 else range(65534, 65535))
    assert seen["uid"] in unprivileged and seen["pid"] < 10  # pid 1 is the sandbox's init


async def test_a_tool_holds_no_descriptor_but_its_standard_streams(
        tmp_path: Path, sandbox: str) -> None:
    outcome = await _run(tmp_path, sandbox, """
        import os
        print(sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
    """)
    assert outcome.ok, outcome.error
    assert outcome.stdout == b"[0, 1, 2, 3]\n"  # 3: the listing's own


async def test_output_larger_than_its_pipes_is_read_whole(tmp_path: Path, sandbox: str) -> None:
    # a tool that fills both pipes is read to its end (the exit's reads and the
    # pipes' readers together)
    outcome = await _run(tmp_path, sandbox, """
        import sys
        for _ in range(48):
            sys.stdout.write("o" * 65536)
            sys.stderr.write("e" * 65536)
    """, limits=ResourceLimits(stdout_max_bytes=1 << 23, stderr_max_bytes=1 << 23))
    assert outcome.ok, outcome.error
    assert outcome.stdout == b"o" * 48 * 65536 and outcome.stderr == b"e" * 48 * 65536


async def test_reading_etc_shadow_fails(tmp_path: Path, sandbox: str) -> None:
    outcome = await _run(tmp_path, sandbox, "print(open('/etc/shadow').read())")
    assert not outcome.ok and outcome.error["code"] == "E3401"
    assert b"No such file" in outcome.stderr or b"Permission denied" in outcome.stderr


async def test_the_sandbox_etc_holds_the_hosts_entries_and_nothing_else(
        tmp_path: Path, sandbox: str) -> None:
    outcome = await _run(tmp_path, sandbox, """
        import json, os
        print(json.dumps({"entries": sorted(os.listdir("/etc")),
                          "passwd": open("/etc/passwd").read(),
                          "certs": os.path.isdir("/etc/ssl/certs")}))
    """)
    assert outcome.ok, outcome.error
    seen = __import__("json").loads(outcome.stdout)
    assert set(seen["entries"]) <= set(bubblewrap.SYSTEM_ETC_ENTRIES)
    assert "shadow" not in seen["entries"]
    assert seen["passwd"] == Path("/etc/passwd").read_text()
    assert seen["certs"] == Path("/etc/ssl/certs").is_dir()


async def test_a_run_makes_nothing_on_the_host_and_gets_its_working_directory(
        tmp_path: Path, sandbox: str) -> None:
    plan = _plan("""
        import os
        open("made-here.txt", "w").write("x")
        os.makedirs(os.path.join(os.environ["HOME"], "more"))
        print(os.getcwd())
    """, cwd="sub/dir")
    plan = dataclasses.replace(plan, argv=("python3", "../../main.py"))
    outcome = await run_subprocess(plan, {}, store=ContentStore(tmp_path / "cas"),
                                   work_root=tmp_path / "work", sandbox=sandbox)
    assert outcome.ok, outcome.error
    assert outcome.stdout.decode().strip().endswith("/sub/dir")
    work = tmp_path / "work"
    assert not work.exists() or list(work.iterdir()) == []


async def test_a_tool_cannot_change_its_files_for_the_next_run(tmp_path: Path, sandbox: str) -> None:
    source = """
        import os
        print(open("main.py").read().count("EVIL"))
        for attempt in (lambda: open("main.py", "a").write("# EVIL"),
                        lambda: os.chmod("main.py", 0o777)):
            try:
                attempt()
            except OSError:
                pass
    """
    first = await _run(tmp_path, sandbox, source)
    second = await _run(tmp_path, sandbox, source)
    assert first.ok and second.ok, (first.error, second.error)
    assert first.stdout == second.stdout == b"2\n"  # the two in this source, never a third


async def test_reading_a_host_file_outside_its_dir_fails(tmp_path: Path, sandbox: str) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host secret")
    outcome = await _run(tmp_path, sandbox, f"print(open({str(secret)!r}).read())")
    assert not outcome.ok
    assert b"host secret" not in outcome.stdout


async def test_writing_outside_its_temp_dir_fails_and_the_host_is_unchanged(
        tmp_path: Path, sandbox: str) -> None:
    target = tmp_path / "escaped.txt"
    outcome = await _run(tmp_path, sandbox, f"""
        import os
        open("inside.txt", "w").write("fine")
        for path in ({str(target)!r}, "/usr/escaped.txt", "/etc/escaped.txt"):
            try:
                open(path, "w").write("x")
                print("WROTE", path)
            except OSError as error:
                print("refused", path, error.errno)
    """)
    assert outcome.ok, outcome.error
    assert b"WROTE" not in outcome.stdout
    assert not target.exists() and not Path("/usr/escaped.txt").exists()


async def test_socket_to_loopback_fails_without_network_permission(tmp_path: Path, sandbox: str) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        outcome = await _run(tmp_path, sandbox, f"""
            import socket
            socket.create_connection(("127.0.0.1", {port}), timeout=2)
            print("CONNECTED")
        """)
    finally:
        server.close()
    assert not outcome.ok and b"CONNECTED" not in outcome.stdout


async def test_a_tool_has_its_own_loopback_and_nothing_else(tmp_path: Path,
                                                             sandbox: str) -> None:
    outcome = await _run(tmp_path, sandbox, """
        import json, os, socket
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        socket.create_connection(server.getsockname(), timeout=5).sendall(b"own")
        print(json.dumps({"echo": server.accept()[0].recv(3).decode(),
                          "interfaces": sorted(os.listdir("/sys/class/net"))
                          if os.path.isdir("/sys/class/net") else ["lo"]}))
    """)
    assert outcome.ok, (outcome.error, outcome.stderr)
    seen = __import__("json").loads(outcome.stdout)
    assert seen == {"echo": "own", "interfaces": ["lo"]}


async def test_network_policy_reaches_allowed_hosts_through_the_egress_proxy_only(
        tmp_path: Path, sandbox: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        outcome = await run_subprocess(
            _plan(f"""
                import socket, urllib.request
                print(urllib.request.urlopen("http://127.0.0.1:{port}/", timeout=10).read().decode())
                try:
                    socket.create_connection(("127.0.0.1", {port}), timeout=2)
                    print("DIRECT")
                except OSError:
                    print("no direct route")
            """, network=NetworkPolicy(allowed_domains=("127.0.0.1",), allowed_ports=(port,))),
            {}, store=ContentStore(tmp_path / "cas"), work_root=tmp_path / "work",
            sandbox=sandbox, policy=SandboxPolicy(egress_allowed_networks=("127.0.0.1/32",)))
    finally:
        server.shutdown()
        server.server_close()
    assert outcome.ok, (outcome.error, outcome.stderr)
    assert outcome.stdout.split(b"\n")[:2] == [b"hello", b"no direct route"]


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args: Any) -> None:
        pass


async def test_fork_bomb_is_contained_by_the_process_limit(tmp_path: Path, sandbox: str) -> None:
    outcome = await _run(tmp_path, sandbox, """
        import os, time
        count = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                count += 1
        except OSError as error:
            print("stopped after", count, error.errno)
    """, limits=ResourceLimits(max_processes=20))
    assert outcome.ok, outcome.error
    assert b"stopped after" in outcome.stdout
    assert int(outcome.stdout.split()[2]) < 20


async def test_sudo_does_not_escalate(tmp_path: Path, sandbox: str) -> None:
    outcome = await _run(tmp_path, sandbox, """
        import os, subprocess, sys
        for argv in (["sudo", "-n", "id", "-u"], ["su", "-c", "id -u"]):
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=5)
                if done.returncode == 0 and done.stdout.strip() == "0":
                    print("ROOT")
            except (OSError, subprocess.SubprocessError):
                pass
        try:
            os.setuid(0)
            print("ROOT")
        except PermissionError:
            pass
    """)
    assert b"ROOT" not in outcome.stdout


async def test_killing_the_parent_is_not_possible(tmp_path: Path, sandbox: str) -> None:
    import os
    outcome = await _run(tmp_path, sandbox, f"""
        import os, signal
        for pid in ({os.getpid()}, 1, os.getppid()):
            try:
                os.kill(pid, signal.SIGKILL)
                print("killed", pid)
            except OSError as error:
                print("refused", pid, error.errno)
    """)
    assert outcome.sandbox == sandbox  # and this test process is still alive


@NO_BWRAP
async def test_missing_bwrap_fails_closed_with_E3405(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(bubblewrap, "bwrap_binary", lambda: None)
    outcome = await _run(tmp_path, "bwrap", "print(1)")
    assert not outcome.ok and outcome.error["code"] == "E3405"
    # the launcher, else landlock or rlimits: tests/security/test_landlock
    assert resolve_sandbox("auto") != "bwrap"


def test_auto_prefers_the_launcher_then_bwrap() -> None:
    if namespace_launcher.usable():
        assert resolve_sandbox("auto") == "namespaces"
    elif bubblewrap.bwrap_binary() is not None:
        assert resolve_sandbox("auto") == "bwrap"
    assert resolve_sandbox("rlimits") == "rlimits"


async def test_spawn_overhead_is_reported(tmp_path: Path, sandbox: str) -> None:
    """Not an assertion on speed: records the sandbox's vs rlimits spawn p50 in the output."""
    store = ContentStore(tmp_path / "cas")
    figures = {}
    for name in ("rlimits", sandbox):
        samples = []
        for _ in range(10):
            started = time.perf_counter()
            outcome = await run_subprocess(SubprocessPlan(argv=("/usr/bin/true",)), {},
                                           store=store, work_root=tmp_path / "w",
                                           sandbox=name)
            samples.append((time.perf_counter() - started) * 1000)
            assert outcome.ok, outcome.error
        figures[name] = sorted(samples)[5]
    print(f"spawn p50 ms: {figures}")
