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
    _signature_values,
    _written_digest,
    key_id,
    record_digest,
)
from contracts.kafka_binding import WRITTEN_HEADER_NAMES, KafkaRecord

_KEY = Ed25519PrivateKey.generate()


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


def test_a_batch_signature_is_the_one_openssl_makes_with_the_same_key() -> None:
    """Signed by libsodium, checkable by anyone's Ed25519 (deterministic signatures)."""
    signer = FactSigner(_KEY)
    signed = signer.sign(_records())
    headers = dict(signed[0].headers)
    message = headers[CE_PREFIX + "sigkid"] + b"." + headers[CE_PREFIX + "sigset"]
    raw = headers[CE_PREFIX + SIG]
    assert base64.urlsafe_b64decode(raw + b"=" * (-len(raw) % 4)) == _KEY.sign(message)
    unsigned = [(r.headers, r.value) for r in _records()]
    assert signer.batch_headers(unsigned) == signed[0].headers[-3:]


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


_names = st.sampled_from(sorted(WRITTEN_HEADER_NAMES) + ["ce_other", "toolexec-other", "x-y",
                                                          "CE_ID", ""]) | st.text(max_size=5)
_values = (st.binary(max_size=8) | st.sampled_from([b"1.0", b"\xc3\xa9", b"\xff", b""])
           | st.text(max_size=4) | st.binary(max_size=4).map(bytearray))


@settings(max_examples=300, deadline=None)
@given(headers=st.lists(st.tuples(_names, _values), max_size=8),
       value=st.none() | st.binary(max_size=16))
def test_the_digest_read_from_bytes_is_the_digest_read_from_text(
        headers: list[tuple[str, object]], value: bytes | None) -> None:
    signed = FactSigner(_KEY).sign([KafkaRecord(b"k", b"{}", _records()[0].headers)])[0]
    for given_headers in (headers, [*signed.headers, *headers]):
        assert record_digest(given_headers, value) == record_digest(tuple(given_headers), value)


def test_a_written_fact_takes_the_bytes_reading() -> None:
    signed = FactSigner(_KEY).sign(_records())[0]
    assert _written_digest(signed.headers, signed.value) == record_digest(
        tuple(signed.headers), signed.value)


def _signature_values_walked(headers: list[tuple[str, object]]) -> tuple[str | None, ...]:
    """The signature headers read as `FactVerifier.verify` read them before the tail
    was read directly: every header walked, the last of each name kept."""
    kid = digests = signature = None
    for name, raw in headers:
        if name in (CE_PREFIX + "sigkid", CE_PREFIX + "sigset", CE_PREFIX + SIG):
            text = raw.decode("ascii", "replace") if isinstance(raw, bytes | bytearray) \
                else str(raw)
            if name == CE_PREFIX + "sigkid":
                kid = text
            elif name == CE_PREFIX + "sigset":
                digests = text
            else:
                signature = text
    return kid, digests, signature


_signature_names = st.sampled_from([CE_PREFIX + "sigkid", CE_PREFIX + "sigset", CE_PREFIX + SIG,
                                    "ce_id", "CE_SIG", "ce_sigs"])


@settings(max_examples=400, deadline=None)
@given(before=st.lists(st.tuples(_signature_names | _names, _values), max_size=6),
       tail=st.lists(st.tuples(_signature_names, _values), max_size=4),
       as_written=st.booleans())
def test_the_signature_headers_read_from_the_tail_are_the_last_of_each_name(
        before: list[tuple[str, object]], tail: list[tuple[str, object]],
        as_written: bool) -> None:
    """Forged or repeated signature headers anywhere, the tail as the signer writes it
    or not: the values read are the last of each name, as a walk of every header gives."""
    signed = FactSigner(_KEY).sign(_records())[0].headers
    headers = [*before, *(signed if as_written else []), *tail]
    assert _signature_values(headers) == _signature_values_walked(headers)


def test_a_forged_signature_header_before_the_written_ones_changes_no_verdict() -> None:
    records = FactSigner(_KEY).sign(_records())
    verifier = FactVerifier([_KEY.public_key()])
    forged = [replace(r, headers=[(CE_PREFIX + SIG, b"forged"), (CE_PREFIX + "sigset", b"0" * 32),
                                  *r.headers]) for r in records]
    assert [_check(verifier, r) for r in forged] == [Verdict.VALID] * 3
    # the last one read decides: a forged signature after the written ones is refused
    tampered = [replace(r, headers=[*r.headers, (CE_PREFIX + SIG, b"forged")]) for r in records]
    assert [_check(verifier, r) for r in tampered] == [Verdict.INVALID] * 3
