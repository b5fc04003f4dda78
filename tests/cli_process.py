"""Run the `toolexec` CLI as users do: in its own process, with a clean environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without TOOLEXEC_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLEXEC_")}
    env.update(extra or {})
    return env


def toolexec(*args: str, cwd: Path, timeout: float = 120,
             env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`toolexec ARGS` in `cwd`; returns the finished process (stdout, stderr as text)."""
    return subprocess.run([sys.executable, "-m", "toolexec.cli", *args], cwd=cwd,
                          env=clean_env(env), capture_output=True, text=True, timeout=timeout)


def start_up(cwd: Path, *args: str, env: Mapping[str, str] | None = None,
             timeout: float = 60) -> subprocess.Popen[str]:
    """`toolexec up ARGS` in `cwd`, returned once it has written its runtime file."""
    process = subprocess.Popen([sys.executable, "-m", "toolexec.cli", "up", *args], cwd=cwd,
                               env=clean_env(env), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    runtime = cwd / ".toolexec" / "runtime.json"
    deadline = time.monotonic() + timeout
    while not runtime.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"toolexec up did not start: {process.communicate()[1]}")
        time.sleep(0.1)
    return process


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()
