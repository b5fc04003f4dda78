"""Approvals: the call hash binds an approval to one exact call; what requires an
approval (Cedar permits annotated `@approval("required")`, the manifest); when a
waiting call may run, and the E32xx code it ends with otherwise."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given
from hypothesis import strategies as st

from consumers.adapters.decision_cache import _dump, _load
from consumers.adapters.policy_engine import CedarEvaluator
from consumers.steps.authorize import AuthorizeDeps, check_approver
from contracts.envelope import Envelope, new_envelope
from contracts.events import ApprovalDecided
from domain.approval import (
    MANIFEST_REASON,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalMismatch,
    Decision,
    approval_reasons,
    call_hash,
    check_approval,
    manifest_requires_approval,
)
from domain.errors import AuthorizationError
from domain.policy import AccessRequest, DecisionCache, PolicyBundle, ToolResource, decide

INTEGRITY = "sha256:" + "ab" * 32
CALL = {"integrity": INTEGRITY, "parameters": {"path": "/tmp/x", "force": True},
        "agent": "did:example:ada", "policy_version": "main:1"}
T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
EXPIRES = T0 + timedelta(hours=1)
HASH = call_hash(**CALL)

json_values = st.recursive(st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                           max_leaves=8)


def test_the_hash_is_sha256_of_the_canonical_call() -> None:
    assert HASH.startswith("sha256:") and len(HASH) == 71
    reordered = {**CALL, "parameters": {"force": True, "path": "/tmp/x"}}
    assert call_hash(**reordered) == HASH  # RFC 8785: key order does not matter


@pytest.mark.parametrize("changed", [
    {"integrity": "sha256:" + "cd" * 32},
    {"parameters": {"path": "/tmp/y", "force": True}},
    {"parameters": {"path": "/tmp/x", "force": 1}},
    {"parameters": {"path": "/tmp/x"}},
    {"agent": "did:example:bob"},
    {"agent": None},
    {"policy_version": "main:2"},
    {"policy_version": None},
])
def test_any_change_of_the_call_changes_the_hash(changed: dict) -> None:
    assert call_hash(**{**CALL, **changed}) != HASH


@given(json_values, json_values)
def test_two_parameter_sets_share_a_hash_only_when_equal_as_json(a: object, b: object) -> None:
    first = call_hash(integrity=INTEGRITY, parameters={"v": a}, agent=None, policy_version=None)
    second = call_hash(integrity=INTEGRITY, parameters={"v": b}, agent=None,
                       policy_version=None)
    assert (first == second) == (_json_equal(a, b))


def _json_equal(a: object, b: object) -> bool:
    """Equality as JSON values (Python says True == 1; JSON does not)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _decision(verdict: str = "approve", approved: str = HASH,
              at: datetime = T0 + timedelta(minutes=5)) -> Decision:
    return Decision(verdict=verdict, approved_hash=approved,  # type: ignore[arg-type]
                    decided_by="did:example:ops", decided_at=at, reason="ok")


def test_a_call_waits_until_decided_or_expired() -> None:
    assert check_approval(HASH, EXPIRES, None, T0) is False
    with pytest.raises(ApprovalExpired) as expired:
        check_approval(HASH, EXPIRES, None, EXPIRES)
    assert expired.value.code == "E3209"


def test_an_approval_of_exactly_this_call_lets_it_run() -> None:
    assert check_approval(HASH, EXPIRES, _decision(), T0 + timedelta(minutes=6)) is True
    # honoured after the expiry too: it was decided in time (a restart read it back late)
    assert check_approval(HASH, EXPIRES, _decision(), EXPIRES + timedelta(hours=2)) is True


def test_an_approval_of_another_call_is_E3210() -> None:
    other = call_hash(**{**CALL, "parameters": {"path": "/etc", "force": True}})
    with pytest.raises(ApprovalMismatch) as caught:
        check_approval(HASH, EXPIRES, _decision(approved=other), T0)
    assert caught.value.code == "E3210"
    assert caught.value.details["approved_hash"] == other
    assert caught.value.details["call_hash"] == HASH


def test_a_deny_is_E3208_whatever_hash_it_names() -> None:
    with pytest.raises(ApprovalDenied) as caught:
        check_approval(HASH, EXPIRES, _decision("deny", approved="sha256:" + "00" * 32), T0)
    assert caught.value.code == "E3208" and caught.value.details["decided_by"] == "did:example:ops"


def test_a_decision_made_after_the_expiry_changes_nothing() -> None:
    late = _decision(at=EXPIRES + timedelta(seconds=1))
    with pytest.raises(ApprovalExpired) as caught:
        check_approval(HASH, EXPIRES, late, EXPIRES + timedelta(seconds=2))
    assert caught.value.details["late_decision"] is True


