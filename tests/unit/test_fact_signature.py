"""Fact signatures: what verifies, what does not, and the verdicts shared in a process."""

from __future__ import annotations

import base64
from dataclasses import replace

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import VerifyKey

from contracts.fact_signature import (
    CE_PREFIX,
    SIG,
    FactSigner,
    FactVerifier,
    Verdict,
    key_id,
)
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


@settings(max_examples=150, deadline=None)
@given(digests=st.text("0123456789abcdef.", min_size=1, max_size=120),
       flips=st.lists(st.tuples(st.integers(0, 63), st.integers(1, 255)), max_size=3),
       cut=st.integers(0, 70), key_flip=st.booleans())
def test_libsodium_gives_openssls_verdict_on_signatures_valid_changed_or_cut(
        digests: str, flips: list[tuple[int, int]], cut: int, key_flip: bool) -> None:
    private = Ed25519PrivateKey.generate()
    public = private.public_key()
    kid = key_id(public)
    raw = bytearray(private.sign(f"{kid}.{digests}".encode("ascii")))
    for at, mask in flips:
        raw[at] ^= mask
    raw = raw[:cut] if cut < 64 else raw
    signature = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode("ascii")
    message = f"{kid}.{digests}{'0' if key_flip else ''}".encode("ascii")
    try:
        public.verify(bytes(raw), message)
        openssl = True
    except InvalidSignature:
        openssl = False
    verdict = FactVerifier([public])._batch_valid(
        VerifyKey(public.public_bytes(Encoding.Raw, PublicFormat.Raw)), kid,
        digests + ("0" if key_flip else ""), signature)
    assert verdict is openssl
