"""Every CLI command answers its errors as it answers its results: a JSON document with
`--json`, exit 1 for a failure carrying an E3xxx code, 2 for a malformed request (E3004).
No running system is needed: each request is refused before it would reach one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_process import REPO, toolexec

pytestmark = pytest.mark.integration

EXAMPLES = str(REPO / "examples" / "tools")


def _error(done) -> dict:  # type: ignore[no-untyped-def]
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout)["error"]


@pytest.mark.parametrize("args", [
    ("run", "hello", "--params", "[1, 2]"),
    ("run", "hello", "--params", "{not json"),
    ("run", "hello", "-p", "no-equals-sign"),
    ("run", "hello", "--lock", "no-such-lockfile.json"),
    ("run", "hello", "--tools", "/nonexistent/tools"),
    ("run",),
    ("publish", "/nonexistent/tool"),
    ("policy", "apply", "no-such-policy.cedar"),
    ("cancel", " "),
    ("lock", "@^1"),
    ("deprecate", "hello@not-a-version"),
    ("token", "issue", "--sub", "did:example:ada"),
], ids=lambda args: " ".join(args))
def test_bad_usage_is_a_json_error_E3004_and_exit_2(args: tuple[str, ...],
                                                    tmp_path: Path) -> None:
    done = toolexec(*args, "--json", cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert _error(done)["code"] == "E3004"


def test_run_with_a_missing_tools_directory_names_it_rather_than_ignoring_it(
        tmp_path: Path) -> None:
    done = toolexec("run", "hello", "--tools", "/nonexistent/tools", cwd=tmp_path)
    assert done.returncode == 2
    assert "/nonexistent/tools" in done.stderr and "E3004" in done.stderr


def test_policy_apply_of_unparsable_cedar_is_a_json_error(tmp_path: Path) -> None:
    (tmp_path / "broken.cedar").write_text("permit(principal, action,")
    done = toolexec("policy", "apply", "broken.cedar", "--json", cwd=tmp_path)
    assert done.returncode == 1
    assert _error(done)["code"].startswith("E32")


def test_policy_apply_without_a_running_system_is_a_json_E3001(tmp_path: Path) -> None:
    (tmp_path / "no_demo.cedar").write_text((REPO / "examples/policies/no_demo.cedar")
                                            .read_text())
    done = toolexec("policy", "apply", "no_demo.cedar", "--json", cwd=tmp_path)
    assert done.returncode == 1
    assert _error(done)["code"] == "E3001"


def test_bad_usage_without_json_is_a_line_on_stderr(tmp_path: Path) -> None:
    done = toolexec("run", "hello", "--params", "[1]", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == "" and "--params must be a JSON object" in done.stderr
