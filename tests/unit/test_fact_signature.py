"""Fact signatures: what verifies, what does not, and the verdicts shared in a process."""

from __future__ import annotations

from dataclasses import replace

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contracts.fact_signature import CE_PREFIX, SIG, FactSigner, FactVerifier, Verdict
from contracts.kafka_binding import KafkaRecord


def _records() -> list[KafkaRecord]:
    return [KafkaRecord(key=b"inv-1", value=f'{{"n": {n}}}'.encode(),
                        headers=[("ce_type", b"tool.execution.started"), ("ce_id", f"e{n}".encode()),
                                 ("content-type", b"application/json")])
            for n in range(3)]


def _check(verifier: FactVerifier, record: KafkaRecord) -> Verdict:
    return verifier.verify(record.headers, record.value)


def test_every_fact_of_a_signed_batch_verifies_and_a_changed_one_does_not() -> None:
    signer = FactSigner(Ed25519PrivateKey.generate())
    verifier = FactVerifier([signer.public_key])
    signed = signer.sign(_records())
    assert [_check(verifier, r) for r in signed] == [Verdict.VALID] * 3
    changed = replace(signed[1], value=b'{"n": 9}')
    assert _check(verifier, changed) is Verdict.INVALID
    assert _check(verifier, _records()[0]) is Verdict.UNSIGNED


def test_a_verdict_checked_by_one_verifier_is_not_lent_to_one_that_trusts_another_key() -> None:
    signer = FactSigner(Ed25519PrivateKey.generate())
    trusting = FactVerifier([signer.public_key])
    other = FactVerifier([Ed25519PrivateKey.generate().public_key()])
    signed = signer.sign(_records())
    assert _check(trusting, signed[0]) is Verdict.VALID
    assert _check(other, signed[0]) is Verdict.UNKNOWN_KEY


def test_a_forged_signature_over_a_batch_already_checked_is_invalid() -> None:
    signer = FactSigner(Ed25519PrivateKey.generate())
    verifier = FactVerifier([signer.public_key])
    signed = signer.sign(_records())
    assert _check(verifier, signed[0]) is Verdict.VALID
    forged_sig = [(n, b"A" * 86 if n == CE_PREFIX + SIG else v) for n, v in signed[0].headers]
    assert _check(FactVerifier([signer.public_key]),
                  replace(signed[0], headers=forged_sig)) is Verdict.INVALID
