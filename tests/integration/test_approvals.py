"""Approvals end to end on `toolexec up` with authorization on: a call that a policy or
its manifest marks waits for an approver (CLI, HTTP, MCP), runs only with an approval
of exactly that call, and otherwise ends with E3208 (denied), E3209 (expired), E3210
(another call approved) or E3703 (cancelled while waiting) — one terminal event each,
all in a verified audit trail. A restart while waiting waits again."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from mcp import ClientSession, StdioServerParameters, stdio_client

from contracts import topics
from contracts.events import ApprovalDecided
from contracts.kafka_binding import decode
from domain.approval import call_hash
from tests.cli_process import clean_env, start_up, stop, toolexec
from tests.integration.gateway_support import (
    TEST_TOOLS,
    RunningGateway,
    running_gateway,
    wait_until,
)
from tests.waiting import WAIT
from toolexec.client import InvocationClient

pytestmark = pytest.mark.integration

AUTH = {"TOOLEXEC_REQUIRE_AUTH": "true"}
GUARDED = {
    "tool_id": "guarded_echo", "version": "1.0.0", "tool_type": "script",
    "executor": "python_runtime", "description": "py_echo, but every call needs approval.",
    "config": {"entrypoint": "main.py"}, "approval": {"required": True},
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"]},
}
POLICY = """
@id("default-permit")
permit (principal, action == Action::"tool.invoke", resource);

