"""Runs of calls that need approval: the wait holds no execution slot, an approval of
exactly the call lets it run, the other outcomes end it with one terminal event, and a
run resumed from the log waits again or honours the decision it reads."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from consumers.runtime.invocation_facts import InvocationFacts
from consumers.runtime.runs import InvocationRuns
from consumers.steps import authorize
from contracts.envelope import Envelope, new_envelope
from contracts.events import ApprovalDecided
from tests.handlers.conftest import (
    FIXED_NOW,
    Harness,
    ScriptedRunner,
    build_harness,
    clock,
    dead_letters_of,
    pipeline_deps,
)
from tests.handlers.test_steps import seal_variant
from tests.waiting import WAIT, eventually


class MovingClock:
    """The pipeline's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = FIXED_NOW

    def __call__(self) -> datetime:
        return self.now


def _guarded_harness(*, max_in_flight: int = 1, ttl: float = 3600.0,
                     key: rsa.RSAPrivateKey | None = None,
                     moving: MovingClock | None = None) -> Harness:
    """One execution slot; py_echo 2.0.0 needs approval (its manifest says so). With
    `key`, authorization is on (tokens signed by `key`)."""
    harness = build_harness(runner=ScriptedRunner())
    tool = harness.registry.get("py_echo", "1.0.0")
    harness.registry.add(seal_variant(tool, version="2.0.0", approval={"required": True}))
    keys = [] if key is None else [key.public_key()]
    deps = pipeline_deps(harness, authorize_deps=authorize.AuthorizeDeps(
        clock=moving or clock, require_auth=key is not None, public_keys=lambda: keys,
        approval_ttl_seconds=ttl), clock=moving or clock)
    harness.runs = InvocationRuns(deps, dead_letters_of(harness), consumer="test.pipeline",
                                  max_in_flight=max_in_flight)
    return harness


def _decision(harness: Harness, invocation_id: str, verdict: str = "approve",
              approved_hash: str | None = None, *, token: str | None = None,
              decided_by: str = "did:example:ops", time: datetime = FIXED_NOW) -> Envelope:
    requested = harness.of(invocation_id, "tool.approval.requested")[0].data
    decided = new_envelope(
        ApprovalDecided(invocation_id=invocation_id, decision=verdict,
                        approved_hash=approved_hash or requested.call_hash,
                        decided_by=decided_by),
        source="urn:test", partitionkey=invocation_id, correlationid=invocation_id,
        id=str(uuid.uuid4()), time=time, extensions={"captoken": token} if token else {})
    harness.events.append(decided)
    return decided


def _token(key: rsa.RSAPrivateKey, subject: str, **claims: Any) -> str:
    now = int(FIXED_NOW.timestamp())
    return jwt.encode({"sub": subject, "iat": now, "exp": now + 600, "jti": str(uuid.uuid4()),
                       **claims}, key, algorithm="RS256")


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


async def _waiting(harness: Harness, invocation_id: str,
                   token: str | None = None) -> asyncio.Task[str]:
    task = asyncio.create_task(harness.request("py_echo", {"text": "x"}, version_range="2.0.0",
                                               invocation_id=invocation_id, token=token))
    await eventually(lambda: harness.of(invocation_id, "tool.approval.requested"),
                     "an approval is requested")
    return task


async def test_a_waiting_call_holds_no_slot_and_runs_once_approved() -> None:
    harness = _guarded_harness(max_in_flight=1)
    waiting = await _waiting(harness, "inv-wait")
    assert harness.runs.active == 0  # the waiting run counts for nothing
    await asyncio.wait_for(harness.request("py_echo", {"text": "y"}, version_range="1.0.0",
                                           invocation_id="inv-other"), 5)
    assert harness.terminal("inv-other").type == "tool.invoke.completed"
    assert harness.of("inv-wait", "tool.execution.started") == []

    harness.runs.decide(_decision(harness, "inv-wait"))
    await asyncio.wait_for(waiting, WAIT)
    assert harness.terminal("inv-wait").type == "tool.invoke.completed"
    kinds = [e.type for e in harness.of("inv-wait") if e.type != "tool.invoke.requested"]
    assert kinds[:3] == ["tool.chain.resolved", "tool.permission.decided",
                         "tool.approval.requested"]
    assert harness.acknowledged[0] == kinds[:3]  # on the log before anyone waits


