"""One `toolexec up` per state directory; what is left by one that was killed is
detected, reported and replaced; `run` and `publish` say when `up` is gone."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_process import REPO, clean_env, finish, start_up, stop, tail, toolexec
from tests.waiting import START_WAIT, WAIT, until
from toolexec.broker_control import process_alive, stop_broker
from toolexec.settings import Settings

pytestmark = pytest.mark.integration

ENV = {"TOOLEXEC_SANDBOX": "rlimits"}
TOOLS = Path(__file__).parent / "tools"


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    stop_broker(Settings(state_dir=tmp_path / ".toolexec"))


def runtime(cwd: Path) -> dict[str, object]:
    return json.loads((cwd / ".toolexec" / "runtime.json").read_text())


def test_a_second_up_refuses_and_names_the_running_one(project: Path) -> None:
    first = start_up(project, env=ENV)
    try:
        info = runtime(project)
        second = subprocess.run([sys.executable, "-m", "toolexec.cli", "up"], cwd=project,
                                env=clean_env(ENV), capture_output=True, text=True,
                                timeout=START_WAIT)
        assert second.returncode == 1
        message = " ".join(second.stderr.split())
        assert "E3001" in message
        assert f"pid {info['pid']}" in message and str(info["gateway_url"]) in message
        assert runtime(project)["pid"] == info["pid"]  # the first one's file is untouched
        assert first.poll() is None
    finally:
        stop(first)


def test_a_killed_ups_runtime_file_is_reported_and_replaced(project: Path) -> None:
    first = start_up(project, env=ENV)
    old = runtime(project)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=WAIT)

    second = start_up(project, env=ENV)  # returns at once: the old file is there
    try:
        def replaced() -> bool:  # removed, then written anew
            assert second.poll() is None, tail(second)
            return (project / ".toolexec" / "runtime.json").exists() \
                and runtime(project)["pid"] == second.pid

        until(replaced, "the second up writes its own runtime file", timeout=START_WAIT)
    finally:
        second.send_signal(signal.SIGTERM)
        _, stderr = finish(second)
    message = " ".join(stderr.split())
    assert f"pid {old['pid']}" in message and "is not running any more" in message
    assert "replacing" in message


def test_run_and_publish_say_when_up_is_gone_and_use_the_log_without_it(project: Path) -> None:
    up = start_up(project, "--tools", str(REPO / "examples" / "tools"), env=ENV)
    old = runtime(project)
    source = project / "sources" / "shout"
    shutil.copytree(TOOLS / "py_echo", source)
    manifest = (source / "tool.yaml").read_text().replace("tool_id: py_echo", "tool_id: shout")
    (source / "tool.yaml").write_text(manifest)
    up.send_signal(signal.SIGKILL)
    up.wait(timeout=WAIT)
    try:
        published = toolexec("publish", str(source), "--json", cwd=project, env=ENV)
        ran = toolexec("run", "shout", "--params", '{"text": "still here"}', "--json",
                       cwd=project, env=ENV)
    finally:
        stop(up)

    for done in (published, ran):
        assert done.returncode == 0, done.stderr
        message = " ".join(done.stderr.split())
        assert f"pid {old['pid']}" in message and "is not running any more" in message
    assert json.loads(ran.stdout)["result"] == {"echo": "still here", "keys": 1}


def test_publish_with_no_up_and_no_broker_says_what_to_start(project: Path) -> None:
    up = start_up(project, env=ENV)
    up.send_signal(signal.SIGKILL)
    up.wait(timeout=WAIT)
    stop(up)  # and its broker

    published = toolexec("publish", str(TOOLS / "py_echo"), cwd=project, env=ENV)

    assert published.returncode == 1
    message = " ".join(published.stderr.split())
    assert "E3001" in message and "is not running any more" in message
    assert "toolexec up" in message


def test_up_stops_when_its_state_directory_is_taken_away(project: Path) -> None:
    """Its log, read models and keys went with the directory: `up` stops and says so,
    rather than serve a new, empty log from a directory made again."""
    up = start_up(project, env=ENV)
    supervisor = runtime(project)["broker_supervisor_pid"]
    assert isinstance(supervisor, int)
    moved = project / "moved"
    (project / ".toolexec").rename(moved)  # as a deletion, in one step
    try:
        _, stderr = finish(up)
        until(lambda: not process_alive(supervisor, cmdline_has="broker_supervisor"),
              "the broker's supervisor stops too", timeout=WAIT)
    finally:
        stop(up)
        stop_broker(Settings(state_dir=moved))

    assert up.returncode == 1, stderr[-4000:]
    message = " ".join(stderr.split())
    assert "E3801" in message and "was deleted or moved while toolexec ran" in message
    assert "no new broker was started" in message
    assert not (project / ".toolexec").exists()  # nothing made the directory again


def test_run_without_up_stops_when_its_state_directory_is_taken_away(project: Path) -> None:
    """`toolexec run` on a stack of its own says so at once, rather than wait out its
    timeout for a terminal event no broker will carry, and its tool does not run on."""
    pidfile = project / "sleeper.pids"
    run = subprocess.Popen(
        [sys.executable, "-m", "toolexec.cli", "run", "sleeper", "--tools", str(TOOLS),
         "--params", json.dumps({"pidfile": str(pidfile)}), "--timeout", "3600"],
        cwd=project, env=clean_env(ENV), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    moved = project / "moved"
    try:
        until(lambda: pidfile.exists() and len(pidfile.read_text().split()) == 2,
              "the tool runs", timeout=START_WAIT)
        tool_pids = [int(pid) for pid in pidfile.read_text().split()]
        (project / ".toolexec").rename(moved)
        _, stderr = run.communicate(timeout=WAIT)
        until(lambda: not any(process_alive(pid) for pid in tool_pids),
              "the tool and its child are killed", timeout=WAIT)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        stop_broker(Settings(state_dir=moved))

    assert run.returncode == 1, stderr[-4000:]
    message = " ".join(stderr.split())
    assert "E3801" in message and "was deleted or moved while toolexec ran" in message
    assert not (project / ".toolexec").exists()
