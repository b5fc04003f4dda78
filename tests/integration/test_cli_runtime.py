"""The `toolexec` CLI as users run it: real processes, real broker."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_process import REPO, start_up, stop, toolexec
from tests.waiting import WAIT

pytestmark = pytest.mark.integration

TOOLS = Path(__file__).parent / "tools"


def test_run_without_a_running_system_starts_one_for_the_call(tmp_path: Path) -> None:
    done = toolexec("run", "hello", "--tools", str(REPO / "examples/tools"), "-p", "name=Ada",
                    "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == {"greeting": "Hello, Ada!"}


def test_run_reports_the_error_code_and_exits_1(tmp_path: Path) -> None:
    done = toolexec("run", "no_such_tool", "--json", cwd=tmp_path)
    assert done.returncode == 1
    assert json.loads(done.stdout)["error"]["code"] == "E3101"


def test_run_with_bad_params_json_is_bad_usage(tmp_path: Path) -> None:
    done = toolexec("run", "hello", "--params", "{not json", cwd=tmp_path)
    assert done.returncode == 2


@pytest.fixture
def running_up(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    process = start_up(tmp_path, "--tools", str(TOOLS))
    yield process, tmp_path
    stop(process)


def test_up_serves_runs_and_publishes_then_stops_cleanly(running_up) -> None:
    process, cwd = running_up
    info = json.loads((cwd / ".toolexec" / "runtime.json").read_text())

    done = toolexec("run", "py_echo", "--params", '{"text": "hi"}', "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == {"echo": "hi", "keys": 1}

    new_tool = cwd / "shout"
    shutil.copytree(TOOLS / "py_echo", new_tool)
    manifest = (new_tool / "tool.yaml").read_text().replace("tool_id: py_echo", "tool_id: shout")
    (new_tool / "tool.yaml").write_text(manifest)
    published = toolexec("publish", str(new_tool), "--json", cwd=cwd)
    assert published.returncode == 0, published.stderr
    done = toolexec("run", "shout", "--params", '{"text": "yo"}', "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr

    broken = cwd / "broken"
    broken.mkdir()
    (broken / "tool.yaml").write_text("tool_id: Broken-Name\nversion: one\ntool_type: script\n")
    rejected = toolexec("publish", str(broken), "--json", cwd=cwd)
    assert rejected.returncode == 1
    assert json.loads(rejected.stdout)[0]["type"] == "tool.publish.rejected"
    plain = toolexec("publish", str(broken), cwd=cwd)  # the readable report, no TypeError
    assert plain.returncode == 1 and "Traceback" not in plain.stderr
    assert "rejected" in plain.stderr and "E3105" in plain.stderr
    unreadable = cwd / "unreadable"
    unreadable.mkdir()
    (unreadable / "tool.yaml").write_text("tool_id: [unclosed\n  : :\n")
    for as_json in (("--json",), ()):  # malformed YAML is a rejection, never exit 0
        refused = toolexec("publish", str(unreadable), *as_json, cwd=cwd)
        assert refused.returncode == 1, refused.stdout
        assert "None@None" not in refused.stderr
    refused = toolexec("publish", str(unreadable), "--json", cwd=cwd)
    assert json.loads(refused.stdout)[0]["error"]["code"] == "E3105"

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=WAIT) == 0
    assert not (cwd / ".toolexec" / "runtime.json").exists()
    os.kill(info["broker_pid"], 0)  # the embedded broker keeps the log for the next `up`
    stopped = toolexec("broker", "stop", "--json", cwd=cwd)
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["clean_stop"] is True
    with pytest.raises(ProcessLookupError):
        os.kill(info["broker_pid"], 0)


def test_lockfile_pins_the_chain_for_run(tmp_path: Path) -> None:
    examples = str(REPO / "examples/tools")
    locked = toolexec("lock", "hello", "--tools", examples, "-o", "hello.lock.json", cwd=tmp_path)
    assert locked.returncode == 0, locked.stderr
    lock = json.loads((tmp_path / "hello.lock.json").read_text())
    assert [e["tool_id"] for e in lock["resolved_chain"]] == ["hello", "python_runtime",
                                                              "subprocess"]
    done = toolexec("run", "hello", "--tools", examples, "--lock", "hello.lock.json",
                    "-p", "name=Lin", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == {"greeting": "Hello, Lin!"}


def test_lockfile_with_drifted_integrity_is_refused(tmp_path: Path) -> None:
    examples = str(REPO / "examples/tools")
    toolexec("lock", "hello", "--tools", examples, "-o", "hello.lock.json", cwd=tmp_path)
    lock = json.loads((tmp_path / "hello.lock.json").read_text())
    lock["resolved_chain"][0]["integrity"] = "sha256:" + "0" * 64
    (tmp_path / "hello.lock.json").write_text(json.dumps(lock))
    done = toolexec("run", "hello", "--tools", examples, "--lock", "hello.lock.json",
                    "-p", "name=Lin", "--json", cwd=tmp_path)
    assert done.returncode == 1
    assert json.loads(done.stdout)["error"]["code"] == "E3105"