@id("echo-needs-a-person")
@reason("py_echo calls are reviewed")
@approval("required")
permit (principal, action == Action::"tool.invoke", resource)
when { resource.tool_id == "py_echo" && context.parameter_keys.contains("times") };
"""
AGENT = "did:example:agent"
APPROVER = "did:example:approver"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _register_guarded(gateway: RunningGateway) -> None:
    code = (TEST_TOOLS / "py_echo" / "main.py").read_text()
    registered = gateway.register(GUARDED, [{"path": "main.py", "content": code}],
                                  headers=bearer(gateway.token(scopes=("--publish",
                                                                       "guarded_echo"))))
    assert registered.status_code == 201, registered.text


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with running_gateway(tmp_path_factory.mktemp("approvals"), env=AUTH) as running:
        _register_guarded(running)
        yield running


def _agent(gateway: RunningGateway) -> str:
    return gateway.token("guarded_echo@^1", "py_echo@^1", subject=AGENT)


def _approver(gateway: RunningGateway) -> str:
    return gateway.token(scopes=("--approve", "guarded_echo", "--approve", "py_echo"),
                         subject=APPROVER)


def _invoke(gateway: RunningGateway, tool_id: str, parameters: dict[str, Any]) -> str:
    accepted = gateway.invoke(tool_id, parameters, execution_mode="async",
                              headers=bearer(_agent(gateway)))
    assert accepted.status_code == 202, accepted.text
    return accepted.json()["invocation_id"]


def _pending(gateway: RunningGateway, invocation_id: str, timeout: float = WAIT) -> dict:
    token = _approver(gateway)

    def listed() -> dict | None:
        rows = gateway.http.get("/v1/approvals", headers=bearer(token)).json()["approvals"]
        return next((r for r in rows if r["invocation_id"] == invocation_id), None)
    return wait_until(listed, timeout=timeout)


def _ended(gateway: RunningGateway, invocation_id: str, token: str) -> dict:
    def view() -> dict | None:
        body = gateway.http.get(f"/v1/invocations/{invocation_id}",
                                headers=bearer(token)).json()
        return body if body["status"] in ("completed", "failed", "cancelled") else None
    return wait_until(view)


def _audit_types(gateway: RunningGateway, invocation_id: str) -> list[str]:
    token = gateway.token(scopes=("--audit",))

    def records() -> list[str] | None:
        found = gateway.http.get("/v1/audit", params={"invocation": invocation_id},
                                 headers=bearer(token)).json()["records"]
        types = [r["type"] for r in found]
        return types if {"tool.invoke.completed", "tool.invoke.failed"} & set(types) else None
    return wait_until(records)


def _terminals(types: list[str]) -> list[str]:
    return [t for t in types if t in ("tool.invoke.completed", "tool.invoke.failed")]


def _decide(gateway: RunningGateway, invocation_id: str, token: str,
            **body: Any) -> Any:
    return gateway.http.post(f"/v1/invocations/{invocation_id}/approval", json=body,
                             headers=bearer(token))


def test_a_call_waits_holding_no_slot_and_runs_once_approved_on_the_cli(
        gateway: RunningGateway) -> None:
    invocation_id = _invoke(gateway, "guarded_echo", {"text": "ship it"})
    row = _pending(gateway, invocation_id)
    assert row["subject"] == AGENT and row["parameters"] == {"text": "ship it"}
    assert row["reasons"] == ["the tool's manifest requires approval"]
    assert row["call_hash"] == call_hash(integrity=row["integrity"],
                                         parameters={"text": "ship it"}, agent=AGENT,
                                         policy_version=row["policy_version"])
    others = [_invoke(gateway, "py_echo", {"text": "meanwhile"}) for _ in range(3)]
    for other in others:  # a waiting call blocks nothing
        assert _ended(gateway, other, _agent(gateway))["status"] == "completed"
    view = gateway.http.get(f"/v1/invocations/{invocation_id}",
                            headers=bearer(_agent(gateway))).json()
    assert view["status"] == "authorized"

    done = toolexec("approve", invocation_id, "--reason", "looks right", "--token",
                    _approver(gateway), "--json", cwd=gateway.cwd, env=gateway.env)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["status"] == "decided" and answer["decided_by"] == APPROVER
    assert answer["approved_hash"] == row["call_hash"]

    view = _ended(gateway, invocation_id, _agent(gateway))
    assert view["status"] == "completed", view
    types = _audit_types(gateway, invocation_id)
    assert _terminals(types) == ["tool.invoke.completed"]
    assert {"tool.approval.requested", "tool.approval.decided"} <= set(types)
    again = _decide(gateway, invocation_id, _approver(gateway), decision="deny")
    assert again.status_code == 200 and again.json()["status"] == "already_ended"


def test_an_approval_of_other_parameters_is_E3210(gateway: RunningGateway) -> None:
    invocation_id = _invoke(gateway, "guarded_echo", {"text": "rm -rf /"})
    row = _pending(gateway, invocation_id)
    other = call_hash(integrity=row["integrity"], parameters={"text": "ls"}, agent=AGENT,
                      policy_version=row["policy_version"])
    sent = _decide(gateway, invocation_id, _approver(gateway), decision="approve",
                   approved_hash=other)
    assert sent.status_code == 202, sent.text
    view = _ended(gateway, invocation_id, _agent(gateway))
    assert view["status"] == "failed" and view["error"]["code"] == "E3210"
    assert _terminals(_audit_types(gateway, invocation_id)) == ["tool.invoke.failed"]
    assert "tool.execution.started" not in _audit_types(gateway, invocation_id)


def test_an_approver_needs_the_approve_scope_and_a_deny_is_E3208(
        gateway: RunningGateway) -> None:
    invocation_id = _invoke(gateway, "guarded_echo", {"text": "maybe"})
    _pending(gateway, invocation_id)
    no_token = gateway.http.post(f"/v1/invocations/{invocation_id}/approval",
                                 json={"decision": "approve"})
    assert no_token.status_code == 401
    agent_itself = _decide(gateway, invocation_id, _agent(gateway), decision="approve")
    assert agent_itself.status_code == 403
    assert agent_itself.json()["error"]["code"] == "E3206"
    other_tool = gateway.token(scopes=("--approve", "hello"), subject=APPROVER)
    refused = toolexec("approve", invocation_id, "--token", other_tool, "--json",
                       cwd=gateway.cwd, env=gateway.env)
    assert refused.returncode == 1 and json.loads(refused.stdout)["error"]["code"] == "E3206"

    denied = toolexec("deny", invocation_id, "--reason", "not today", "--token",
                      _approver(gateway), "--json", cwd=gateway.cwd, env=gateway.env)
    assert denied.returncode == 0, denied.stderr
    view = _ended(gateway, invocation_id, _agent(gateway))
    assert view["status"] == "failed" and view["error"]["code"] == "E3208"
    assert _terminals(_audit_types(gateway, invocation_id)) == ["tool.invoke.failed"]


def test_a_decision_written_to_the_log_without_the_approve_scope_counts_for_nothing(
        gateway: RunningGateway) -> None:
    invocation_id = _invoke(gateway, "guarded_echo", {"text": "forge me"})
    row = _pending(gateway, invocation_id)
    bootstrap = json.loads((gateway.cwd / ".toolexec" / "broker" / "broker.json")
                           .read_text())["bootstrap"]

    async def forge() -> None:  # the agent itself, straight to the requests topic: a flood
        async with InvocationClient(bootstrap) as client:
            for n in range(40):
                await client.command(ApprovalDecided(
                    invocation_id=invocation_id, decision="approve" if n % 2 else "deny",
                    approved_hash=row["call_hash"], decided_by="alice" if n % 2 else AGENT),
                    token=_agent(gateway))
    anyio.run(forge)
    refused = anyio.run(_dead_letter_codes, bootstrap, invocation_id, 40)
    assert refused == ["E3206"] * 40  # each one dead-lettered, none kept
    assert _pending(gateway, invocation_id)["decided_by"] is None  # and none shown

    sent = _decide(gateway, invocation_id, _approver(gateway), decision="approve")
    assert sent.status_code == 202, sent.text
    view = _ended(gateway, invocation_id, _agent(gateway))
    assert view["status"] == "completed", view  # the forged denies came first, and counted not
    shown = wait_until(lambda: _approval_row(gateway, invocation_id))
    assert (shown["decision"], shown["decided_by"]) == ("approve", APPROVER)  # the one received
    received = _received_at(gateway, invocation_id)
    assert shown["decided_at"] == received


def _approval_row(gateway: RunningGateway, invocation_id: str) -> dict[str, Any] | None:
    """The approvals read model's row of `invocation_id` once it has an outcome."""
    with closing(sqlite3.connect(gateway.cwd / ".toolexec" / "toolexec.db")) as db:
        db.row_factory = sqlite3.Row
        row = db.execute("SELECT * FROM approvals WHERE invocation_id = ?",
                         (invocation_id,)).fetchone()
    return dict(row) if row is not None and row["outcome"] is not None else None