async def test_a_deny_and_an_approval_of_another_call_end_it_before_any_attempt() -> None:
    harness = _guarded_harness()
    denied = await _waiting(harness, "inv-deny")
    harness.runs.decide(_decision(harness, "inv-deny", "deny"))
    await asyncio.wait_for(denied, WAIT)
    assert harness.terminal("inv-deny").data.error.code == "E3208"

    other = await _waiting(harness, "inv-other-call")
    harness.runs.decide(_decision(harness, "inv-other-call",
                                  approved_hash="sha256:" + "0" * 64))
    await asyncio.wait_for(other, WAIT)
    failed = harness.terminal("inv-other-call").data
    assert failed.error.code == "E3210" and failed.stage == "authorize"
    assert harness.runner.plans == []


async def test_only_the_first_decision_counts() -> None:
    harness = _guarded_harness()
    waiting = await _waiting(harness, "inv-first")
    first, second = _decision(harness, "inv-first", "deny"), _decision(harness, "inv-first")
    harness.runs.decide(first)
    harness.runs.decide(second)
    await asyncio.wait_for(waiting, WAIT)
    assert harness.terminal("inv-first").data.error.code == "E3208"


async def test_a_cancel_while_waiting_ends_it_cancelled() -> None:
    harness = _guarded_harness()
    waiting = await _waiting(harness, "inv-cancel")
    await harness.cancel("inv-cancel", reason="changed my mind")
    await asyncio.wait_for(waiting, WAIT)
    assert harness.terminal("inv-cancel").data.error.code == "E3703"


async def test_an_expired_approval_is_E3209() -> None:
    harness = _guarded_harness(ttl=0.0)
    await asyncio.wait_for(harness.request("py_echo", {"text": "x"}, version_range="2.0.0",
                                           invocation_id="inv-late"), 5)
    assert harness.terminal("inv-late").data.error.code == "E3209"
    assert harness.runner.plans == []


async def test_a_resumed_run_waits_again_and_honours_a_decision_read_back() -> None:
    harness = _guarded_harness()
    waiting = await _waiting(harness, "inv-resume")
    request = harness.of("inv-resume", "tool.invoke.requested")[0]
    waiting.cancel()  # the pipeline stopped
    await asyncio.gather(waiting, return_exceptions=True)
    assert [e for e in harness.of("inv-resume") if e.type.startswith("tool.invoke.")
            and e.type != "tool.invoke.requested"] == []

    again = _guarded_harness()  # a new owner: the request and its facts, then the decision
    again.events.extend(e for e in harness.events if e.correlationid == "inv-resume")
    resumed = asyncio.create_task(again.run(request, InvocationFacts.of(again.of("inv-resume"))))
    await asyncio.sleep(0)
    again.runs.decide(_decision(again, "inv-resume"))
    await asyncio.wait_for(resumed, WAIT)
    assert again.terminal("inv-resume").type == "tool.invoke.completed"
    assert again.of("inv-resume", "tool.chain.resolved") == harness.of(
        "inv-resume", "tool.chain.resolved")  # no step done twice


async def test_a_shutdown_stops_a_waiting_run_leaving_its_approval_request() -> None:
    harness = _guarded_harness()
    waiting = await _waiting(harness, "inv-drain")
    await asyncio.wait_for(harness.runs.drain(), WAIT)  # a shutdown does not wait for a person
    await asyncio.gather(waiting, return_exceptions=True)
    assert waiting.done()
    assert [e.type for e in harness.of("inv-drain")][-1] == "tool.approval.requested"


