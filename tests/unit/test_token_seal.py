"""Tokens sealed to the pipeline and bound to their command: they open for that command
as the pipeline reads it back from the log, and for no other (another invocation, call
hash, verdict or approver), nor under another key."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from consumers.steps.authorize import AuthorizeDeps, check_approver, presented_token
from contracts.envelope import Envelope, new_envelope
from contracts.events import ApprovalDecided
from contracts.kafka_binding import decode, encode
from contracts.token_seal import SealBroken, TokenOpener, TokenSealer, is_sealed, new_private_key
from domain.errors import AuthorizationError
from projections.audit_document import captoken_identity
from tests.projection_events import captoken, invocation
from tests.unit.test_rebuild_golden import PARAMETERS

HASH = "sha256:" + "ab" * 32
NOW = datetime(2026, 11, 27, 12, tzinfo=UTC)
KEY = new_private_key()
OPENER = TokenOpener(KEY)
SEALER = TokenSealer(KEY.public_key())


def _decision(invocation_id: str = "inv-1", *, token: str = "t", id: str = "d-1",
              **changes: Any) -> Envelope:
    fields = dict(invocation_id=invocation_id, decision="approve", approved_hash=HASH,
                  decided_by="did:example:ops") | changes
    return new_envelope(ApprovalDecided(**fields), source="urn:test", partitionkey=invocation_id,
                        correlationid=invocation_id, id=id, time=NOW,
                        extensions={"captoken": token})


def _sealed(envelope: Envelope, token: str) -> Envelope:
    envelope.extensions["captoken"] = SEALER.seal(token, envelope)
    return envelope


def _read_back(envelope: Envelope) -> Envelope:
    record = encode(envelope)
    return decode(record.key, record.value, record.headers)


@pytest.mark.parametrize("parameters", PARAMETERS)
def test_a_sealed_token_opens_for_its_request_as_read_back_from_the_log_and_shows_its_owner(
        parameters: dict[str, Any]) -> None:
    token = captoken("did:example:ann", "jti-7")
    request = _sealed(invocation("inv-9", parameters=parameters)[0], token)
    assert is_sealed(request.extensions["captoken"])
    assert captoken_identity(request) == ("did:example:ann", "jti-7")  # as a plain one shows
    assert token not in str(encode(request))
    assert OPENER.open(request.extensions["captoken"], _read_back(request)) == token


@pytest.mark.parametrize("other", [
    {"invocation_id": "inv-2"}, {"approved_hash": "sha256:" + "cd" * 32},
    {"decision": "deny"}, {"decided_by": "did:example:eve"}, {"reason": "because"},
])
def test_a_sealed_token_copied_onto_another_decision_does_not_open(other: dict[str, Any]) -> None:
    stolen = _sealed(_decision(), "approver.jwt").extensions["captoken"]
    invocation_id = other.pop("invocation_id", "inv-1")
    forged = _decision(invocation_id, token=stolen, id="d-forged", **other)
    with pytest.raises(SealBroken):
        OPENER.open(stolen, forged)
    with pytest.raises(SealBroken):  # the same decision under another event id
        OPENER.open(stolen, dataclasses.replace(_decision(token=stolen), id="d-2"))


def test_only_the_pipeline_key_opens_and_garbage_never_does() -> None:
    decision = _sealed(_decision(), "approver.jwt")
    with pytest.raises(SealBroken):
        TokenOpener(new_private_key()).open(decision.extensions["captoken"], decision)
    again = SEALER.seal("approver.jwt", decision)  # the same token, command and sender
    assert again != decision.extensions["captoken"] and OPENER.open(again, decision)
    for garbage in ("sealed1.", "sealed1.!!!", "sealed1." + "A" * 40, "eyJhbGciOi.x.y"):
        with pytest.raises(SealBroken):
            OPENER.open(garbage, decision)


def _approver_token(key: rsa.RSAPrivateKey) -> str:
    iat = int(NOW.timestamp())
    return jwt.encode({"sub": "did:example:ops", "iat": iat, "exp": iat + 300, "jti": "a-1",
                       "scopes": {"approve": ["guarded_*"]}}, key, algorithm="RS256")


def test_the_pipeline_counts_a_sealed_approver_token_for_its_decision_only() -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    deps = AuthorizeDeps(clock=lambda: NOW + timedelta(seconds=5), require_auth=True,
                         public_keys=lambda: [rsa_key.public_key()], opener=OPENER)
    token = _approver_token(rsa_key)
    decision = _sealed(_decision(), token)
    check_approver(_read_back(decision), "guarded_tool", deps)  # counts
    assert presented_token(decision, deps) == token
    replayed = _decision("inv-2", token=decision.extensions["captoken"], id="d-9")
    with pytest.raises(AuthorizationError) as refused:
        check_approver(replayed, "guarded_tool", deps)
    assert refused.value.code == "E3203"
    without_key = dataclasses.replace(deps, opener=None)
    with pytest.raises(AuthorizationError) as unopened:
        check_approver(decision, "guarded_tool", without_key)
    assert unopened.value.code == "E3203"
    check_approver(_decision(token=token), "guarded_tool", deps)  # a plain token still counts
