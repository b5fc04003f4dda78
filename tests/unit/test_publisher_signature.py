"""Publisher signatures and the trust store (domain.publisher_signature)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import example, given, settings
from hypothesis import strategies as st

from domain.errors import PublisherNotTrusted
from domain.model import PublisherSignature
from domain.publisher_signature import (
    TrustStore,
    Verdict,
    check_chain_publishers,
    check_publisher,
    public_key_of,
    publisher_key_id,
    sign_integrity,
    signature_valid,
)
from tests.unit.chain_builders import primitive, runtime, script

PUBLISHER = Ed25519PrivateKey.generate()
ROGUE = Ed25519PrivateKey.generate()
PUBLISHER_ID = publisher_key_id(PUBLISHER.public_key())
ACME = TrustStore.of({"acme_": [PUBLISHER_ID]}, required=True)

_integrities = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64).map(
    lambda hex_: "sha256:" + hex_)


def signed_script(tool_id: str = "acme_echo", key: Ed25519PrivateKey = PUBLISHER):
    tv = script(tool_id)
    return replace(tv, publisher_signature=sign_integrity(key, tv.integrity))


def test_the_key_id_names_the_public_key() -> None:
    assert PUBLISHER_ID.startswith("ed25519:") and len(PUBLISHER_ID) == len("ed25519:") + 43
    assert publisher_key_id(public_key_of(PUBLISHER_ID)) == PUBLISHER_ID


@pytest.mark.parametrize("key_id", ["", "ed25519:", "ed25519:abc", "rsa:" + "A" * 43])
def test_a_key_id_naming_no_ed25519_key_is_refused(key_id: str) -> None:
    with pytest.raises(ValueError):
        public_key_of(key_id)


@settings(max_examples=30, deadline=None)
@given(integrity=_integrities, other=_integrities)
def test_a_signature_holds_for_its_integrity_alone(integrity: str, other: str) -> None:
    signature = sign_integrity(PUBLISHER, integrity)
    assert signature_valid(signature, integrity)
    assert signature_valid(signature, other) == (other == integrity)


@settings(max_examples=30, deadline=None)
@given(integrity=_integrities, flip=st.integers(0, 85))
@example(integrity="sha256:" + "0" * 64, flip=85)
def test_a_changed_signature_character_never_verifies(integrity: str, flip: int) -> None:
    signature = sign_integrity(PUBLISHER, integrity)
    text = signature.signature
    changed = text[:flip] + ("A" if text[flip] != "A" else "B") + text[flip + 1:]
    assert not signature_valid(replace(signature, signature=changed), integrity)


def test_a_signature_under_another_key_id_does_not_verify() -> None:
    tv = signed_script()
    rogue_id = publisher_key_id(ROGUE.public_key())
    assert not signature_valid(replace(tv.publisher_signature, key_id=rogue_id), tv.integrity)


def test_garbage_signatures_are_invalid_not_errors() -> None:
    integrity = script().integrity
    for signature in (PublisherSignature(PUBLISHER_ID, "!!"), PublisherSignature("x", "AA")):
        assert not signature_valid(signature, integrity)


@pytest.mark.parametrize(("tv", "verdict"), [
    (signed_script(), Verdict.TRUSTED),
    (script("acme_echo"), Verdict.UNSIGNED),
    (signed_script(key=ROGUE), Verdict.UNTRUSTED_KEY),
    (replace(signed_script(), integrity="sha256:" + "0" * 64), Verdict.INVALID),
    (signed_script("other_echo"), Verdict.NOT_COVERED),
])
def test_verdicts(tv, verdict: Verdict) -> None:
    assert ACME.verdict(tv.tool_id, tv.integrity, tv.publisher_signature) is verdict


def test_required_signatures_refuse_every_verdict_but_trusted_under_a_prefix() -> None:
    check_publisher(signed_script(), ACME)
    for tv, verdict in ((script("acme_echo"), "unsigned"),
                        (signed_script(key=ROGUE), "untrusted_key"),
                        (replace(signed_script(), integrity="sha256:" + "0" * 64), "invalid")):
        with pytest.raises(PublisherNotTrusted) as refused:
            check_publisher(tv, ACME)
        assert refused.value.code == "E3107"
        assert refused.value.details["verdict"] == verdict
        assert refused.value.details["tool_id"] == "acme_echo"


def test_tool_ids_no_prefix_covers_are_not_checked() -> None:
    check_chain_publishers([script("hello"), runtime(), primitive()], ACME)


def test_without_required_signatures_nothing_is_refused() -> None:
    relaxed = replace(ACME, required=False)
    check_chain_publishers([script("acme_echo"), signed_script(key=ROGUE)], relaxed)


def test_the_empty_prefix_covers_every_link_of_a_chain() -> None:
    everything = TrustStore.of({"": [PUBLISHER_ID]}, required=True)
    with pytest.raises(PublisherNotTrusted) as refused:
        check_chain_publishers([signed_script(), runtime(), primitive()], everything)
    assert refused.value.details["tool_id"] == "python_runtime"


def test_keys_of_every_matching_prefix_are_trusted() -> None:
    rogue_id = publisher_key_id(ROGUE.public_key())
    nested = TrustStore.of({"acme_": [PUBLISHER_ID], "acme_echo": [rogue_id]}, required=True)
    check_publisher(signed_script(key=ROGUE), nested)
    check_publisher(signed_script(), nested)
    with pytest.raises(PublisherNotTrusted):
        check_publisher(signed_script("acme_other", key=ROGUE), nested)


def test_a_signature_has_one_text_only() -> None:
    """The last base64url character of 64 bytes carries 2 unused bits: setting them
    decodes to the same bytes, and is refused all the same."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    integrity = script().integrity
    signature = sign_integrity(PUBLISHER, integrity)
    last = alphabet.index(signature.signature[-1])
    assert last % 4 == 0
    same_bytes = signature.signature[:-1] + alphabet[last + 1]
    assert not signature_valid(replace(signature, signature=same_bytes), integrity)
