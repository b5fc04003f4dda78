"""The authorize step after a restart: a request consumed by an earlier consumer of the
group still has its token in the log, and the decision is the one an uninterrupted
consumer would have made. E3203 stays for a token that is genuinely not there."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from consumers import authorize, resolve
from consumers.ports import LogPosition
from contracts import topics
from contracts.envelope import Envelope, new_envelope
from contracts.events import InvokeRequested
from tests.handlers.conftest import FIXED_NOW, FakeRegistry, sealed_tools

NOW = int(FIXED_NOW.timestamp())


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _token(key: rsa.RSAPrivateKey) -> str:
    return jwt.encode({"sub": "did:example:a", "iat": NOW, "exp": NOW + 60, "jti": "j1",
                       "tools": [{"tool_id": "py_echo", "version_range": "^1"}]},
                      key, algorithm="RS256")


class PartitionLog:
    """A fake request log: one partition's events in log order (offset = index)."""

    def __init__(self, *events: Envelope) -> None:
        self.events = list(events)

    async def find(self, before: LogPosition, event_id: str) -> Envelope | None:
        return next((e for e in self.events[:before.offset] if e.id == event_id), None)

    async def find_after(self, after: LogPosition, event_id: str,
                         event_type: str) -> Envelope | None:
        return next((e for e in self.events[after.offset + 1:]
                     if e.id == event_id and e.type == event_type), None)


def _request(token: str | None, invocation_id: str | None = None) -> Envelope:
    invocation_id = invocation_id or str(uuid.uuid4())
    return new_envelope(
        InvokeRequested(invocation_id=invocation_id, tool_id="py_echo", version_range="*",
                        parameters={"text": "x"}),
        source="urn:test", partitionkey=invocation_id, correlationid=invocation_id,
        id=str(uuid.uuid4()), time=FIXED_NOW,
        extensions={"captoken": token} if token else {})


async def _resolved(request: Envelope) -> Envelope:
    registry = FakeRegistry()
    for tool in sealed_tools():
        registry.add(tool)
    out: list[Envelope] = []

    async def publish(envelope: Envelope) -> None:
        out.append(envelope)

    await resolve.on_invoke_requested(
        request, resolve.ResolveDeps(registry=registry, publish=publish, clock=lambda: FIXED_NOW))
    assert out[0].type == "tool.chain.resolved", out
    return out[0]


def _authorize(key: rsa.RSAPrivateKey, requests: Any = None, *, now: datetime = FIXED_NOW
               ) -> tuple[authorize.AuthorizeDeps, list[Envelope]]:
    published: list[Envelope] = []

    async def publish(envelope: Envelope) -> None:
        published.append(envelope)

    deps = authorize.AuthorizeDeps(publish=publish, clock=lambda: now, require_auth=True,
                                   public_keys=lambda: [key.public_key()],
                                   pending=authorize.PendingTokens(), requests=requests)
    return deps, published


AT_1 = LogPosition(topics.INVOCATIONS, 0, 1)  # the resolution follows its request


async def test_token_is_read_back_from_the_log_after_a_restart(rsa_key) -> None:
    request = _request(_token(rsa_key))
    resolved = await _resolved(request)
    before_restart, _ = _authorize(rsa_key)
    await authorize.on_invoke_requested(request, before_restart)  # then the process died
    restarted, published = _authorize(rsa_key, PartitionLog(request, resolved))
    await authorize.on_chain_resolved(resolved, restarted, AT_1)
    assert [e.type for e in published] == ["tool.permission.decided"]
    decision = published[0].data
    assert (decision.decision, decision.subject, decision.token_jti) == ("allow", "did:example:a",
                                                                          "j1")


async def test_read_back_decision_is_the_uninterrupted_one(rsa_key) -> None:
    request = _request(_token(rsa_key))
    resolved = await _resolved(request)
    uninterrupted, expected = _authorize(rsa_key)
    await authorize.on_invoke_requested(request, uninterrupted)
    await authorize.on_chain_resolved(resolved, uninterrupted, AT_1)
    restarted, published = _authorize(rsa_key, PartitionLog(request, resolved))
    await authorize.on_chain_resolved(resolved, restarted, AT_1)
    assert [(e.id, e.data) for e in published] == [(e.id, e.data) for e in expected]


