"""Importing the `toolexec` application is light: every command is registered with
Typer, rich and the command modules only; the settings, Kafka, SQL, HTTP, the stack,
the projections, the consumers and the bench's scenarios are imported by the
commands that use them. `toolexec --help` pays for none of them, nor does the fork
server of `projections rebuild`, which preloads the modules of the `toolexec`
script (`projections.rebuild_workers.preloaded_modules`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHILD_SECONDS = 120  # a bound against a hang only

HEAVY_PACKAGES = ("sqlalchemy", "alembic", "aiokafka", "faststream", "httpx", "fastapi",
                  "uvicorn", "mcp", "pydantic", "pydantic_settings", "jwt", "cryptography",
                  "structlog", "projections", "consumers", "contracts")
HEAVY_MODULES = ("toolexec.settings", "toolexec.stack", "toolexec.system", "toolexec.client",
                 "toolexec.runtime_file", "toolexec.broker_control", "toolexec.usecases",
                 "domain.validation")
BENCH_REGISTRATION = {"toolexec.bench", "toolexec.bench.command"}


@pytest.fixture(scope="module")
def imported() -> set[str]:
    """The modules a fresh interpreter holds after `import toolexec.cli.main`."""
    code = "import json, sys, toolexec.cli.main; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-P", "-c", code],  # noqa: S603 - ours
                          capture_output=True, text=True, timeout=CHILD_SECONDS, check=True)
    return set(json.loads(done.stdout))


def _loaded(imported: set[str], name: str) -> list[str]:
    return sorted(module for module in imported
                  if module == name or module.startswith(f"{name}."))


@pytest.mark.parametrize("package", HEAVY_PACKAGES + HEAVY_MODULES)
def test_importing_the_application_leaves_the_heavy_parts_out(
        imported: set[str], package: str) -> None:
    assert "toolexec.cli.main" in imported
    assert _loaded(imported, package) == []


def test_of_the_bench_only_its_command_registration_is_imported(imported: set[str]) -> None:
    assert set(_loaded(imported, "toolexec.bench")) == BENCH_REGISTRATION