def test_the_manifest_can_only_add_a_requirement() -> None:
    assert manifest_requires_approval({"approval": {"required": True}})
    for manifest in ({}, {"approval": {"required": False}}, {"approval": True},
                     {"approval": {"required": "yes"}}):
        assert not manifest_requires_approval(manifest)
    assert approval_reasons([], {}) == ()
    assert approval_reasons(["p: why"], {"approval": {"required": False}}) == ("p: why",)
    assert approval_reasons(["p: why"], {"approval": {"required": True}}) == (
        "p: why", MANIFEST_REASON)


POLICIES = """
@id("default-permit")
permit (principal, action == Action::"tool.invoke", resource);

@id("force-needs-a-person")
@reason("forced writes are reviewed")
@approval("required")
permit (principal, action == Action::"tool.invoke", resource)
when { resource.tags.contains("fs") && context.parameter_keys.contains("force") };
"""
RESOURCE = ToolResource.from_manifest("write_file", "1.0.0", {"tags": ["fs"],
                                                              "tool_type": "script"})


def _evaluate(parameters: dict, text: str = POLICIES) -> object:
    request = AccessRequest.build("did:example:ada", RESOURCE, parameters, now=100)
    return CedarEvaluator().evaluate(PolicyBundle({"main": ("1", text)}), request)


def test_a_matching_annotated_permit_requires_approval_and_names_itself() -> None:
    decision = _evaluate({"path": "/x", "force": True})
    assert decision.allowed  # type: ignore[attr-defined]
    assert decision.approval == ("force-needs-a-person: forced writes are reviewed",)  # type: ignore[attr-defined]


def test_without_the_parameter_the_call_needs_no_approval() -> None:
    decision = _evaluate({"path": "/x"})
    assert decision.allowed and decision.approval == ()  # type: ignore[attr-defined]


def test_a_forbid_wins_over_an_annotated_permit() -> None:
    text = POLICIES + '\n@id("no-fs") forbid (principal, action, resource) ' \
                      'when { resource.tags.contains("fs") };'
    decision = _evaluate({"force": True}, text)
    assert not decision.allowed and decision.approval == ()  # type: ignore[attr-defined]


def test_the_requirement_survives_the_decision_caches() -> None:
    request = AccessRequest.build("did:example:ada", RESOURCE, {"force": 1}, now=100)
    bundle = PolicyBundle({"main": ("1", POLICIES)})
    cache = DecisionCache(ttl_seconds=60)
    first = decide(request, bundle, CedarEvaluator(), cache, clock=0)
    again = decide(request, bundle, CedarEvaluator(), cache, clock=1)
    assert again.cached and again.approval == first.approval != ()
    shared = _load(_dump(first))  # the Redis form
    assert shared is not None and shared.approval == first.approval


# --- who may decide: the approver's token, checked as of the pipeline's clock --------

def _decided(token: str, *, at: datetime, decided_by: str = "did:example:ops") -> Envelope:
    data = ApprovalDecided(invocation_id="inv-1", decision="approve", approved_hash=HASH,
                           decided_by=decided_by)
    return new_envelope(data, source="urn:test", partitionkey="inv-1", correlationid="inv-1",
                        id="decided-1", time=at, extensions={"captoken": token})


def _approver_token(key: rsa.RSAPrivateKey, *, issued: datetime) -> str:
    iat = int(issued.timestamp())
    return jwt.encode({"sub": "did:example:ops", "iat": iat, "exp": iat + 300, "jti": "a-1",
                       "scopes": {"approve": ["guarded_*"]}}, key, algorithm="RS256")


def test_a_decision_counts_only_with_an_approver_token_valid_now() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = T0 + timedelta(minutes=30)

    def deps() -> AuthorizeDeps:
        return AuthorizeDeps(clock=lambda: now, require_auth=True,
                             public_keys=lambda: [key.public_key()])

    def refusal(decided: Envelope, tool_id: str) -> str | None:
        try:
            check_approver(decided, tool_id, deps())
        except AuthorizationError as error:
            return error.code
        return None

    fresh = _approver_token(key, issued=now - timedelta(seconds=10))
    assert refusal(_decided(fresh, at=now), "guarded_tool") is None
    assert refusal(_decided(fresh, at=now), "other_tool") == "E3206"
    assert refusal(_decided(fresh, at=now, decided_by="did:example:eve"),
                   "guarded_tool") == "E3206"
    # expired 25 minutes ago: backdating the decision's own `time` does not revive it
    stale = _approver_token(key, issued=T0)
    assert refusal(_decided(stale, at=T0 + timedelta(seconds=5)), "guarded_tool") == "E3201"
