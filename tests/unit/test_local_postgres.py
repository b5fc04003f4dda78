"""A pgserver start that fails on a busy machine is tried again on the same directory."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from toolexec import local_postgres


def _fake_pgserver(monkeypatch: pytest.MonkeyPatch, failures: int) -> list[Path]:
    calls: list[Path] = []

    def get_server(data_dir: Path, cleanup_mode: str) -> types.SimpleNamespace:
        calls.append(data_dir)
        if len(calls) <= failures:
            raise subprocess.TimeoutExpired(["pg_ctl", "start"], 10)
        return types.SimpleNamespace(get_uri=lambda: f"server of {data_dir}")

    monkeypatch.setitem(sys.modules, "pgserver", types.SimpleNamespace(get_server=get_server))
    monkeypatch.setattr(local_postgres, "PAUSE_SECONDS", 0.0)
    monkeypatch.setattr(local_postgres, "wait_until_ready", lambda url: None)
    return calls


def test_a_start_that_timed_out_is_asked_again_on_the_same_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = _fake_pgserver(monkeypatch, failures=2)
    assert local_postgres.start_pgserver(tmp_path).get_uri() == f"server of {tmp_path}"
    assert calls == [tmp_path] * 3


def test_a_server_that_never_starts_raises_the_last_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = _fake_pgserver(monkeypatch, failures=99)
    with pytest.raises(subprocess.TimeoutExpired):
        local_postgres.start_pgserver(tmp_path, attempts=3)
    assert len(calls) == 3

