"""The subprocess primitive and the content store against real processes and files."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import stat
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from consumers.primitives import bubblewrap
from consumers.primitives.file_store import ContentStore
from consumers.primitives.host_groups import FOLDER
from consumers.primitives.subprocess_primitive import run_subprocess
from domain.errors import ExecutionError, IntegrityMismatch
from domain.model import PrimitiveOutcome, ResourceLimits, SubprocessPlan, ToolFile
from tests.waiting import eventually

pytestmark = pytest.mark.integration

ECHO_TOOL = """
import json, os, sys
params = json.load(sys.stdin)
print(json.dumps({"params": params, "argv": sys.argv[1:], "cwd": os.getcwd(),
                  "env": dict(os.environ)}))
"""


def tool_file(source: str, path: str = "main.py", *, executable: bool = False) -> ToolFile:
    content = textwrap.dedent(source).encode()
    return ToolFile(path, hashlib.sha256(content).hexdigest(), executable, content)


def python_plan(source: str, *args: str, **changes: Any) -> SubprocessPlan:
    plan = SubprocessPlan(argv=(sys.executable, "main.py", *args), files=(tool_file(source),))
    return dataclasses.replace(plan, **changes)


@pytest.fixture
def store(tmp_path: Path) -> ContentStore:
    return ContentStore(tmp_path / "cas")


@pytest.fixture
def work_root(tmp_path: Path) -> Path:
    return tmp_path / "work"


@pytest.fixture
def run(store: ContentStore, work_root: Path) -> Any:
    async def runner(plan: SubprocessPlan, params: dict[str, Any] | None = None,
                     **kwargs: Any) -> PrimitiveOutcome:
        return await run_subprocess(plan, params or {}, store=store, work_root=work_root,
                                    **kwargs)
    return runner


def result_of(outcome: PrimitiveOutcome) -> Any:
    assert outcome.ok, outcome.error
    return json.loads(outcome.stdout)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie is dead; only its parent may reap it


# -- the tool process protocol ---------------------------------------------------------

async def test_tool_echoes_parameters_through_stdin_and_stdout(run: Any) -> None:
    params = {"word": "héllo", "n": 3, "nested": {"list": [1, None, True]}}
    outcome = await run(python_plan(ECHO_TOOL), params)
    assert result_of(outcome)["params"] == params
    assert outcome.exit_code == 0 and outcome.error is None
    assert outcome.sandbox == "rlimits" and outcome.duration_ms > 0


async def test_large_parameters_reach_the_tool_whole(run: Any) -> None:
    params = {"blob": "x" * 300_000}
    outcome = await run(python_plan(ECHO_TOOL), params)
    assert result_of(outcome)["params"] == params


async def test_tool_runs_in_its_own_directory_which_is_removed_afterwards(
        run: Any, work_root: Path) -> None:
    result = result_of(await run(python_plan(ECHO_TOOL)))
    assert Path(result["cwd"]).parent == work_root
    assert result["env"]["HOME"] == result["env"]["TMPDIR"] == result["cwd"]
    assert [p.name for p in work_root.iterdir() if p.name != FOLDER] == []
    assert not any((work_root / FOLDER).glob("*"))  # nor its process group's entry


async def test_child_sees_only_the_plan_environment(
        run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLEXEC_TEST_LEAK", "must-not-leak")
    outcome = await run(python_plan(ECHO_TOOL, env={"GREETING": "hi"}))
    env = result_of(outcome)["env"]
    env.pop("LC_CTYPE", None)  # Python's own locale coercion (PEP 538) in the child
    assert set(env) == {"GREETING", "PATH", "HOME", "TMPDIR"}
    assert env["GREETING"] == "hi" and env["PATH"] == "/usr/local/bin:/usr/bin:/bin"


async def test_hostile_parameters_reach_the_tool_verbatim_and_no_shell_runs(
        run: Any, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    params = {"a": "; rm -rf /tmp/x", "b": f"$(touch {marker})", "c": f"`touch {marker}`"}
    argument = f"$(touch {marker}); echo hi | cat"
    result = result_of(await run(python_plan(ECHO_TOOL, argument), params))
    assert result["params"] == params
    assert result["argv"] == [argument]
    assert not marker.exists()


# -- failures --------------------------------------------------------------------------

async def test_non_zero_exit_is_E3401_with_the_stderr_tail(run: Any) -> None:
    tool = """
    import sys
    sys.stderr.write("noise\\n" * 2000)
    sys.stderr.write("boom: the end")
    sys.exit(3)
    """
    outcome = await run(python_plan(tool))
    assert not outcome.ok and outcome.exit_code == 3
    assert outcome.error is not None and outcome.error["code"] == "E3401"
    tail = outcome.error["details"]["stderr_tail"]
    assert tail.endswith("boom: the end") and len(tail) <= 2048


async def test_missing_executable_is_E3401_naming_it(run: Any) -> None:
    plan = SubprocessPlan(argv=("no-such-tool-binary", "x"))
    outcome = await run(plan)
    assert outcome.error is not None and outcome.error["code"] == "E3401"
    assert "not found" in outcome.error["message"]
    assert "no-such-tool-binary" in outcome.error["message"]


async def test_timeout_kills_the_whole_process_group(run: Any) -> None:
    tool = """
    import os, subprocess, sys, time
    child = subprocess.Popen(["sleep", "600"])
    sys.stderr.write(f"pids {os.getpid()} {child.pid}\\n")
    sys.stderr.flush()
    time.sleep(600)
    """
    # 15 s: long enough for a busy machine to start Python and write the pids first
    outcome = await run(python_plan(tool, timeout_seconds=15.0))
    assert outcome.error is not None and outcome.error["code"] == "E3402"
    pids = [int(p) for p in outcome.stderr.decode().split("pids", 1)[1].split()]
    assert len(pids) == 2
    await eventually(lambda: all(_gone(pid) for pid in pids), "the tool and its child are gone")


async def test_grandchildren_do_not_outlive_a_successful_run(run: Any) -> None:
    tool = """
    import subprocess, sys
    child = subprocess.Popen(["sleep", "60"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    print(child.pid)
    """
    outcome = await run(python_plan(tool))
    pid = int(result_of(outcome))
    await eventually(lambda: _gone(pid), "the grandchild is gone")


async def test_memory_hog_is_E3403(run: Any) -> None:
    tool = """
    import sys
    sys.stdin.read()
    blob = bytearray(512 * 1024 * 1024)
    print(len(blob))
    """
    limits = ResourceLimits(memory_bytes=64 * 1024 * 1024)
    outcome = await run(python_plan(tool, limits=limits))
    assert outcome.error is not None and outcome.error["code"] == "E3403", outcome.error
    assert outcome.error["details"]["memory_bytes"] == 64 * 1024 * 1024


async def test_a_plain_crash_is_E3404_not_out_of_memory(run: Any) -> None:
    tool = """
    import os, signal
    os.kill(os.getpid(), signal.SIGSEGV)
    """
    outcome = await run(python_plan(tool))
    assert outcome.error is not None and outcome.error["code"] == "E3404"
    assert outcome.error["details"]["signal"] == "SIGSEGV"
    assert outcome.exit_code == -11


async def test_a_crash_is_not_blamed_on_memory_our_own_process_used(run: Any) -> None:
    # The spawned child inherits our peak RSS through vfork/exec; with a limit below
    # it that inherited figure is past 75 % of the limit, yet it is not the tool's.
    import resource

    own_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    limits = ResourceLimits(memory_bytes=max(own_peak, 48 * 1024 * 1024))
    tool = """
    import os, signal
    os.kill(os.getpid(), signal.SIGSEGV)
    """
    outcome = await run(python_plan(tool, limits=limits))
    assert outcome.error is not None and outcome.error["code"] == "E3404", outcome.error


async def test_cpu_time_limit_is_E3407(run: Any) -> None:
    tool = """
    while True:
        pass
    """
    limits = ResourceLimits(cpu_seconds=1)
    outcome = await run(python_plan(tool, limits=limits, timeout_seconds=10))
    assert outcome.error is not None and outcome.error["code"] == "E3407"


async def test_output_beyond_the_caps_is_dropped_and_reported(run: Any) -> None:
    tool = """
    import sys
    sys.stdout.write("o" * 1_000_000)
    sys.stderr.write("e" * 1_000_000)
    """
    limits = ResourceLimits(stdout_max_bytes=1000, stderr_max_bytes=10)
    outcome = await run(python_plan(tool, limits=limits))
    assert outcome.ok
    assert outcome.stdout == b"o" * 1000 and outcome.stdout_truncated
    assert outcome.stderr == b"e" * 10 and outcome.stderr_truncated


async def test_output_larger_than_its_pipes_is_read_whole(run: Any) -> None:
    # a tool that fills both pipes must be read to its end, not left blocked
    tool = """
    import sys
    for _ in range(48):
        sys.stdout.write("o" * 65536)
        sys.stderr.write("e" * 65536)
    """
    size = 48 * 65536
    limits = ResourceLimits(stdout_max_bytes=4 * size, stderr_max_bytes=4 * size)
    outcome = await run(python_plan(tool, limits=limits, timeout_seconds=60))
    assert outcome.ok, outcome.error
    assert outcome.stdout == b"o" * size and not outcome.stdout_truncated
    assert outcome.stderr == b"e" * size and not outcome.stderr_truncated


async def test_unknown_sandbox_is_E3405(run: Any) -> None:
    outcome = await run(python_plan(ECHO_TOOL), sandbox="vm")
    assert outcome.error is not None and outcome.error["code"] == "E3405"


# -- files -----------------------------------------------------------------------------

async def test_tampered_file_fails_integrity_before_anything_runs(
        run: Any, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    good = tool_file(f"open({str(marker)!r}, 'w').close()\n")
    tampered = dataclasses.replace(good, content=good.content + b"# evil\n")  # type: ignore[operator]
    plan = SubprocessPlan(argv=(sys.executable, "main.py"), files=(tampered,))
    outcome = await run(plan)
    assert outcome.error is not None and outcome.error["code"] == "E3105"
    assert not marker.exists()


async def test_path_escaping_the_tool_root_is_refused(run: Any, work_root: Path) -> None:
    escaping = tool_file("print(1)", path="../escaped.py")
    plan = SubprocessPlan(argv=(sys.executable, "main.py"), files=(escaping,))
    outcome = await run(plan)
    assert outcome.error is not None and outcome.error["code"] == "E3401"
    assert not (work_root / "escaped.py").exists()


async def test_executable_tool_file_runs_from_a_subdirectory(run: Any) -> None:
    script = tool_file(f"#!{sys.executable}\nprint('[1, 2]')\n", path="bin/tool",
                       executable=True)
    outcome = await run(SubprocessPlan(argv=("./bin/tool",), files=(script,)))
    assert result_of(outcome) == [1, 2]


def test_store_round_trips_and_detects_corruption(store: ContentStore) -> None:
    digest = store.put(b"hello")
    assert digest == hashlib.sha256(b"hello").hexdigest()
    assert store.has(digest) and store.get(digest) == b"hello"
    path = store.root / digest[:2] / digest[2:4] / digest
    path.chmod(0o644)
    path.write_bytes(b"hellO")
    with pytest.raises(IntegrityMismatch):
        store.get(digest)


def test_materialise_writes_files_with_modes(store: ContentStore, tmp_path: Path) -> None:
    files = (tool_file("a", "x/run.sh", executable=True), tool_file("b", "data.txt"))
    dest = tmp_path / "dest"
    dest.mkdir()
    store.materialise(files, dest)
    assert (dest / "x/run.sh").read_bytes() == b"a"
    assert stat.S_IMODE((dest / "x/run.sh").stat().st_mode) & 0o111
    assert not stat.S_IMODE((dest / "data.txt").stat().st_mode) & 0o111


def test_materialise_from_the_store_when_content_is_absent(
        store: ContentStore, tmp_path: Path) -> None:
    digest = store.put(b"stored")
    store.materialise((ToolFile("f", digest, True),), tmp_path)
    assert (tmp_path / "f").read_bytes() == b"stored"


def test_materialise_refuses_tampered_content(store: ContentStore, tmp_path: Path) -> None:
    good, dest = tool_file("print(1)", "good.py"), tmp_path / "dest"
    dest.mkdir()
    bad = dataclasses.replace(tool_file("print(1)"), content=b"print(2)")
    with pytest.raises(IntegrityMismatch):
        store.materialise((good, bad), dest)
    assert list(dest.iterdir()) == []  # checked before anything is written


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../../x", "", "a\\..\\x"])
def test_materialise_refuses_unsafe_paths(store: ContentStore, tmp_path: Path,
                                          path: str) -> None:
    with pytest.raises(ExecutionError) as caught:
        store.materialise((tool_file("x", path),), tmp_path / "dest")
    assert caught.value.code == "E3401"


def test_materialise_refuses_a_symlinked_directory(store: ContentStore, tmp_path: Path) -> None:
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "lib").symlink_to(outside)
    with pytest.raises(ExecutionError):
        store.materialise((tool_file("x", "lib/evil.py"),), dest)
    assert list(outside.iterdir()) == []


def test_a_tool_writing_to_its_file_does_not_poison_the_next_run(
        store: ContentStore, tmp_path: Path) -> None:
    file = tool_file("original")
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    store.materialise((file,), first)
    (first / "main.py").chmod(0o644)  # root could write anyway; make it explicit
    with open(first / "main.py", "ab") as handle:
        handle.write(b" tampered")
    store.materialise((file,), second)  # the bytes at hand restore a good copy
    assert (second / "main.py").read_bytes() == b"original"
    with open(second / "main.py", "ab") as handle:
        handle.write(b" again")
    third = tmp_path / "three"
    third.mkdir()
    with pytest.raises(IntegrityMismatch):
        store.materialise((dataclasses.replace(file, content=None),), third)


async def test_limits_hold_without_prlimit_too(
        run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from consumers.primitives import tool_process

    monkeypatch.setattr(tool_process, "_prlimit_binary", lambda: None)
    tool = """
    import sys
    blob = bytearray(512 * 1024 * 1024)
    """
    limits = ResourceLimits(memory_bytes=64 * 1024 * 1024)
    outcome = await run(python_plan(tool, limits=limits))
    assert outcome.error is not None and outcome.error["code"] == "E3403"
    assert result_of(await run(python_plan(ECHO_TOOL), {"a": 1}))["params"] == {"a": 1}


# -- the operator's sandbox policy -----------------------------------------------------

needs_bwrap = pytest.mark.skipif(bubblewrap.bwrap_binary() is None,
                                 reason="bubblewrap not installed")


@needs_bwrap
async def test_every_run_gives_back_its_uid_whatever_its_end(run: Any) -> None:
    from consumers.primitives.sandbox_uids import shared_pool

    pool = shared_pool()
    before = pool.in_use
    outcomes = await asyncio.gather(
        run(python_plan(ECHO_TOOL, argv=("python3", "main.py")), sandbox="bwrap"),
        run(python_plan("import sys; sys.exit(3)", argv=("python3", "main.py")),
            sandbox="bwrap"),
        run(python_plan("import time; time.sleep(30)", argv=("python3", "main.py"),
                        timeout_seconds=0.5), sandbox="bwrap"))
    assert [o.error["code"] if o.error else None for o in outcomes] == [None, "E3401", "E3402"]
    assert pool.in_use == before


@needs_bwrap
async def test_the_run_directory_and_tmp_share_one_quota(run: Any) -> None:
    from domain.sandbox_policy import MIB, SandboxPolicy

    tool = """
    import json, os
    written = 0
    try:
        for index in range(40):
            folder = "/tmp" if index % 2 else "."
            with open(os.path.join(folder, f"f{index}"), "wb") as out:
                out.write(b"x" * 1024 * 1024)
            written += 1
    except OSError as error:
        print(json.dumps({"written": written, "errno": error.errno}))
    """
    outcome = await run(python_plan(tool, argv=("python3", "main.py")), sandbox="bwrap",
                        policy=SandboxPolicy(max_disk_bytes=8 * MIB))
    report = result_of(outcome)
    assert report["written"] <= 8 and report["errno"] in (27, 28)  # EFBIG, ENOSPC


@needs_bwrap
async def test_a_connect_tunnel_carries_a_raw_tcp_stream_to_a_permitted_host(
        run: Any) -> None:
    from domain.model import NetworkPolicy
    from domain.sandbox_policy import SandboxPolicy

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write((await reader.readline()).upper())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.2", 0)
    port = server.sockets[0].getsockname()[1]
    tool = f"""
    import os, socket
    proxy = os.environ["HTTPS_PROXY"].removeprefix("http://").split(":")
    with socket.create_connection((proxy[0], int(proxy[1])), timeout=10) as tunnel:
        tunnel.sendall(b"CONNECT 127.0.0.2:{port} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        head = b""
        while not head.endswith(b"\\r\\n\\r\\n"):
            head += tunnel.recv(1)
        tunnel.sendall(b"through the tunnel\\n")
        print(head.split(b"\\r\\n")[0].decode(), "|", tunnel.makefile().readline().strip())
    """
    async with server:
        outcome = await run(
            python_plan(tool, argv=("python3", "main.py"),
                        network=NetworkPolicy(allowed_domains=("127.0.0.2",),
                                              allowed_ports=(port,))),
            sandbox="bwrap", policy=SandboxPolicy(egress_allowed_networks=("127.0.0.2/32",)))
    assert outcome.ok, (outcome.error, outcome.stderr)
    assert outcome.stdout.strip() == b"HTTP/1.1 200 Connection established | THROUGH THE TUNNEL"


@needs_bwrap
async def test_a_manifest_cannot_raise_its_limits_above_the_operators(run: Any) -> None:
    from domain.sandbox_policy import MIB, SandboxPolicy

    tool = """
    import json, resource
    print(json.dumps({"as": resource.getrlimit(resource.RLIMIT_AS)[0],
                      "cpu": resource.getrlimit(resource.RLIMIT_CPU)[0]}))
    """
    limits = ResourceLimits(memory_bytes=64 * 1024 * MIB, cpu_seconds=10_000)
    outcome = await run(python_plan(tool, argv=("python3", "main.py"), limits=limits),
                        sandbox="bwrap",
                        policy=SandboxPolicy(max_memory_bytes=512 * MIB, max_cpu_seconds=7))
    assert result_of(outcome) == {"as": 512 * MIB, "cpu": 7}
