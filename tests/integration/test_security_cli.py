"""Authorization end to end, as an operator runs it: `toolexec up` with tokens required,
`token issue` with the embedded dev key, `run --token`, `policy apply` (Cedar)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_process import REPO, start_up, stop, toolexec
from tests.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.security]

AUTH = {"TOOLEXEC_REQUIRE_AUTH": "true"}
HELLO = ("hello", "-p", "name=Ada", "--json")
NO_DEMOS = """
@id("no-demo-tools")
@reason("demo tools are disabled here")
forbid(principal, action, resource) when { resource.tags.contains("demo") };
permit(principal, action, resource);
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cwd = tmp_path_factory.mktemp("secured")
    process = start_up(cwd, "--tools", str(REPO / "examples/tools"), env=AUTH)
    yield cwd
    stop(process)


def _run(cwd: Path, *args: str) -> tuple[int, dict]:
    done = toolexec("run", *args, cwd=cwd, env=AUTH)
    return done.returncode, json.loads(done.stdout)


def _token(cwd: Path, *grants: str, scopes: tuple[str, ...] = ()) -> str:
    tools = [arg for grant in grants for arg in ("--tool", grant)]
    done = toolexec("token", "issue", "--sub", "did:example:ada", *tools, *scopes,
                    "--ttl", "300", "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["token"]


def test_without_a_token_the_invocation_is_refused(secured: Path) -> None:
    code, body = _run(secured, *HELLO)
    assert code == 1 and body["error"]["code"] == "E3203"


def test_a_forged_token_is_refused(secured: Path) -> None:
    token = _token(secured, "hello@^1")
    header, payload, signature = token.split(".")
    forged = f"{header}.{payload}.{signature[::-1]}"
    code, body = _run(secured, *HELLO, "--token", forged)
    assert code == 1 and body["error"]["code"] in ("E3202", "E3203")


def test_a_token_for_another_tool_is_E3204(secured: Path) -> None:
    code, body = _run(secured, *HELLO, "--token", _token(secured, "word_stats"))
    assert code == 1 and body["error"]["code"] == "E3204"


def test_a_valid_token_runs_the_tool_then_a_policy_denies_it(secured: Path) -> None:
    token = _token(secured, "hello@^1")
    code, body = _run(secured, *HELLO, "--token", token)
    assert code == 0, body
    assert body["result"] == {"greeting": "Hello, Ada!"}

    policy = secured / "no_demo.cedar"
    policy.write_text(NO_DEMOS)
    applied = toolexec("policy", "apply", str(policy), "--json", "--token",
                       _token(secured, scopes=("--policy",)), cwd=secured)
    assert applied.returncode == 0, applied.stderr
    # Policies travel through the log to every authorize process: wait until in force.
    code, body = until(lambda: (answer := _run(secured, *HELLO, "--token", token))[0] == 1
                       and answer, "the applied policy refuses the demo tool")
    assert body["error"]["code"] == "E3206", body
    assert "no-demo-tools" in body["error"]["message"]
    assert "demo tools are disabled here" in body["error"]["message"]
