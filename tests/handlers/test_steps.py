"""Every branch of the four pipeline steps, chained as the pipeline chains them."""

from __future__ import annotations

import dataclasses

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from consumers.adapters.claim_store import InMemoryClaims
from consumers.runtime.invocation_facts import InvocationFacts
from domain.model import PrimitiveOutcome
from tests.handlers.conftest import FIXED_NOW, Harness, build_harness

PIPELINE = ["tool.invoke.requested", "tool.chain.resolved", "tool.permission.decided",
            "tool.execution.started", "tool.execution.finished", "tool.invoke.completed"]


async def test_success_walks_every_step_in_order(harness: Harness) -> None:
    invocation = await harness.request("py_echo", {"text": "hi"})
    assert [e.type for e in harness.of(invocation)] == PIPELINE
    completed = harness.terminal(invocation)
    assert completed.data.result == {"echo": "hi", "keys": 1}
    resolved = harness.of(invocation, "tool.chain.resolved")[0].data
    assert [link.tool_id for link in resolved.chain] == ["py_echo", "python_runtime", "subprocess"]


async def test_every_event_names_its_cause_and_shares_the_partition_key(
        harness: Harness) -> None:
    invocation = await harness.request("py_echo", {"text": "hi"})
    requested, resolved, decided, started, finished, completed = harness.of(invocation)
    assert resolved.causationid == requested.id
    assert decided.causationid == resolved.id
    assert started.causationid == decided.id and finished.causationid == decided.id
    assert completed.causationid == finished.id
    assert {e.partitionkey for e in harness.of(invocation)} == {invocation}


async def test_decision_says_authorization_was_not_required(harness: Harness) -> None:
    invocation = await harness.request("py_echo", {"text": "hi"})
    decision = harness.of(invocation, "tool.permission.decided")[0].data
    assert decision.decision == "allow" and decision.enforced is False
    assert "not required" in decision.reason


async def test_unknown_tool_fails_at_resolve_with_E3101(harness: Harness) -> None:
    invocation = await harness.request("nope", {})
    failed = harness.terminal(invocation).data
    assert (failed.error.code, failed.stage) == ("E3101", "resolve")


async def test_unknown_version_fails_with_E3102(harness: Harness) -> None:
    invocation = await harness.request("py_echo", {"text": "x"}, version_range="^7")
    assert harness.terminal(invocation).data.error.code == "E3102"


async def test_tampered_registry_entry_fails_integrity(harness: Harness) -> None:
    tool = harness.registry.get("py_echo", "1.0.0")
    forged_files = tuple(dataclasses.replace(f, content=b"print('x')") if f.path == "main.py"
                         else f for f in tool.files)
    harness.registry.add(dataclasses.replace(tool, version="1.0.9", files=forged_files,
                                             manifest={**tool.manifest, "version": "1.0.9"}))
    invocation = await harness.request("py_echo", {"text": "x"}, version_range="1.0.9")
    failed = harness.terminal(invocation).data
    assert failed.error.code == "E3105"
    assert failed.error.details["tool_id"] == "py_echo"


async def test_invalid_parameters_fail_with_every_violation(harness: Harness) -> None:
    invocation = await harness.request("py_echo", {"text": 5, "times": 0})
    failed = harness.terminal(invocation).data
    assert (failed.error.code, failed.stage) == ("E3301", "execute")
    assert len(failed.error.details["issues"]) == 2
    assert harness.runner.plans == []


async def test_primitive_error_becomes_the_failure(harness: Harness) -> None:
    harness.runner.queue.append(PrimitiveOutcome(
        ok=False, exit_code=None, error={"code": "E3402", "message": "timed out", "details": {}}))
    invocation = await harness.request("py_echo", {"text": "x"})
    failed = harness.terminal(invocation).data
    assert (failed.error.code, failed.stage) == ("E3402", "execute")


async def test_result_violating_its_schema_fails_with_E3303(harness: Harness) -> None:
    harness.runner.queue.append(PrimitiveOutcome(ok=True, stdout=b'{"echo": 1}', exit_code=0))
    invocation = await harness.request("py_echo", {"text": "x"})
    failed = harness.terminal(invocation).data
    assert (failed.error.code, failed.stage) == ("E3303", "finalize")