async def test_a_flood_of_forged_decisions_cannot_push_out_the_real_one(rsa_key) -> None:
    harness = _guarded_harness(key=rsa_key)
    agent = _token(rsa_key, "did:example:agent",
                   tools=[{"tool_id": "py_echo", "version_range": "^2"}])
    approver = _token(rsa_key, "did:example:ops", scopes={"approve": ["py_echo"]})
    stranger = _token(rsa_key, "did:example:ops", scopes={"approve": ["other_tool"]})
    waiting = await _waiting(harness, "inv-flood", token=agent)
    forged = [_decision(harness, "inv-flood", "deny") for _ in range(20)]  # no token
    forged += [_decision(harness, "inv-flood", "deny", token=agent) for _ in range(20)]
    forged += [_decision(harness, "inv-flood", "deny", token=stranger) for _ in range(20)]
    forged += [_decision(harness, "inv-flood", "deny", token=approver,
                         decided_by="did:example:someone-else") for _ in range(20)]
    refusals = [harness.runs.decide(decided) for decided in forged]
    assert {r.code for r in refusals if r is not None} == {"E3203", "E3206"}
    assert all(r is not None for r in refusals)  # each one dead-lettered with its code

    assert harness.runs.decide(_decision(harness, "inv-flood", token=approver)) is None
    await asyncio.wait_for(waiting, WAIT)
    assert harness.terminal("inv-flood").type == "tool.invoke.completed"


async def test_a_backdated_decision_read_after_the_expiry_is_E3209() -> None:
    moving = MovingClock()
    harness = _guarded_harness(ttl=60, moving=moving)
    waiting = await _waiting(harness, "inv-backdated")
    moving.now = FIXED_NOW + timedelta(seconds=120)  # the expiry passed, unanswered
    harness.runs.decide(_decision(harness, "inv-backdated", time=FIXED_NOW))  # "in time"
    await asyncio.wait_for(waiting, WAIT)
    failed = harness.terminal("inv-backdated").data
    assert failed.error.code == "E3209" and failed.error.details["late_decision"]


async def test_a_decision_read_in_time_counts_though_the_run_checks_it_later() -> None:
    moving = MovingClock()
    harness = _guarded_harness(ttl=60, moving=moving)
    waiting = await _waiting(harness, "inv-read-in-time")
    moving.now = FIXED_NOW + timedelta(seconds=30)
    harness.runs.decide(_decision(harness, "inv-read-in-time",
                                  time=FIXED_NOW + timedelta(days=1)))  # its own time: no matter
    moving.now = FIXED_NOW + timedelta(seconds=120)  # before the run wakes up to check it
    await asyncio.wait_for(waiting, WAIT)
    assert harness.terminal("inv-read-in-time").type == "tool.invoke.completed"


async def _until_on_log(harness: Harness, invocation_id: str, event_type: str) -> None:
    await eventually(lambda: harness.of(invocation_id, event_type), f"{event_type} on the log")


async def test_a_decision_read_in_time_stays_in_time_across_a_restart() -> None:
    moving = MovingClock()
    harness = _guarded_harness(ttl=60, moving=moving)  # one execution slot
    harness.runner.blocking = True
    waiting = await _waiting(harness, "inv-restart")
    asyncio.create_task(harness.request("py_echo", {"text": "y"}, version_range="1.0.0",
                                        invocation_id="inv-blocker"))
    await asyncio.wait_for(harness.runner.running.wait(), WAIT)  # holds the only slot
    moving.now = FIXED_NOW + timedelta(seconds=30)
    harness.runs.decide(_decision(harness, "inv-restart"))  # read in time...
    await _until_on_log(harness, "inv-restart", "tool.approval.received")
    for invocation_id in ("inv-restart", "inv-blocker"):  # ...then the pipeline died
        run = harness.runs.running(invocation_id)
        assert run is not None and run.task is not None
        run.task.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert harness.of("inv-restart", "tool.execution.started") == []

    moving.now = FIXED_NOW + timedelta(seconds=120)  # restarted after the expiry
    again = _guarded_harness(ttl=60, moving=moving)
    again.events.extend(e for e in harness.events if e.correlationid == "inv-restart")
    request = again.of("inv-restart", "tool.invoke.requested")[0]
    resumed = asyncio.create_task(again.run(request, InvocationFacts.of(again.of("inv-restart"))))
    await asyncio.sleep(0)
    again.runs.decide(again.of("inv-restart", "tool.approval.decided")[0])  # read again
    await asyncio.wait_for(resumed, WAIT)
    assert again.terminal("inv-restart").type == "tool.invoke.completed"
    assert len(again.of("inv-restart", "tool.approval.received")) == 1
