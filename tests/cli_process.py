"""Run the `toolexec` CLI as users do: in its own process, with a clean environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

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


def toolexec(*args: str, cwd: Path, timeout: float = WAIT,
             env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`toolexec ARGS` in `cwd`; returns the finished process (stdout, stderr as text)."""
    return subprocess.run([sys.executable, "-m", "toolexec.cli", *args], cwd=cwd,
                          env=clean_env(env), capture_output=True, text=True, timeout=timeout)


def start_up(cwd: Path, *args: str, env: Mapping[str, str] | None = None,
             timeout: float = START_WAIT) -> subprocess.Popen[str]:
    """`toolexec up ARGS` in `cwd`, returned once it has written its runtime file (the
    bound only fails an `up` that hangs: a loaded machine starts it slowly)."""
    process = subprocess.Popen([sys.executable, "-m", "toolexec.cli", "up", *args], cwd=cwd,
                               env=clean_env(env), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    runtime = cwd / ".toolexec" / "runtime.json"
    _state_dirs[process.pid] = cwd / ".toolexec"
    deadline = time.monotonic() + timeout
    while not runtime.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            pytest.fail(f"toolexec up did not start: {process.communicate()[1]}")
        time.sleep(0.1)
    return process


_state_dirs: dict[int, Path] = {}


def stop(process: subprocess.Popen[str]) -> None:
    """Kill `up` and stop the embedded broker it started (it outlives `up` by design)."""
    if process.poll() is None:
        process.kill()
        process.wait()
    state_dir = _state_dirs.pop(process.pid, None)
    if state_dir is not None:
        stop_broker(Settings(state_dir=state_dir))