async def test_plan_is_built_from_the_merged_chain(harness: Harness) -> None:
    await harness.request("py_echo", {"text": "x"})
    plan = harness.runner.plans[0]
    assert plan.argv[0] == "python3" and plan.argv[-1] == "main.py"


async def test_facts_that_do_not_gate_each_other_are_appended_together(
        harness: Harness) -> None:
    await harness.request("py_echo", {"text": "x"})
    assert harness.acknowledged == [
        ["tool.chain.resolved", "tool.permission.decided", "tool.execution.started"],
        ["tool.execution.finished", "tool.invoke.completed"]]


async def test_a_failure_before_any_attempt_is_appended_with_the_decision(
        harness: Harness) -> None:
    await harness.request("py_echo", {"text": 5})
    assert harness.acknowledged == [
        ["tool.chain.resolved", "tool.permission.decided", "tool.invoke.failed"]]


async def test_the_decision_is_on_the_log_before_the_tool_starts(harness: Harness) -> None:
    seen: list[list[str]] = []

    async def spy(*args, **kwargs):
        seen.append([e.type for e in harness.events])
        return await original(*args, **kwargs)

    original, harness.runner.run = harness.runner.run, spy  # type: ignore[method-assign]
    await harness.request("py_echo", {"text": "x"})
    assert seen == [["tool.invoke.requested", "tool.chain.resolved",
                     "tool.permission.decided", "tool.execution.started"]]


async def test_redelivered_request_resumes_from_the_log_and_does_nothing_again(
        harness: Harness) -> None:
    invocation = await harness.request("py_echo", {"text": "x"}, event_id="evt-1")
    before = list(harness.events)
    await harness.redeliver(harness.of(invocation, "tool.invoke.requested")[0])
    assert harness.events == before
    assert len(harness.runner.plans) == 1


async def test_a_request_resumed_after_its_decision_is_neither_resolved_nor_decided_again(
        harness: Harness) -> None:
    earlier = build_harness()
    invocation = await earlier.request("py_echo", {"text": "x"})
    request, resolved, decided = earlier.of(invocation)[:3]
    harness.events.extend([request, resolved, decided])
    await harness.run(request, InvocationFacts.of([resolved, decided]))
    assert [e.type for e in harness.of(invocation)][3:] == [
        "tool.execution.started", "tool.execution.finished", "tool.invoke.completed"]
    assert harness.terminal(invocation).causationid == harness.of(
        invocation, "tool.execution.finished")[0].id


async def test_a_deny_on_the_log_without_its_failure_gets_the_same_failure(rsa_key) -> None:
    earlier = build_harness(require_auth=True, public_keys=[rsa_key.public_key()])
    invocation = await earlier.request("py_echo", {"text": "x"})
    request, resolved, denied, failure = earlier.of(invocation)
    resumed = build_harness(require_auth=True, public_keys=[rsa_key.public_key()])
    await resumed.run(request, InvocationFacts.of([resolved, denied]))
    assert [e.id for e in resumed.events] == [failure.id]


async def test_crashing_handler_is_dead_lettered_and_the_invocation_fails(
        harness: Harness) -> None:
    harness.registry.explode = True
    invocation = await harness.request("py_echo", {"text": "x"})
    failed = harness.terminal(invocation).data
    assert (failed.error.code, failed.stage) == ("E3000", "resolve")
    assert len(harness.deadletters) == 1
    assert "exploded" in harness.deadletters[0]["error"]["message"]
    assert harness.deadletters[0]["attempts"] == 3


async def test_crashing_primitive_ends_the_invocation_with_E3404(harness: Harness) -> None:
    harness.runner.queue.append(RuntimeError("primitive bug"))
    invocation = await harness.request("py_echo", {"text": "x"})
    failed = harness.terminal(invocation).data
    assert (failed.error.code, failed.stage) == ("E3404", "execute")
    finished = harness.of(invocation, "tool.execution.finished")[0].data
    assert finished.outcome == "unknown"


