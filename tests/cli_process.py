"""Run the `toolexec` CLI as users do: in its own process, with a clean environment."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import START_WAIT, WAIT
from toolexec.broker_control import stop_broker
from toolexec.settings import Settings

REPO = Path(__file__).resolve().parents[1]


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without TOOLEXEC_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLEXEC_")}
    env.update(extra or {})
    return env


def toolexec(*args: str, cwd: Path, timeout: float = START_WAIT,
             env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`toolexec ARGS` in `cwd`; returns the finished process (stdout, stderr as text).
    The bound only fails a hang: at load 20 on 2 cores even `--help` took 30 s, and a
    command that talks to the broker several times took over 120 s."""
    return subprocess.run([sys.executable, "-m", "toolexec.cli", *args], cwd=cwd,
                          env=clean_env(env), capture_output=True, text=True, timeout=timeout)


def start_up(cwd: Path, *args: str, env: Mapping[str, str] | None = None,
             timeout: float = START_WAIT) -> subprocess.Popen[str]:
    """`toolexec up ARGS` in `cwd`, returned once it has written its runtime file (the
    bound only fails an `up` that hangs: a loaded machine starts it slowly).

    Its stdout and stderr go to files, never to pipes nobody reads while it runs (a
    chatty `up` would block on a full pipe): read them with `output` or `finish`."""
    logs = Path(tempfile.mkdtemp(prefix="toolexec-up-"))
    atexit.register(shutil.rmtree, logs, ignore_errors=True)
    with (logs / "stdout").open("w") as out, (logs / "stderr").open("w") as err:
        process = subprocess.Popen([sys.executable, "-m", "toolexec.cli", "up", *args],
                                   cwd=cwd, env=clean_env(env), stdout=out, stderr=err,
                                   text=True)
    runtime = cwd / ".toolexec" / "runtime.json"
    _state_dirs[process.pid] = cwd / ".toolexec"
    _logs[process.pid] = logs
    deadline = time.monotonic() + timeout
    while not runtime.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            pytest.fail(f"toolexec up did not start; its stderr ends:\n{tail(process)}")
        time.sleep(0.1)
    return process


_state_dirs: dict[int, Path] = {}
_logs: dict[int, Path] = {}


def output(process: subprocess.Popen[str]) -> tuple[str, str]:
    """What `up` (from `start_up`) has written so far: (stdout, stderr)."""
    logs = _logs[process.pid]
    return (logs / "stdout").read_text(errors="replace"), \
        (logs / "stderr").read_text(errors="replace")


def tail(process: subprocess.Popen[str], chars: int = 4000) -> str:
    """The end of `up`'s stderr, for failure messages."""
    return output(process)[1][-chars:]


def finish(process: subprocess.Popen[str], timeout: float = WAIT) -> tuple[str, str]:
    """Wait for `up` (from `start_up`) to exit, e.g. after a SIGTERM; its (stdout,
    stderr). The bound only fails an `up` that does not stop."""
    process.wait(timeout=timeout)
    return output(process)


def stop(process: subprocess.Popen[str]) -> None:
    """Kill `up` and stop the embedded broker it started (it outlives `up` by design)."""
    if process.poll() is None:
        process.kill()
        process.wait()
    state_dir = _state_dirs.pop(process.pid, None)
    if state_dir is not None:
        stop_broker(Settings(state_dir=state_dir))


def halt(process: subprocess.Popen[str], timeout: float = 30) -> None:
    """Stop `up` as a user does (SIGTERM, waited for up to `timeout`), then `stop`
    whatever is left of it and the broker it started."""
    process.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)
    stop(process)


@contextlib.contextmanager
def serving_up(cwd: Path, tools: Path,
               env: Mapping[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """`toolexec up --tools TOOLS` running in `cwd` inside the block, halted after it."""
    process = start_up(cwd, "--tools", str(tools), env=env)
    try:
        yield process
    finally:
        halt(process)


def runtime(cwd: Path) -> dict[str, Any]:
    """What the `up` running in `cwd` wrote of itself (pid, broker, gateway URL...)."""
    return dict(json.loads((cwd / ".toolexec" / "runtime.json").read_text()))
