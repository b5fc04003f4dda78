"""What `toolexec bench` measures against: bench tools, a local HTTP server and an
embedded stack, each in a process of its own, all on 127.0.0.1, under one temp dir."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from contracts.fact_signature import FactVerifier
from domain.chain import resolve_chain
from domain.integrity import seal
from domain.model import ResolvedChain, SubprocessPlan, ToolSource
from domain.plan import build_plan
from domain.registry import InMemoryRegistry
from toolexec import keys
from toolexec.bench.stack import bench_settings
from toolexec.child_python import module_argv
from toolexec.client import InvocationClient
from toolexec.settings import fetch_waits
from toolexec.sources import load_builtin_sources, load_source

SCRIPT_TOOL = "bench_noop"
API_TOOL = "bench_api"
SCRIPT_PARAMS = {"text": "ping"}
API_PARAMS = {"word": "ping"}
HANG_SECONDS = 600.0
"""The bound of every wait on the bench's own processes and calls (starting, reading
back, an invocation): it ends a hang, not a slow run on a loaded machine."""
CHILD_START_SECONDS = HANG_SECONDS
CHILD_STOP_SECONDS = 15.0

_NOOP_MAIN = """import json
import sys

params = json.load(sys.stdin)
print(json.dumps({"ok": True, "keys": len(params)}))
"""

_NOOP_MANIFEST = """tool_id: bench_noop
version: "1.0.0"
tool_type: script
executor: python_runtime
description: Trivial Python tool of the benchmark; reads its parameters, prints a result.
config:
  entrypoint: main.py
parameters:
  type: object
  properties:
    text: {type: string, maxLength: 50}
  required: [text]
  additionalProperties: false
result_schema:
  type: object
  properties:
    ok: {type: boolean}
    keys: {type: integer}
  required: [ok, keys]
timeout_default: 30
"""


def _api_manifest(http_host: str) -> str:
    port = http_host.rsplit(":", 1)[1]
    return (
        "tool_id: bench_api\nversion: \"1.0.0\"\ntool_type: api\nexecutor: http_client\n"
        "description: Benchmark API tool calling the local bench HTTP server.\n"
        f"config:\n  method: GET\n  url_template: \"http://{http_host}/item/{{word}}\"\n"
        "parameters:\n  type: object\n  properties:\n    word: {type: string}\n"
        "  required: [word]\n"
        f"network_policy:\n  allowed_domains: [\"127.0.0.1\"]\n  allowed_ports: [{port}]\n"
    )


def write_bench_tools(root: Path, http_host: str) -> Path:
    """Write the bench's tool sources under `root/tools` and return that directory."""
    tools = root / "tools"
    noop = tools / SCRIPT_TOOL
    noop.mkdir(parents=True, exist_ok=True)
    (noop / "tool.yaml").write_text(_NOOP_MANIFEST)
    (noop / "main.py").write_text(_NOOP_MAIN)
    (tools / f"{API_TOOL}.yaml").write_text(_api_manifest(http_host))
    return tools


def bench_sources(tools_dir: Path) -> list[ToolSource]:
    """The built-in tools plus the bench tools, as the stack publishes them."""
    return load_builtin_sources() + [load_source(p) for p in sorted(tools_dir.iterdir())]


def bench_registry(tools_dir: Path) -> InMemoryRegistry:
    """An in-memory registry holding every bench source, sealed."""
    return InMemoryRegistry(seal(source) for source in bench_sources(tools_dir))


def script_chain(tools_dir: Path) -> ResolvedChain:
    """The resolved chain of the script tool (leaf..primitive)."""
    return resolve_chain(bench_registry(tools_dir), SCRIPT_TOOL)


def script_plan(tools_dir: Path) -> SubprocessPlan:
    """The subprocess plan the executor builds for the script tool."""
    plan = build_plan(script_chain(tools_dir))
    assert isinstance(plan, SubprocessPlan)
    return plan