async def test_attempt_started_by_a_dead_executor_is_reported_unknown_not_rerun(
        harness: Harness) -> None:
    earlier = build_harness()
    invocation = "inv-abandoned"
    await earlier.request("py_echo", {"text": "x"}, invocation_id=invocation)
    request, resolved, decided, started = earlier.of(invocation)[:4]
    await _claim_as_dead_executor(harness, f"{invocation}/1")
    harness.events.extend([request, resolved, decided, started])
    await harness.run(request, InvocationFacts.of([resolved, decided, started]))
    assert harness.runner.plans == []
    finished = harness.of(invocation, "tool.execution.finished")[0].data
    assert (finished.outcome, finished.error.code) == ("unknown", "E3404")
    assert harness.terminal(invocation).data.error.code == "E3404"


async def test_attempt_claimed_by_a_dead_executor_that_never_started_it_runs(
        harness: Harness) -> None:
    invocation = "inv-claimed"
    await _claim_as_dead_executor(harness, f"{invocation}/1")
    await harness.request("py_echo", {"text": "x"}, invocation_id=invocation)
    assert len(harness.runner.plans) == 1  # its started fact never reached the log
    assert harness.terminal(invocation).type == "tool.invoke.completed"


async def test_abandoned_attempt_of_an_idempotent_tool_is_run_again(harness: Harness) -> None:
    tool = harness.registry.get("py_echo", "1.0.0")
    harness.registry.add(seal_variant(tool, version="1.1.0", idempotent=True))
    earlier = build_harness()
    earlier.registry.add(seal_variant(tool, version="1.1.0", idempotent=True))
    invocation = "inv-idempotent"
    await earlier.request("py_echo", {"text": "x"}, invocation_id=invocation)
    request, resolved, decided, started = earlier.of(invocation)[:4]
    await _claim_as_dead_executor(harness, f"{invocation}/1")
    harness.events.extend([request, resolved, decided, started])
    await harness.run(request, InvocationFacts.of([resolved, decided, started]))
    assert len(harness.runner.plans) == 1
    assert harness.terminal(invocation).type == "tool.invoke.completed"


async def test_conclusion_stored_but_not_published_is_published_on_redelivery(
        harness: Harness) -> None:
    # The executor stored the attempt's conclusion and died before publishing it:
    # the next delivery publishes that same event, and the tool does not run again.
    harness.fail_once.add("tool.execution.finished")
    invocation = await harness.request("py_echo", {"text": "x"})
    assert len(harness.runner.plans) == 1
    assert harness.terminal(invocation).type == "tool.invoke.completed"
    assert len(harness.of(invocation, "tool.execution.finished")) == 1
    assert harness.deadletters == []


async def test_crash_while_backing_off_goes_on_with_the_next_attempt(harness: Harness) -> None:
    tool = harness.registry.get("py_echo", "1.0.0")
    harness.registry.add(seal_variant(tool, version="1.2.0",
                                      retry_policy={"max_attempts": 2}))
    harness.runner.queue.append(PrimitiveOutcome(ok=False, error={"code": "E3502",
                                                                  "message": "unavailable"}))
    harness.sleeps_fail = 1
    invocation = await harness.request("py_echo", {"text": "x"})
    assert len(harness.runner.plans) == 2
    attempts = [(e.data.attempt, e.data.final)
                for e in harness.of(invocation, "tool.execution.finished")]
    assert attempts == [(1, False), (2, True)]  # attempt 1's outcome was on the log already
    assert harness.terminal(invocation).type == "tool.invoke.completed"


async def _claim_as_dead_executor(harness: Harness, key: str) -> None:
    dead = InMemoryClaims("dead-executor", rows=harness.claims.rows)
    await dead.claim(key, now=0.0, lease_seconds=1.0)


def seal_variant(tool, *, version: str, **manifest_changes):
    from domain.integrity import seal
    from domain.model import ToolSource

    manifest = {**tool.manifest, "version": version, **manifest_changes}
    return seal(ToolSource(manifest=manifest, files=tool.files, origin="test"))


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _token(key: rsa.RSAPrivateKey, tool: str = "py_echo") -> str:
    now = int(FIXED_NOW.timestamp())  # the harness's clock: a token is not issued in its future
    return jwt.encode({"sub": "did:example:a", "iat": now, "exp": now + 60, "jti": "j1",
                       "tools": [{"tool_id": tool, "version_range": "^1"}]}, key, algorithm="RS256")


