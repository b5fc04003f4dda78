"""Our Python children never import from their working directory: a folder there
named like one of our packages (a user's project with its own `domain/`, or a
checkout beside the installed code) is not imported in place of ours."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from toolexec import broker_control
from toolexec.child_python import module_argv
from toolexec.settings import Settings

CHILD_SECONDS = 120  # a bound against a hang only


def _shadowing(directory: Path, package: str) -> Path:
    """`directory` with a package `package` that fails loudly when imported."""
    (directory / package).mkdir()
    (directory / package / "__init__.py").write_text(
        "raise SystemExit('imported from the working directory')\n", encoding="utf-8")
    return directory


@pytest.mark.parametrize("package", ["toolexec", "domain", "contracts"])
def test_a_package_of_ours_in_the_working_directory_is_not_imported(
        tmp_path: Path, package: str) -> None:
    done = subprocess.run(module_argv("toolexec.cli", "--help"),  # noqa: S603 - ours
                          cwd=_shadowing(tmp_path, package), capture_output=True,
                          text=True, timeout=CHILD_SECONDS, check=False)
    assert done.returncode == 0, done.stderr
    assert "working directory" not in done.stderr
    assert "Usage" in done.stdout


def test_the_broker_supervisor_starts_as_such_a_child(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []

    def popen(argv: list[str], **_: object) -> None:
        started.append(argv)

    monkeypatch.setattr(broker_control.subprocess, "Popen", popen)
    broker_control._spawn_supervisor(  # noqa: SLF001
        Settings(state_dir=tmp_path / ".toolexec"), gated=False, port=None)
    [argv] = started
    assert argv[1:4] == ["-P", "-m", broker_control.SUPERVISOR_MODULE]
