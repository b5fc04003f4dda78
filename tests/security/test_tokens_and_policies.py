"""Capability tokens and ABAC policies through the pipeline: every forged, stale or
insufficient token is denied with its E-code and nothing runs; the token never
leaves the request."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
import structlog
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from contracts.envelope import new_envelope
from contracts.events import PolicyUpdated
from tests.handlers.conftest import FIXED_NOW
from tests.security.conftest import build_secure_harness, claims, rs256, unsigned

pytestmark = pytest.mark.security


async def _decide(key: rsa.RSAPrivateKey, token: str | None, *, tool: str = "py_echo",
                  policies: str | None = None) -> tuple[Any, Any, Any]:
    harness, view, _ = build_secure_harness([key.public_key()])
    if policies is not None:
        view.apply(_policy_event(policies))
    invocation = await harness.request(tool, {"text": "x"}, token=token)
    decision = harness.of(invocation, "tool.permission.decided")[0].data
    return decision, harness.terminal(invocation), harness


def _policy_event(text: str, version: str = "v1") -> Any:
    return new_envelope(PolicyUpdated(policy_set_id="main", version=version, policies=text),
                        source="urn:test", partitionkey="main", correlationid="main",
                        id=str(uuid.uuid4()), time=FIXED_NOW)


def _assert_denied(decision: Any, terminal: Any, harness: Any, code: str) -> None:
    assert decision.decision == "deny" and decision.error.code == code
    assert terminal.type == "tool.invoke.failed"
    assert (terminal.data.error.code, terminal.data.stage) == (code, "authorize")
    assert harness.runner.plans == []
    assert not [e for e in harness.events if e.type.startswith("tool.execution.")]


async def test_alg_none_token_is_refused_E3203(rsa_key) -> None:
    _assert_denied(*await _decide(rsa_key, unsigned()), "E3203")


async def test_hs256_signed_with_the_public_key_is_refused_E3203(rsa_key) -> None:
    public_pem = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    forged = _hs256(claims(), public_pem)  # PyJWT itself refuses to sign this way
    _assert_denied(*await _decide(rsa_key, forged), "E3203")


def _hs256(payload: dict[str, Any], secret: bytes) -> str:
    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    signing_input = (part(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + "."
                     + part(json.dumps(payload).encode()))
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{part(signature)}"


async def test_token_without_exp_is_refused_E3203(rsa_key) -> None:
    _assert_denied(*await _decide(rsa_key, rs256(rsa_key, exp=None)), "E3203")


async def test_expired_token_is_refused_E3201(rsa_key) -> None:
    now = int(FIXED_NOW.timestamp())
    token = rs256(rsa_key, iat=now - 600, exp=now - 1)
    _assert_denied(*await _decide(rsa_key, token), "E3201")


async def test_token_signed_by_another_key_is_refused_E3202(rsa_key) -> None:
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _assert_denied(*await _decide(rsa_key, rs256(stranger)), "E3202")


async def test_tool_missing_from_the_token_is_refused_E3204(rsa_key) -> None:
    _assert_denied(*await _decide(rsa_key, rs256(rsa_key, tool="sh_upper")), "E3204")


async def test_garbage_token_is_refused_E3203(rsa_key) -> None:
    _assert_denied(*await _decide(rsa_key, "not.a.jwt"), "E3203")


FORBID_AGENT = """
@id("no-py-echo-for-agent")
@reason("this agent may not echo")
forbid(principal == Agent::"did:example:agent", action == Action::"tool.invoke", resource)
  when { resource.tool_id == "py_echo" };
permit(principal, action, resource);
"""


async def test_policy_forbid_denies_with_E3206_and_the_policy_reason(rsa_key) -> None:
    decision, terminal, harness = await _decide(rsa_key, rs256(rsa_key), policies=FORBID_AGENT)
    _assert_denied(decision, terminal, harness, "E3206")
    assert "no-py-echo-for-agent: this agent may not echo" in terminal.data.error.message
    assert decision.policy_version == "main:v1"


async def test_no_matching_permit_denies_E3206(rsa_key) -> None:
    only_others = 'permit(principal == Agent::"did:example:other", action, resource);'
    decision, terminal, harness = await _decide(rsa_key, rs256(rsa_key), policies=only_others)
    _assert_denied(decision, terminal, harness, "E3206")
    assert "no policy permits" in terminal.data.error.message


async def test_policy_on_manifest_attributes_permits(rsa_key) -> None:
    by_type = 'permit(principal, action == Action::"tool.invoke", resource) ' \
              'when { resource.tool_type == "script" && context.parameter_keys.contains("text") };'
    decision, terminal, _ = await _decide(rsa_key, rs256(rsa_key), policies=by_type)
    assert decision.decision == "allow" and decision.policy_version == "main:v1"
    assert terminal.type == "tool.invoke.completed"


async def test_valid_token_without_policies_is_allowed_by_default(rsa_key) -> None:
    decision, terminal, _ = await _decide(rsa_key, rs256(rsa_key))
    assert decision.decision == "allow" and "no policy loaded" in decision.reason
    assert terminal.type == "tool.invoke.completed"


async def test_repeated_decision_is_served_from_the_cache_until_policies_change(
        rsa_key) -> None:
    harness, view, cache = build_secure_harness([rsa_key.public_key()])
    view.apply(_policy_event("permit(principal, action, resource);", "v1"))
    for _ in range(3):
        await harness.request("py_echo", {"text": "x"}, token=rs256(rsa_key))
    assert (cache.hits, cache.misses) == (2, 1)
    view.apply(_policy_event(FORBID_AGENT, "v2"))
    denied = await harness.request("py_echo", {"text": "x"}, token=rs256(rsa_key))
    assert harness.terminal(denied).data.error.code == "E3206"
    assert cache.invalidations == 2 and cache.misses == 2


async def test_token_never_reaches_derived_events_or_log_lines(rsa_key) -> None:
    token = rs256(rsa_key)
    with structlog.testing.capture_logs() as logs:
        decision, terminal, harness = await _decide(rsa_key, token, policies=FORBID_AGENT)
        allowed_harness, _, _ = build_secure_harness([rsa_key.public_key()])
        await allowed_harness.request("py_echo", {"text": "x"}, token=token)
    derived = harness.events[1:] + allowed_harness.events[1:]
    assert derived and all("captoken" not in e.extensions for e in derived)
    assert all(token not in e.data.model_dump_json() for e in derived)
    assert token not in repr(logs)
    signature = token.rsplit(".", 1)[1]
    assert all(signature not in e.data.model_dump_json() for e in derived)


async def test_expiry_is_judged_by_the_pipeline_clock(rsa_key) -> None:
    later = FIXED_NOW + timedelta(seconds=10)
    token = rs256(rsa_key, exp=int(later.timestamp()))
    decision, _, _ = await _decide(rsa_key, token)
    assert decision.decision == "allow"