def _received_at(gateway: RunningGateway, invocation_id: str) -> str:
    """The time of the pipeline's `tool.approval.received` of `invocation_id`, as the
    audit trail holds it."""
    found = gateway.http.get("/v1/audit", params={"invocation": invocation_id},
                             headers=bearer(gateway.token(scopes=("--audit",)))).json()
    (time,) = [r["time"] for r in found["records"] if r["type"] == "tool.approval.received"]
    return time


def test_an_approver_token_read_off_the_requests_topic_decides_no_other_call(
        gateway: RunningGateway) -> None:
    decided_id = _invoke(gateway, "guarded_echo", {"text": "approve me"})
    other_id = _invoke(gateway, "guarded_echo", {"text": "not me"})
    _pending(gateway, decided_id)
    other = _pending(gateway, other_id)
    token = _approver(gateway)
    assert _decide(gateway, decided_id, token, decision="approve").status_code == 202
    assert _ended(gateway, decided_id, _agent(gateway))["status"] == "completed"
    bootstrap = json.loads((gateway.cwd / ".toolexec" / "broker" / "broker.json")
                           .read_text())["bootstrap"]
    (decision,) = anyio.run(_requests_records, bootstrap, decided_id, "tool.approval.decided")
    on_the_topic = dict(decision.headers)["ce_captoken"].decode()
    assert token not in on_the_topic and token.encode() not in decision.value  # sealed

    async def replay() -> None:  # a reader of the topic copies it onto another call's decision
        async with InvocationClient(bootstrap) as client:
            await client.command(ApprovalDecided(
                invocation_id=other_id, decision="approve", approved_hash=other["call_hash"],
                decided_by=APPROVER), token=on_the_topic)
    anyio.run(replay)
    assert anyio.run(_dead_letter_codes, bootstrap, other_id, 1) == ["E3203"]
    assert _pending(gateway, other_id)["decided_by"] is None  # still waiting, undecided
    cancelled = gateway.http.post(f"/v1/invocations/{other_id}/cancel",
                                  headers=bearer(_agent(gateway)))
    assert cancelled.status_code == 202, cancelled.text