async def test_required_auth_without_token_is_denied_E3203(rsa_key) -> None:
    harness = build_harness(require_auth=True, public_keys=[rsa_key.public_key()])
    invocation = await harness.request("py_echo", {"text": "x"})
    decision = harness.of(invocation, "tool.permission.decided")[0].data
    assert decision.decision == "deny" and decision.enforced
    failed = harness.terminal(invocation).data
    assert (failed.error.code, failed.stage) == ("E3203", "authorize")
    assert harness.runner.plans == []


async def test_required_auth_with_valid_token_allows_and_records_subject(rsa_key) -> None:
    harness = build_harness(require_auth=True, public_keys=[rsa_key.public_key()])
    invocation = await harness.request("py_echo", {"text": "x"}, token=_token(rsa_key))
    decision = harness.of(invocation, "tool.permission.decided")[0].data
    assert (decision.decision, decision.subject, decision.token_jti) == ("allow", "did:example:a",
                                                                          "j1")
    assert harness.terminal(invocation).type == "tool.invoke.completed"


async def test_token_for_another_tool_is_E3204(rsa_key) -> None:
    harness = build_harness(require_auth=True, public_keys=[rsa_key.public_key()])
    invocation = await harness.request("py_echo", {"text": "x"},
                                       token=_token(rsa_key, tool="other"))
    assert harness.terminal(invocation).data.error.code == "E3204"


async def test_capability_token_never_travels_into_derived_events(rsa_key) -> None:
    harness = build_harness(require_auth=True, public_keys=[rsa_key.public_key()])
    token = _token(rsa_key)
    invocation = await harness.request("py_echo", {"text": "x"}, token=token)
    derived = harness.of(invocation)[1:]
    assert derived and all("captoken" not in e.extensions for e in derived)
    assert all(token not in e.data.model_dump_json() for e in derived)


async def test_publishes_refused_while_the_broker_restarts_are_delivered_once_it_is_back(
        harness: Harness) -> None:
    harness.broker_away_for = 3
    invocation = await harness.request("py_echo", {"text": "hi"})
    assert [e.type for e in harness.of(invocation)] == PIPELINE
    assert len(harness.runner.plans) == 1
    assert harness.deadletters == []


async def test_a_run_that_stalled_past_its_lease_leaves_the_conclusion_to_its_new_owner(
        harness: Harness) -> None:
    other = InMemoryClaims("other-executor", rows=harness.claims.rows)

    async def stalled_until_taken_over(plan, params, *, secrets, session=None):
        key = next(iter(harness.claims.rows))
        assert await other.take_over(harness.claims.rows[key], now=1e10, lease_seconds=1)
        return PrimitiveOutcome(ok=True, stdout=b'{"echo": "late", "keys": 1}', exit_code=0)

    harness.runner.run = stalled_until_taken_over  # type: ignore[method-assign]
    invocation = await harness.request("py_echo", {"text": "x"})
    assert harness.of(invocation, "tool.execution.finished") == []
    assert [e.type for e in harness.of(invocation)][-1] == "tool.execution.started"
    assert harness.deadletters == []


async def test_attempt_a_dead_executor_marked_started_is_not_rerun(harness: Harness) -> None:
    invocation = "inv-marked"
    dead = InMemoryClaims("dead-executor", rows=harness.claims.rows)
    await dead.claim(f"{invocation}/1", now=0.0, lease_seconds=1.0)
    await dead.start(f"{invocation}/1")  # it died before its started fact was on the log
    await harness.request("py_echo", {"text": "x"}, invocation_id=invocation)
    assert harness.runner.plans == []
    assert harness.terminal(invocation).data.error.code == "E3404"


async def test_a_request_that_is_not_strict_json_fails_before_anything_else(
        harness: Harness) -> None:
    invocation = await harness.request("py_echo", {"text": float("nan")})
    failed = harness.terminal(invocation).data
    assert (failed.error.code, failed.stage) == ("E3004", "request")
    assert harness.of(invocation, "tool.chain.resolved") == []
    assert harness.runner.plans == []
