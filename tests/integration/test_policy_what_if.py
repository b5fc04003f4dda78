"""`toolexec policy test` (and `policy apply --dry-run`) on the log of a running `up`
with authorization on: decisions of both outcomes are recorded, then a candidate is
replayed against them and lists exactly the invocations whose outcome it changes;
nothing is emitted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli_process import REPO, start_up, stop, toolexec
from tests.waiting import until

# its module fixture starts `up` and runs invocations: at load 20 that outlasted 300 s
pytestmark = [pytest.mark.integration, pytest.mark.security, pytest.mark.timeout(900)]

AUTH = {"TOOLEXEC_REQUIRE_AUTH": "true"}
ADA, BOB = "did:example:ada", "did:example:bob"
IN_FORCE = """
@id("default-permit")
permit (principal, action, resource);
@id("no-hello-for-bob")
forbid (principal == Agent::"did:example:bob", action, resource)
when { resource.tool_id == "hello" };
"""
CANDIDATE = """
@id("default-permit")
permit (principal, action, resource);
@id("no-word-stats-for-ada")
@reason("ada is done with word counts")
forbid (principal == Agent::"did:example:ada", action, resource)
when { resource.tool_id == "word_stats" };
"""
CALLS = {"hello": ("-p", "name=Ada"), "word_stats": ("-p", "text=one two two")}


@pytest.fixture(scope="module")
def cwd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("what-if")
    process = start_up(where, "--tools", str(REPO / "examples/tools"), env=AUTH)
    yield where
    stop(process)


def token(cwd: Path, subject: str, *args: str) -> str:
    done = toolexec("token", "issue", "--sub", subject, *args, "--ttl", "600", "--json",
                    cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["token"]


def run(cwd: Path, subject: str, tool: str) -> tuple[int, dict[str, Any]]:
    done = toolexec("run", tool, *CALLS[tool], "--json", "--token",
                    token(cwd, subject, "--tool", "hello", "--tool", "word_stats"),
                    cwd=cwd, env=AUTH)
    return done.returncode, json.loads(done.stdout)


def what_if(cwd: Path, *args: str) -> dict[str, Any]:
    done = toolexec("policy", *args, "--json", cwd=cwd, env=AUTH)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def recorded(cwd: Path) -> dict[str, str]:
    """The invocation ids of ada and bob on hello and word_stats under IN_FORCE
    (bob's hello denied), once the audit read model holds their decisions."""
    (cwd / "rules.cedar").write_text(IN_FORCE)
    applied = toolexec("policy", "apply", str(cwd / "rules.cedar"), "--json", "--token",
                       token(cwd, "did:example:ops", "--policy"), cwd=cwd, env=AUTH)
    assert applied.returncode == 0, applied.stderr
    # The policy travels through the log to the pipeline (bob's calls allowed meanwhile
    # stay allowed under the candidate: no change).
    denied = until(lambda: (answer := run(cwd, BOB, "hello"))[0] != 0 and answer,
                   "the applied policy denies bob's hello")
    assert denied[1]["error"]["code"] == "E3206", denied
    ids = {f"{BOB} hello": denied[1]["invocation_id"]}
    for subject, tool in ((ADA, "hello"), (ADA, "word_stats"), (BOB, "word_stats")):
        code, answer = run(cwd, subject, tool)
        assert code == 0, answer
        ids[f"{subject} {tool}"] = answer["invocation_id"]
    refused = toolexec("run", "word_stats", *CALLS["word_stats"], "--json", "--token",
                       token(cwd, ADA, "--tool", "hello"), cwd=cwd, env=AUTH)
    assert json.loads(refused.stdout)["error"]["code"] == "E3204"  # a token deny: stands
    (cwd / "rules-candidate.cedar").write_text(CANDIDATE)
    def changes_listed() -> bool:  # the audit model folds shortly after each reply
        listed = {c["invocation_id"] for c in what_if(
            cwd, "test", str(cwd / "rules-candidate.cedar"), "--set", "rules")["changes"]}
        return {ids[f"{ADA} word_stats"], ids[f"{BOB} hello"]} <= listed

    until(changes_listed, "the audit read model holds the recorded decisions")
    return ids


def test_policy_test_lists_exactly_the_invocations_the_candidate_changes(
        cwd: Path, recorded: dict[str, str]) -> None:
    answer = what_if(cwd, "test", str(cwd / "rules-candidate.cedar"), "--set", "rules")
    changes = {c["invocation_id"]: (c["subject"], c["tool_id"], c["before"], c["after"])
               for c in answer["changes"]}
    assert changes == {recorded[f"{ADA} word_stats"]: (ADA, "word_stats", "allow", "deny"),
                       recorded[f"{BOB} hello"]: (BOB, "hello", "deny", "allow")}
    assert answer["by_tool_and_agent"] == [
        {"tool_id": "hello", "subject": BOB, "allow_to_deny": 0, "deny_to_allow": 1},
        {"tool_id": "word_stats", "subject": ADA, "allow_to_deny": 1, "deny_to_allow": 0}]
    denied = next(c for c in answer["changes"] if c["after"] == "deny")
    assert "no-word-stats-for-ada: ada is done with word counts" in denied["reason"]
    assert answer["skipped"] >= 1  # the token refused (E3204) is not replayed

    printed = toolexec("policy", "test", str(cwd / "rules-candidate.cedar"), "--set",
                       "rules", cwd=cwd, env=AUTH)
    assert printed.returncode == 0, printed.stderr
    assert f"{recorded[f'{ADA} word_stats']} word_stats@1.1.0 {ADA}: allow -> deny" \
        in printed.stdout
    assert f"{recorded[f'{BOB} hello']} hello@1.0.0 {BOB}: deny -> allow" in printed.stdout


def test_the_set_in_force_changes_nothing_and_tool_narrows_the_replay(
        cwd: Path, recorded: dict[str, str]) -> None:
    assert what_if(cwd, "test", str(cwd / "rules.cedar"))["changes"] == []
    only_hello = what_if(cwd, "test", str(cwd / "rules-candidate.cedar"), "--set", "rules",
                         "--tool", "hello", "--since", "1h")
    assert [c["invocation_id"] for c in only_hello["changes"]] == [recorded[f"{BOB} hello"]]


def test_apply_dry_run_answers_the_same_and_emits_nothing(
        cwd: Path, recorded: dict[str, str]) -> None:
    candidate = str(cwd / "rules-candidate.cedar")
    dry = what_if(cwd, "apply", candidate, "--set", "rules", "--dry-run")
    tested = what_if(cwd, "test", candidate, "--set", "rules")
    assert {c["invocation_id"] for c in dry["changes"]} == {
        c["invocation_id"] for c in tested["changes"]}
    assert run(cwd, BOB, "hello")[0] == 1  # the set in force is still IN_FORCE
    assert run(cwd, ADA, "word_stats")[0] == 0


def test_a_bad_since_is_a_usage_error(cwd: Path) -> None:
    done = toolexec("policy", "test", str(cwd / "rules.cedar"), "--since", "soon", "--json",
                    cwd=cwd)
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"]["code"] == "E3004"
