"""`toolexec bench` under a real-time policy (`chrt`): only the scenarios that start no
server run; any other is refused before anything starts, since the broker,
PostgreSQL and `toolexec up` would inherit the policy (one real-time server busy in a
loop starves what it waits for and spins every core)."""

from __future__ import annotations

import os

import pytest
import typer
from typer.testing import CliRunner

from toolexec.bench import command

runner = CliRunner()


@pytest.fixture
def app() -> typer.Typer:
    application = typer.Typer()
    command.register(application)
    application.command("unused")(lambda: None)  # two commands: `bench` stays a name
    return application


@pytest.fixture
def real_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command.os, "sched_getscheduler", lambda pid: os.SCHED_FIFO)


def started(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    runs: list[list[str]] = []

    async def run_bench(chosen: list[str], sizes: command.Sizes) -> list:
        runs.append(chosen)
        return []

    monkeypatch.setattr(command, "run_bench", run_bench)
    return runs


@pytest.mark.parametrize("scenarios", [["replay"], ["sandbox", "idle"], []])
def test_scenarios_that_start_servers_are_refused_under_a_real_time_policy(
        app: typer.Typer, real_time: None, monkeypatch: pytest.MonkeyPatch,
        scenarios: list[str]) -> None:
    runs = started(monkeypatch)
    done = runner.invoke(app, ["bench", *(f"--scenario={name}" for name in scenarios)])
    assert done.exit_code == 2
    assert "real-time policy" in done.output and runs == []


def test_the_sandbox_scenario_runs_under_a_real_time_policy(
        app: typer.Typer, real_time: None, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = started(monkeypatch)
    done = runner.invoke(app, ["bench", "--scenario", "sandbox", "--scenario", "hot-path"])
    assert done.exit_code == 0, done.output
    assert runs == [["hot-path", "sandbox"]]


def test_every_scenario_runs_under_the_normal_policy(
        app: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command.os, "sched_getscheduler", lambda pid: os.SCHED_OTHER)
    runs = started(monkeypatch)
    assert runner.invoke(app, ["bench", "--scenario", "replay"]).exit_code == 0
    assert runs == [["replay"]]
