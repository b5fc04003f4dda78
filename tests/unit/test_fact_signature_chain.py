"""Chained fact batches: one Ed25519 verification per chain, the verdicts of `verify`."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import VerifyKey

import contracts.fact_signature as fact_signature
from contracts.fact_signature import (
    CE_PREFIX,
    DIGEST_HEX,
    LINK_HEX,
    SET,
    SIG,
    FactSigner,
    FactVerifier,
    Verdict,
    batch_link,
    chain_link,
    forget_checked,
)
from contracts.kafka_binding import KafkaRecord

_TRUSTED = Ed25519PrivateKey.generate()
_ROTATED = Ed25519PrivateKey.generate()
_UNTRUSTED = Ed25519PrivateKey.generate()


class _CountingKey(VerifyKey):
    """A VerifyKey that counts its Ed25519 verifications."""

    calls = 0

    def verify(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        type(self).calls += 1
        return super().verify(*args, **kwargs)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> type[_CountingKey]:
    monkeypatch.setattr(fact_signature, "VerifyKey", _CountingKey)
    _CountingKey.calls = 0
    return _CountingKey


def _batch(number: int, size: int) -> list[KafkaRecord]:
    return [KafkaRecord(key=b"inv", value=f'{{"n": {number}, "i": {i}}}'.encode(),
                        headers=[("ce_id", f"e{number}-{i}".encode()),
                                 ("ce_type", b"tool.execution.started"),
                                 ("content-type", b"application/json")])
            for i in range(size)]


def _chain(signer: FactSigner, sizes: list[int]) -> list[KafkaRecord]:
    records: list[KafkaRecord] = []
    last = None
    for number, size in enumerate(sizes):
        signed = signer.sign(_batch(number, size), after=last)
        last = batch_link(signed[-1].headers[-3:])
        records.extend(signed)
    return records


def _one_by_one(records: list[KafkaRecord]) -> list[Verdict]:
    """What `verify` says of each record, in a process that has checked nothing."""
    forget_checked()
    verifier = FactVerifier([_TRUSTED.public_key(), _ROTATED.public_key()])
    verdicts = [verifier.verify(r.headers, r.value) for r in records]
    forget_checked()
    return verdicts


def test_a_chain_of_batches_costs_one_verification(counting: type[_CountingKey]) -> None:
    records = _chain(FactSigner(_TRUSTED), [3, 2] * 50)
    forget_checked()  # a reader that signed none of them
    verifier = FactVerifier([_TRUSTED.public_key()])
    assert verifier.verify_all(records) == [Verdict.VALID] * 250
    assert counting.calls == 1


def test_the_link_is_the_last_element_of_the_digest_set_and_no_facts_digest() -> None:
    first = FactSigner(_TRUSTED).sign(_batch(0, 2))
    second = FactSigner(_TRUSTED).sign(_batch(1, 2), after=batch_link(first[-1].headers[-3:]))
    elements = dict(second[0].headers)[CE_PREFIX + SET].decode().split(".")
    assert [len(e) for e in elements] == [DIGEST_HEX, DIGEST_HEX, LINK_HEX]
    values = dict(first[0].headers)
    assert elements[-1] == chain_link(values[CE_PREFIX + "sigkid"], values[CE_PREFIX + SET],
                                      values[CE_PREFIX + SIG])
    # a reader that knows nothing of links checks each record as before
    forget_checked()
    assert [FactVerifier([_TRUSTED.public_key()]).verify(r.headers, r.value)
            for r in second] == [Verdict.VALID] * 2


def test_a_forged_batch_linking_to_real_ones_vouches_for_nothing(
        counting: type[_CountingKey]) -> None:
    real = _chain(FactSigner(_TRUSTED), [3, 2, 3])
    link = batch_link(real[-1].headers[-3:])
    forged = FactSigner(_UNTRUSTED).sign(_batch(9, 2), after=link)
    # claims the trusted key: its signature is then no valid one for it
    trusted_kid = dict(real[0].headers)[CE_PREFIX + "sigkid"]
    forged = [replace(r, headers=[(n, trusted_kid if n == CE_PREFIX + "sigkid" else v)
                                  for n, v in r.headers]) for r in forged]
    forget_checked()
    verdicts = FactVerifier([_TRUSTED.public_key()]).verify_all([*real, *forged])
    assert verdicts == [Verdict.VALID] * 8 + [Verdict.INVALID] * 2
    assert counting.calls == 2  # the forged head, then the real chain's own head


def test_a_forged_batch_cannot_vouch_for_a_batch_with_a_forged_signature() -> None:
    real = FactSigner(_TRUSTED).sign(_batch(0, 2))
    kid = dict(real[0].headers)[CE_PREFIX + "sigkid"]
    forged_sig = [replace(r, headers=[(n, b"C" * 86 if n == CE_PREFIX + SIG else v)
                                      for n, v in r.headers]) for r in real]
    claiming = [replace(r, headers=[(n, kid if n == CE_PREFIX + "sigkid" else v)
                                    for n, v in r.headers])
                for r in FactSigner(_UNTRUSTED).sign(
                    _batch(1, 2), after=batch_link(forged_sig[-1].headers[-3:]))]
    forget_checked()
    assert FactVerifier([_TRUSTED.public_key()]).verify_all([*forged_sig, *claiming]) \
        == [Verdict.INVALID] * 4


def test_a_batch_whose_signature_was_replaced_is_no_longer_the_one_linked_to() -> None:
    records = _chain(FactSigner(_TRUSTED), [3, 2, 3])
    tampered = [replace(r, headers=[(n, b"A" * 86 if n == CE_PREFIX + SIG else v)
                                    for n, v in r.headers]) if 3 <= i < 5 else r
                for i, r in enumerate(records)]
    forget_checked()
    verdicts = FactVerifier([_TRUSTED.public_key()]).verify_all(tampered)
    assert verdicts == [Verdict.VALID] * 3 + [Verdict.INVALID] * 2 + [Verdict.VALID] * 3
    assert verdicts == _one_by_one(tampered)


# What a partition can hold: chains of the pipeline's keys (rotated mid-way), batches
# of a key nobody trusts, records changed, signatures replaced, records unsigned,
# batches out of order and repeated.
_ACTIONS = st.lists(st.tuples(
    st.sampled_from(["trusted", "rotated", "untrusted"]),
    st.sampled_from(["link", "link", "no_link", "random_link", "link_to_any"]),
    st.sampled_from(["none", "none", "none", "value", "signature", "unsigned", "kid"]),
    st.integers(1, 3)), min_size=1, max_size=14)


@settings(max_examples=500, deadline=None)
@given(actions=_ACTIONS, seed=st.integers(0, 2**32 - 1), shuffle=st.booleans(),
       repeat=st.booleans())
def test_verdicts_of_a_whole_fetch_are_those_of_each_record_alone(
        actions: list[tuple[str, str, str, int]], seed: int, shuffle: bool,
        repeat: bool) -> None:
    rng = random.Random(seed)
    signers = {"trusted": FactSigner(_TRUSTED), "rotated": FactSigner(_ROTATED),
               "untrusted": FactSigner(_UNTRUSTED)}
    last: dict[str, str] = {}
    own: dict[str, list[str]] = {who: [] for who in signers}
    seen: list[str] = []  # links to every signed batch as it is on the log
    batches: list[list[KafkaRecord]] = []
    for number, (who, linking, tamper, size) in enumerate(actions):
        # A trusted key links only to batches it signed (the signer keeps the link,
        # it never reads one from the log); the untrusted one links to anything.
        anything = own[who] if who != "untrusted" else seen
        after = {"link": last.get(who), "no_link": None,
                 "random_link": f"{rng.getrandbits(256):064x}",
                 "link_to_any": rng.choice(anything) if anything else None}[linking]
        signed = signers[who].sign(_batch(number, size), after=after)
        last[who] = batch_link(signed[-1].headers[-3:])
        own[who].append(last[who])
        batch = [_tampered(r, tamper, signers["trusted"].kid) for r in signed]
        if tamper != "unsigned":
            seen.append(batch_link(batch[-1].headers[-3:]))
        batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    records = [r for batch in batches for r in batch]
    if repeat:
        records += rng.sample(records, k=min(3, len(records)))
    expected = _one_by_one(records)
    verifier = FactVerifier([_TRUSTED.public_key(), _ROTATED.public_key()])
    assert verifier.verify_all(records) == expected
    forget_checked()


def _tampered(record: KafkaRecord, how: str, trusted_kid: str) -> KafkaRecord:
    if how == "value":
        return replace(record, value=record.value + b" ")
    if how == "signature":
        return replace(record, headers=[(n, b"B" * 86 if n == CE_PREFIX + SIG else v)
                                        for n, v in record.headers])
    if how == "unsigned":
        return replace(record, headers=[(n, v) for n, v in record.headers
                                        if n not in fact_signature.SIGNATURE_HEADERS])
    if how == "kid":  # another signer's batch claiming the trusted key
        return replace(record, headers=[(n, trusted_kid.encode()
                                         if n == CE_PREFIX + "sigkid" else v)
                                        for n, v in record.headers])
    return record
