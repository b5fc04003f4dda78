"""Tool lifecycle through a running `toolexec up`: deprecate, remove and restore from the
CLI and the gateway, and what `run`, the gateway's invoke and `show` make of it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cli_process import toolexec
from tests.integration.gateway_support import (
    TEST_TOOLS,
    RunningGateway,
    running_gateway,
    wait_until,
)

pytestmark = pytest.mark.integration

ECHO = {"text": "hi"}
ECHO_MAIN = (TEST_TOOLS / "py_echo" / "main.py").read_text()


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with running_gateway(tmp_path_factory.mktemp("lifecycle")) as running:
        yield running


def publish(system: RunningGateway, tool_id: str, *versions: str) -> None:
    """Register `tool_id` (a copy of py_echo) at each of `versions` through the gateway."""
    for version in versions:
        manifest = {"tool_id": tool_id, "version": version, "tool_type": "script",
                    "executor": "python_runtime", "config": {"entrypoint": "main.py"},
                    "description": "Echo for lifecycle tests.",
                    "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                                   "required": ["text"]}}
        response = system.register(manifest, [{"path": "main.py", "content": ECHO_MAIN}])
        assert response.status_code == 201, response.text


def cli(system: RunningGateway, *args: str) -> subprocess.CompletedProcess[str]:
    return toolexec(*args, cwd=system.cwd, env=system.env)


def cli_json(system: RunningGateway, *args: str) -> tuple[int, Any]:
    done = cli(system, *args, "--json")
    return done.returncode, json.loads(done.stdout)


def lifecycles(system: RunningGateway, tool_id: str) -> dict[str, str]:
    code, shown = cli_json(system, "show", tool_id)
    assert code == 0, shown
    return {v["version"]: v["lifecycle"] for v in shown["tool"]["versions"]}


def test_a_deprecated_version_still_runs_and_run_shows_the_warning(system) -> None:
    publish(system, "lc_old", "1.0.0")
    code, answer = cli_json(system, "deprecate", "lc_old@1.0.0", "--reason", "too chatty",
                            "--replacement", "py_echo")
    assert code == 0, answer
    assert answer["applied"] and answer["versions"] == [
        {"version": "1.0.0", "lifecycle": "deprecated"}]

    done = cli(system, "run", "lc_old", "-p", "text=hi")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"echo": "hi", "keys": 1}
    assert "lc_old@1.0.0 is deprecated: too chatty; use py_echo instead" in done.stderr


def test_the_resolution_event_carries_the_deprecation_warning(system) -> None:
    publish(system, "lc_warned", "1.0.0")
    assert cli_json(system, "deprecate", "lc_warned")[0] == 0
    assert system.invoke("lc_warned", ECHO).status_code == 200

    def resolutions() -> list[dict]:  # the audit read model folds shortly after the reply
        return system.http.get("/v1/audit", params={"tool": "lc_warned",
                                                    "type": "tool.chain.resolved"}
                               ).json()["records"]

    records = wait_until(resolutions)
    assert json.dumps(records).count("lc_warned@1.0.0 is deprecated") >= 1


def test_removing_the_only_matching_version_fails_invocations_with_e3104(system) -> None:
    publish(system, "lc_gone", "1.0.0")
    code, answer = cli_json(system, "remove", "lc_gone@1.0.0", "--reason", "unsafe")
    assert code == 0, answer

    code, failure = cli_json(system, "run", "lc_gone", "-p", "text=hi")
    assert code == 1
    assert failure["error"]["code"] == "E3104"
    assert failure["error"]["details"]["removed"] == ["1.0.0"]

    response = system.invoke("lc_gone", ECHO)
    assert response.status_code == 410
    assert response.json()["error"]["code"] == "E3104"


def test_removing_one_version_falls_back_to_the_remaining_one(system) -> None:
    publish(system, "lc_pair", "1.0.0", "1.1.0")
    assert cli_json(system, "remove", "lc_pair@1.1.0")[0] == 0
    response = system.invoke("lc_pair", ECHO)
    assert response.status_code == 200, response.text
    assert response.json()["version"] == "1.0.0"


def test_deprecating_every_version_leaves_a_removed_one_removed(system) -> None:
    publish(system, "lc_all", "1.0.0", "1.1.0")
    assert cli_json(system, "remove", "lc_all@1.1.0")[0] == 0
    code, answer = cli_json(system, "deprecate", "lc_all")
    assert code == 0, answer
    assert len(answer["event_ids"]) == 1
    assert lifecycles(system, "lc_all") == {"1.0.0": "deprecated", "1.1.0": "removed"}


def test_show_lists_the_lifecycle_of_every_version(system) -> None:
    publish(system, "lc_shown", "1.0.0", "1.1.0", "2.0.0")
    assert cli_json(system, "deprecate", "lc_shown@1.0.0", "--reason", "too old")[0] == 0
    assert cli_json(system, "remove", "lc_shown@1.1.0", "--replacement", "py_echo")[0] == 0
    assert lifecycles(system, "lc_shown") == {
        "1.0.0": "deprecated", "1.1.0": "removed", "2.0.0": "active"}
    table = toolexec("show", "lc_shown", cwd=system.cwd, env={**system.env, "COLUMNS": "300"})
    assert "deprecated (too old)" in table.stdout
    assert "removed (use py_echo)" in table.stdout


def test_rebuilding_the_registry_reproduces_the_lifecycle_states(system) -> None:
    publish(system, "lc_rebuilt", "1.0.0", "1.1.0")
    assert cli_json(system, "deprecate", "lc_rebuilt@1.1.0", "--reason", "slow")[0] == 0
    before = lifecycles(system, "lc_rebuilt")
    code, report = cli_json(system, "projections", "rebuild", "registry")
    assert code == 0, report
    assert lifecycles(system, "lc_rebuilt") == before == {
        "1.0.0": "active", "1.1.0": "deprecated"}


def test_unknown_tools_and_versions_are_refused_with_their_codes(system) -> None:
    code, failure = cli_json(system, "deprecate", "no_such_tool")
    assert (code, failure["error"]["code"]) == (1, "E3101")
    code, failure = cli_json(system, "remove", "py_echo@9.9.9")
    assert (code, failure["error"]["code"]) == (1, "E3102")
    assert "1.0.0" in failure["error"]["details"]["available"]
    code, failure = cli_json(system, "deprecate", "py_echo@1.0.0", "--replacement", "ghost")
    assert (code, failure["error"]["code"]) == (1, "E3101")
    assert lifecycles(system, "py_echo") == {"1.0.0": "active"}


def test_removing_without_an_exact_version_is_bad_usage(system) -> None:
    assert cli(system, "remove", "py_echo").returncode == 2
    assert cli(system, "remove", "py_echo@^1").returncode == 2


def test_the_gateway_deprecates_removes_and_restores(system) -> None:
    publish(system, "lc_http", "1.0.0")
    url = "/v1/tools/lc_http/lifecycle"
    deprecated = system.http.post(url, json={"version": "1.0.0", "state": "deprecated",
                                             "reason": "old", "replacement": "py_echo"})
    assert deprecated.status_code == 200, deprecated.text
    assert deprecated.json()["state"] == "deprecated"
    tool = system.http.get("/v1/tools/lc_http").json()["tool"]
    assert [(v["lifecycle"], v["lifecycle_reason"], v["replacement_tool_id"])
            for v in tool["versions"]] == [("deprecated", "old", "py_echo")]
    assert system.invoke("lc_http", ECHO).status_code == 200

    assert system.http.post(url, json={"version": "1.0.0", "state": "removed"}).status_code == 200
    assert system.invoke("lc_http", ECHO).status_code == 410

    assert system.http.post(url, json={"state": "active"}).status_code == 200
    assert system.invoke("lc_http", ECHO).status_code == 200


def test_the_gateway_refuses_unknown_tools_versions_and_states(system) -> None:
    ghost = system.http.post("/v1/tools/ghost/lifecycle", json={"state": "deprecated"})
    assert (ghost.status_code, ghost.json()["error"]["code"]) == (404, "E3101")
    version = system.http.post("/v1/tools/py_echo/lifecycle",
                               json={"version": "9.9.9", "state": "removed"})
    assert (version.status_code, version.json()["error"]["code"]) == (404, "E3102")
    state = system.http.post("/v1/tools/py_echo/lifecycle", json={"state": "retired"})
    assert state.status_code == 422
    whole = system.http.post("/v1/tools/py_echo/lifecycle", json={"state": "removed"})
    assert (whole.status_code, whole.json()["error"]["code"]) == (400, "E3004")