@dataclass
class ChildProcess:
    """A helper process announcing itself on its first stdout line, stopped by
    closing its stdin (so it also ends when this process dies)."""

    argv: list[str]
    stderr_path: Path
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    async def start(self) -> str:
        """Spawn and return the first line the child prints."""
        with self.stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
        stdout = self.process.stdout
        assert stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(stdout.readline), CHILD_START_SECONDS)
        if not line:
            tail = self.stderr_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.argv[2]} did not start: {tail}")
        return line.decode().strip()

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    async def ask(self, line: str) -> str:
        """Send `line` on the child's stdin and return the line it answers."""
        assert self.process is not None and self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()
        answer = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline),
                                        CHILD_START_SECONDS)
        return answer.decode().strip()

    async def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            await asyncio.to_thread(self.process.wait, CHILD_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            await asyncio.to_thread(self.process.wait)


def python_module(module: str, *args: str) -> list[str]:
    return module_argv(module, *args)


class BenchEnvironment:
    """Temp dir + HTTP server process + stack process + one invocation client."""

    def __init__(self, execute_workers: int = 50) -> None:
        self.execute_workers = execute_workers
        self._tmp = tempfile.TemporaryDirectory(prefix="toolexec-bench-")
        self.root = Path(self._tmp.name)
        self.http = ChildProcess(python_module("toolexec.bench.http"), self.root / "http.log")
        self.stack = ChildProcess([], self.root / "stack.log")
        self.http_host = ""
        self.bootstrap = ""
        self.tools_dir = self.root / "tools"
        self.client: InvocationClient | None = None
        self.broker_supervisor_pid: int | None = None

    async def __aenter__(self) -> BenchEnvironment:
        try:
            await self._start()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _start(self) -> None:
        self.http_host = f"127.0.0.1:{await self.http.start()}"
        self.tools_dir = write_bench_tools(self.root, self.http_host)
        self.stack.argv = python_module("toolexec.bench.stack", str(self.root / "state"),
                                        str(self.tools_dir), str(self.execute_workers))
        announced = json.loads(await self.stack.start())
        self.bootstrap = announced["bootstrap"]
        self.broker_supervisor_pid = announced.get("broker_supervisor_pid")
        settings = bench_settings(self.root / "state")
        verify_keys = keys.fact_verify_keys(settings)
        self.client = InvocationClient(self.bootstrap, verifier=FactVerifier(verify_keys),
                                       fetch_waits=fetch_waits(settings))
        await self.client.start()

    async def read_model_lag(self) -> dict[str, dict[str, float]]:
        """The stack's read models' lag since the last call (see `toolexec.bench.stack`)."""
        return json.loads(await self.stack.ask("lag"))["lag"]

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.client is not None:
            await self.client.stop()
            self.client = None
        await self.stack.stop()
        await self.http.stop()
        self._tmp.cleanup()


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process `pid` so far (Linux /proc), else None."""
    if pid is None:
        return None
    stat = _stat(pid)
    return None if stat is None else stat[1]


def tree_cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds of process `pid` and of every process under it so far, the ended
    ones its tree has reaped included (Linux /proc), else None: the embedded broker
    measured whole, its supervisor, Tansu (a new one after each compaction) and the
    gate in front of it."""
    if pid is None:
        return None
    stats = {p: stat for p in _pids() if (stat := _stat(p)) is not None}
    if pid not in stats:
        return None
    children: dict[int, list[int]] = {}
    for child, (parent, _own, _reaped) in stats.items():
        children.setdefault(parent, []).append(child)
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        _parent, own, reaped = stats[current]
        total += own + reaped
        todo.extend(children.get(current, ()))
    return total


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _stat(pid: int) -> tuple[int, float, float] | None:
    """(parent pid, own CPU seconds, reaped children's CPU seconds) of `pid`."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick,
                (int(fields[13]) + int(fields[14])) / tick)
    except (OSError, ValueError, IndexError):
        return None


class CpuMeter:
    """CPU seconds the stack process and its broker (the supervisor that archives its
    log, Tansu and the gate: `tree_cpu_seconds`) spend between `start()` and
    `figures(calls)`: cost per invocation whatever else the machine is doing."""

    def __init__(self, env: BenchEnvironment) -> None:
        self._groups: dict[str, Callable[[], float | None]] = {
            "stack": lambda: cpu_seconds(env.stack.pid)}
        if env.broker_supervisor_pid:
            self._groups["broker"] = lambda: tree_cpu_seconds(env.broker_supervisor_pid)
        self._began: dict[str, float | None] = {}

    def start(self) -> None:
        self._began = {name: measure() for name, measure in self._groups.items()}

    def figures(self, calls: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, measure in self._groups.items():
            now, began = measure(), self._began.get(name)
            if now is not None and began is not None and calls:
                out[f"{name} CPU ms/invocation"] = round((now - began) / calls * 1000, 3)
        return out