async def _requests_records(bootstrap: str, key: str, kind: str) -> list[Any]:
    """The records of type `kind` keyed `key` on the requests topic, up to its end now."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        partitions = [TopicPartition(topics.REQUESTS, p)
                      for p in consumer.partitions_for_topic(topics.REQUESTS) or ()]
        consumer.assign(partitions)
        ends = await consumer.end_offsets(partitions)
        found: list[Any] = []
        async with asyncio.timeout(WAIT):
            while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    found += [r for r in records if r.key == key.encode()
                              and dict(r.headers).get("ce_type") == kind.encode()]
    finally:
        await consumer.stop()
    return found


async def _dead_letter_codes(bootstrap: str, key: str, count: int) -> list[str]:
    """The codes of the first `count` dead-letter records keyed `key`."""
    consumer = AIOKafkaConsumer(topics.DEADLETTER, bootstrap_servers=bootstrap,
                                group_id=None, auto_offset_reset="earliest")
    await consumer.start()
    codes: list[str] = []
    try:
        async with asyncio.timeout(WAIT):
            while len(codes) < count:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    codes += [decode(r.key, r.value, r.headers).data.error.code
                              for r in records if r.key == key.encode()]
    finally:
        await consumer.stop()
    return codes[:count]


def test_a_cancel_while_waiting_ends_it_cancelled(gateway: RunningGateway) -> None:
    invocation_id = _invoke(gateway, "guarded_echo", {"text": "never mind"})
    _pending(gateway, invocation_id)
    cancelled = gateway.http.post(f"/v1/invocations/{invocation_id}/cancel",
                                  headers=bearer(_agent(gateway)))
    assert cancelled.status_code == 202, cancelled.text
    view = _ended(gateway, invocation_id, _agent(gateway))
    assert view["status"] == "cancelled" and view["error"]["code"] == "E3703"
    assert _terminals(_audit_types(gateway, invocation_id)) == ["tool.invoke.failed"]


def test_a_cedar_permit_requires_approval_for_a_parameter_pattern_decided_over_mcp(
        gateway: RunningGateway) -> None:
    (gateway.cwd / "reviewed.cedar").write_text(POLICY)
    applied = toolexec("policy", "apply", str(gateway.cwd / "reviewed.cedar"), "--json",
                       "--token", gateway.token(scopes=("--policy",)),
                       cwd=gateway.cwd, env=gateway.env)
    assert applied.returncode == 0, applied.stderr

    def waiting_call() -> tuple[str, dict] | None:  # the policy reaches the pipeline soon
        invocation_id = _invoke(gateway, "py_echo", {"text": "twice", "times": 2})
        view = wait_until(lambda: _waiting_or_ended(gateway, invocation_id))
        return (invocation_id, view) if view["status"] == "waiting" else None
    invocation_id, row = wait_until(waiting_call, timeout=2 * WAIT)
    assert row["reasons"] == ["echo-needs-a-person: py_echo calls are reviewed"]
    plain = _invoke(gateway, "py_echo", {"text": "once"})  # no `times`: no approval
    assert _ended(gateway, plain, _agent(gateway))["status"] == "completed"

    listed, decided = anyio.run(_over_mcp, gateway, invocation_id, _approver(gateway))
    assert invocation_id in [r["invocation_id"] for r in listed["approvals"]]
    assert decided["status"] == "decided" and decided["decided_by"] == APPROVER
    view = _ended(gateway, invocation_id, _agent(gateway))
    assert view["status"] == "completed", view
    removed = toolexec("policy", "apply", str(_permit_all(gateway.cwd)), "--set", "reviewed",
                       "--json", "--token", gateway.token(scopes=("--policy",)),
                       cwd=gateway.cwd, env=gateway.env)
    assert removed.returncode == 0, removed.stderr


def _permit_all(cwd: Path) -> Path:
    path = cwd / "permit_all.cedar"
    path.write_text('permit (principal, action == Action::"tool.invoke", resource);\n')
    return path


def _waiting_or_ended(gateway: RunningGateway, invocation_id: str) -> dict | None:
    token = _approver(gateway)
    rows = gateway.http.get("/v1/approvals", headers=bearer(token)).json()["approvals"]
    row = next((r for r in rows if r["invocation_id"] == invocation_id), None)
    if row is not None:
        return {**row, "status": "waiting"}
    view = gateway.http.get(f"/v1/invocations/{invocation_id}",
                            headers=bearer(_agent(gateway))).json()
    return view if view["status"] in ("completed", "failed", "cancelled") else None


async def _over_mcp(gateway: RunningGateway, invocation_id: str,
                    token: str) -> tuple[dict, dict]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "toolexec.cli", "mcp"],
                                   cwd=gateway.cwd, env=clean_env(gateway.env))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = await _mcp_call(session, action="list", token=token)
        decided = await _mcp_call(session, action="approve", invocation_id=invocation_id,
                                  token=token)
    return listed, decided


async def _mcp_call(session: ClientSession, **arguments: Any) -> dict:
    result = await session.call_tool("approval", arguments)
    text = next(b.text for b in result.content if isinstance(b, mcp_types.TextContent))
    assert not result.is_error, text
    return json.loads(text)


def test_the_audit_trail_verifies_with_the_approvals_in_it(gateway: RunningGateway) -> None:
    verified = toolexec("audit", "verify", "--json", cwd=gateway.cwd, env=gateway.env)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_an_unanswered_call_expires_with_E3209_and_a_late_decision_changes_nothing(
        tmp_path: Path) -> None:
    with running_gateway(tmp_path, env={**AUTH, "TOOLEXEC_APPROVAL_TTL_SECONDS": "2"}) as up:
        _register_guarded(up)
        invocation_id = _invoke(up, "guarded_echo", {"text": "too late"})
        view = _ended(up, invocation_id, _agent(up))
        assert view["status"] == "failed" and view["error"]["code"] == "E3209"
        late = _decide(up, invocation_id, _approver(up), decision="approve")
        assert late.status_code == 200 and late.json()["status"] == "already_ended"
        types = _audit_types(up, invocation_id)
        assert _terminals(types) == ["tool.invoke.failed"]
        assert "tool.approval.requested" in types and "tool.execution.started" not in types


def test_a_restart_while_waiting_waits_again_and_honours_the_approval(tmp_path: Path) -> None:
    env = {**AUTH, "TOOLEXEC_EGRESS_ALLOWED_NETWORKS": '["127.0.0.1/32"]'}
    with running_gateway(tmp_path, env=env) as first:
        _register_guarded(first)
        invocation_id = _invoke(first, "guarded_echo", {"text": "after the restart"})
        _pending(first, invocation_id)
        args = list(first.process.args)[4:]  # `up` with the same --tools
    (tmp_path / ".toolexec" / "runtime.json").unlink(missing_ok=True)  # killed: left behind
    up = start_up(tmp_path, *args, env=env)
    try:
        url = json.loads((tmp_path / ".toolexec" / "runtime.json").read_text())["gateway_url"]
        with httpx.Client(base_url=url, timeout=WAIT) as http:
            second = RunningGateway(tmp_path, up, url, http, env)
            row = _pending(second, invocation_id)
            sent = _decide(second, invocation_id, _approver(second), decision="approve")
            assert sent.status_code == 202, sent.text
            assert sent.json()["approved_hash"] == row["call_hash"]
            view = _ended(second, invocation_id, _agent(second))
            assert view["status"] == "completed", view
            assert _terminals(_audit_types(second, invocation_id)) == ["tool.invoke.completed"]
    finally:
        stop(up)