async def test_request_gone_from_the_log_is_denied_E3203(rsa_key) -> None:
    request = _request(_token(rsa_key))
    resolved = await _resolved(request)
    restarted, published = _authorize(rsa_key, PartitionLog(resolved))  # retention took it
    await authorize.on_chain_resolved(resolved, restarted, LogPosition(topics.INVOCATIONS, 0, 0))
    assert [e.type for e in published] == ["tool.permission.decided", "tool.invoke.failed"]
    assert published[0].data.decision == "deny"
    failed = published[1].data
    assert (failed.error.code, failed.stage) == ("E3203", "authorize")
    assert "no longer in the log" in failed.error.message


async def test_request_read_back_without_a_token_is_denied_E3203(rsa_key) -> None:
    request = _request(None)
    resolved = await _resolved(request)
    restarted, published = _authorize(rsa_key, PartitionLog(request, resolved))
    await authorize.on_chain_resolved(resolved, restarted, AT_1)
    failed = published[-1].data
    assert (failed.error.code, failed.stage) == ("E3203", "authorize")
    assert "none was presented" in failed.error.message


async def test_a_record_of_another_invocation_with_that_id_does_not_lend_its_token(
        rsa_key) -> None:
    request = _request(_token(rsa_key))
    resolved = await _resolved(request)
    stranger = _request(_token(rsa_key))
    impostor = new_envelope(stranger.data, source="urn:test", partitionkey=stranger.partitionkey,
                            correlationid=stranger.correlationid, id=request.id,
                            time=FIXED_NOW, extensions=stranger.extensions)
    restarted, published = _authorize(rsa_key, PartitionLog(impostor, resolved))
    await authorize.on_chain_resolved(resolved, restarted, AT_1)
    assert published[-1].data.error.code == "E3203"


async def test_a_request_after_the_resolution_is_not_read_back(rsa_key) -> None:
    request = _request(_token(rsa_key))
    resolved = await _resolved(request)
    restarted, published = _authorize(rsa_key, PartitionLog(resolved, request))
    await authorize.on_chain_resolved(resolved, restarted, LogPosition(topics.INVOCATIONS, 0, 0))
    assert published[-1].data.error.code == "E3203"


async def test_without_a_request_log_a_forgotten_token_is_E3203(rsa_key) -> None:
    request = _request(_token(rsa_key))
    resolved = await _resolved(request)
    restarted, published = _authorize(rsa_key)
    await authorize.on_chain_resolved(resolved, restarted, AT_1)
    assert published[-1].data.error.code == "E3203"


async def _decided_before_the_restart(key: rsa.RSAPrivateKey, token: str
                                      ) -> tuple[Envelope, Envelope, list[Envelope]]:
    """A request, its resolution, and what an uninterrupted consumer published for it."""
    request = _request(token)
    resolved = await _resolved(request)
    before_restart, published = _authorize(key)
    await authorize.on_invoke_requested(request, before_restart)
    await authorize.on_chain_resolved(resolved, before_restart, AT_1)
    return request, resolved, published


async def test_a_resolution_decided_before_the_restart_is_not_decided_again(rsa_key) -> None:
    request, resolved, earlier = await _decided_before_the_restart(rsa_key, _token(rsa_key))
    assert earlier[0].data.decision == "allow"
    # Redelivered after the restart, when the token has expired: the allow stands.
    later = FIXED_NOW + timedelta(hours=1)
    restarted, published = _authorize(rsa_key, PartitionLog(request, resolved, *earlier),
                                      now=later)
    await authorize.on_chain_resolved(resolved, restarted, AT_1)
    assert published == []


async def test_an_earlier_deny_gets_its_failure_event_again_with_the_same_id(rsa_key) -> None:
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    request, resolved, earlier = await _decided_before_the_restart(rsa_key, _token(stranger))
    decision, failure = earlier
    assert decision.data.decision == "deny"
    # The restart fell between the decision and its failure event.
    restarted, published = _authorize(rsa_key, PartitionLog(request, resolved, decision))
    await authorize.on_chain_resolved(resolved, restarted, AT_1)
    assert [(e.id, e.type, e.data.error.code) for e in published] == [
        (failure.id, "tool.invoke.failed", "E3202")]
