"""Publisher signatures: who vouches for a tool version, and whether resolution trusts it.

A publisher signs a version's canonical integrity (`domain.integrity`) with an Ed25519
key; the signature travels in `tool.published` with the key's id. The key id *is* the
public key (`ed25519:` + its 32 raw bytes, unpadded base64url), so anyone can check a
signature from the record alone; trusting it is a separate decision, the trust store's.

The signed message is `toolexec.tool.published/v1\\n` + the integrity, so a signature
made for a tool version can never be replayed as another kind of signature.

A trust store maps tool id prefixes to the key ids trusted for them. With signatures
required, a version whose tool id starts with a listed prefix resolves only when it
carries a valid signature by a key trusted for one of the prefixes it matches
(`check_publisher`, E3107); a tool id no prefix matches is not checked (built-ins).
"""

from __future__ import annotations

import base64
import binascii
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from domain.bounded import remember
from domain.errors import PublisherNotTrusted
from domain.model import PublisherSignature, ToolVersion

KEY_ID_PREFIX: Final = "ed25519:"
MESSAGE_PREFIX: Final = b"toolexec.tool.published/v1\n"
_CHECKED_LIMIT: Final = 4096


def publisher_key_id(public_key: Ed25519PublicKey) -> str:
    """The key id of `public_key`: `ed25519:` + its raw bytes, unpadded base64url."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return KEY_ID_PREFIX + _b64(raw)


def public_key_of(key_id: str) -> Ed25519PublicKey:
    """The public key a key id names; ValueError when it names none."""
    if not key_id.startswith(KEY_ID_PREFIX):
        raise ValueError(f"a publisher key id starts with {KEY_ID_PREFIX!r}")
    try:
        return Ed25519PublicKey.from_public_bytes(_unb64(key_id[len(KEY_ID_PREFIX):]))
    except (binascii.Error, ValueError) as error:
        raise ValueError(f"{key_id!r} is not an Ed25519 public key: {error}") from None


def signed_message(integrity: str) -> bytes:
    """The bytes a publisher signs for the version with `integrity`."""
    return MESSAGE_PREFIX + integrity.encode("ascii")


def sign_integrity(private_key: Ed25519PrivateKey, integrity: str) -> PublisherSignature:
    """The publisher signature of `private_key` over `integrity`."""
    return PublisherSignature(key_id=publisher_key_id(private_key.public_key()),
                              signature=_b64(private_key.sign(signed_message(integrity))))


_checked: OrderedDict[tuple[str, str, str], bool] = OrderedDict()


def signature_valid(signature: PublisherSignature, integrity: str) -> bool:
    """Whether `signature` is its key's valid signature over `integrity` (remembered)."""
    cache_key = (signature.key_id, signature.signature, integrity)
    known = _checked.get(cache_key)
    if known is not None:
        return known
    try:
        raw = _unb64(signature.signature)
        # one text per signature: base64's unused trailing bits may not vary
        if _b64(raw) != signature.signature:
            raise ValueError("signature is not canonical base64url")
        public_key_of(signature.key_id).verify(raw, signed_message(integrity))
        valid = True
    except (InvalidSignature, binascii.Error, ValueError):
        valid = False
    remember(_checked, cache_key, valid, _CHECKED_LIMIT)
    return valid


class Verdict(StrEnum):
    """What the trust store says of one version's publisher."""

    TRUSTED = "trusted"
    UNSIGNED = "unsigned"
    INVALID = "invalid"
    UNTRUSTED_KEY = "untrusted_key"
    NOT_COVERED = "not_covered"
    """Signed validly, but no prefix of the trust store covers the tool id."""


@dataclass(frozen=True)
class TrustStore:
    """Trusted publisher key ids per tool id prefix ("" covers every tool), and
    whether resolution requires a trusted signature where a prefix matches."""

    prefixes: Mapping[str, frozenset[str]] = field(default_factory=dict)
    required: bool = False

    @classmethod
    def of(cls, prefixes: Mapping[str, Iterable[str]], *, required: bool) -> TrustStore:
        return cls({prefix: frozenset(ids) for prefix, ids in prefixes.items()}, required)

    def covers(self, tool_id: str) -> bool:
        """Whether some prefix matches `tool_id`."""
        return any(tool_id.startswith(prefix) for prefix in self.prefixes)

    def trusted_keys(self, tool_id: str) -> frozenset[str]:
        """Every key id trusted for `tool_id` (the union over its matching prefixes)."""
        return frozenset().union(*(ids for prefix, ids in self.prefixes.items()
                                   if tool_id.startswith(prefix)))

    def verdict(self, tool_id: str, integrity: str,
                signature: PublisherSignature | None) -> Verdict:
        """The verdict on the publisher `signature` of the version of `tool_id` with
        `integrity`."""
        if signature is None:
            return Verdict.UNSIGNED
        if not signature_valid(signature, integrity):
            return Verdict.INVALID
        if not self.covers(tool_id):
            return Verdict.NOT_COVERED
        if signature.key_id not in self.trusted_keys(tool_id):
            return Verdict.UNTRUSTED_KEY
        return Verdict.TRUSTED


NO_TRUST_STORE: Final = TrustStore()

_REASONS: Final = {
    Verdict.UNSIGNED: "is not signed by its publisher",
    Verdict.INVALID: "carries a publisher signature that does not match its integrity",
    Verdict.UNTRUSTED_KEY: "is signed by a key the trust store does not trust for it",
}


def check_publisher(tv: ToolVersion, trust: TrustStore) -> None:
    """Refuse (PublisherNotTrusted, E3107) a version the trust store requires signed
    and that is not signed by a key trusted for its tool id."""
    if not trust.required or not trust.covers(tv.tool_id):
        return
    verdict = trust.verdict(tv.tool_id, tv.integrity, tv.publisher_signature)
    if verdict is Verdict.TRUSTED:
        return
    signature = tv.publisher_signature
    raise PublisherNotTrusted(
        f"{tv.tool_id}@{tv.version} {_REASONS[verdict]}; trusted publisher signatures are "
        "required for this tool id",
        details={"tool_id": tv.tool_id, "version": tv.version, "integrity": tv.integrity,
                 "verdict": verdict.value,
                 "key_id": None if signature is None else signature.key_id})


def check_chain_publishers(links: Iterable[ToolVersion], trust: TrustStore) -> None:
    """`check_publisher` on every link of a chain, leaf first."""
    if not trust.required:
        return
    for tv in links:
        check_publisher(tv, trust)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
