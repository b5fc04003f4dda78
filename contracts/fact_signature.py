"""Signatures of the pipeline's facts: who wrote a fact, and that it is unchanged.

The pipeline signs the facts it appends together (one produce batch: e.g. a chain
resolution, its permission decision and the first execution start) with one Ed25519
signature over the key id and the list of the batch's fact digests. A fact's digest
is the sha256 of its record as a CloudEvent in binary mode, canonically: its `ce_*`,
`content-type` and `toolexec-*` headers (but the three below) as `name=value` lines
sorted by name, a blank line, then the data bytes. Every fact of the batch carries three more
CloudEvent extensions (`ce_*` headers):

- `sigkid`: the signing key's id (the first 16 bytes of the sha256 of its raw public
  key, hex), so keys can be rotated and several be trusted at once;
- `sigset`: the digests (first 16 bytes, hex) of every fact of its batch, in order,
  joined by `.`;
- `sig`: the Ed25519 signature over `sigkid.sigset`, unpadded base64url.

A fact verifies when its own digest is in its `sigset` and the signature is valid for
a trusted key. One verification covers every fact of a batch (cached), so checking the
facts of an invocation costs about one Ed25519 verification per batch. Anyone holding
the public keys can check a record offline; nothing but the record is needed.

**Chained batches.** The pipeline's `sigset` ends with one more element after the
facts' digests: the *link* to the batch it signed before on the same partition (64
hex: the sha256 of that batch's `sigkid`, `sigset` and `sig` values joined by
newlines, `chain_link`). A link is no fact's digest (those are 32 hex), so a reader
that does not know links ignores it and checks each batch as above. A reader of many
batches at once (`FactVerifier.verify_all`: a rebuild reads a partition a fetch at a
time) checks the last batch of a chain and trusts every batch a valid batch links to:
the signature of that batch covers the link, and the link covers the earlier batch's
facts and signature. The verdicts are the ones `verify` gives record by record; a
chain of batches costs one Ed25519 verification instead of one per batch.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from enum import StrEnum
from typing import Any, Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from contracts.kafka_binding import (
    CE_PREFIX,
    CONTENT_TYPE_HEADER,
    WRITTEN_HEADER_NAMES,
    KafkaRecord,
)

KID: Final = "sigkid"
SET: Final = "sigset"
SIG: Final = "sig"
SIGNATURE_HEADERS: Final = frozenset({CE_PREFIX + KID, CE_PREFIX + SET, CE_PREFIX + SIG})
TOOLEXEC_PREFIX: Final = "toolexec-"
"""Transport headers of toolexec's own (the pipeline's resume point), signed too."""
DIGEST_HEX: Final = 32
LINK_HEX: Final = 64
CACHE_SIZE: Final = 20_000

_CHECKED: OrderedDict[tuple[str, str, str], bool] = OrderedDict()
"""Batch signatures checked in this process (key id, digests, signature -> valid),
shared by every verifier: in `up` the read models, the breakers' outcome counter and
the gateway's client each read the same facts, and a batch's Ed25519 verification is
the costliest part of reading one (measured: ~8 % of the stack's CPU under API load,
when each checked it again); a batch this process signed is known valid from the
start. A verdict depends on nothing else: the key id is a digest of the key itself,
and a verifier that does not trust that key answers UNKNOWN_KEY before asking. Each
operation on it is atomic under the GIL."""


def key_id(public_key: Ed25519PublicKey) -> str:
    """The id of `public_key`: 16 bytes of the sha256 of its raw bytes, hex."""
    return hashlib.sha256(_raw(public_key)).hexdigest()[:32]


def _raw(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def record_digest(headers: Iterable[tuple[str, Any]], value: bytes | None) -> str:
    """The digest of one record's CloudEvent (signature headers left out)."""
    if type(headers) is list:
        digest = _written_digest(headers, value)
        if digest is not None:
            return digest
    lines = sorted(f"{name}={_text(raw)}" for name, raw in headers
                   if (name[:3] == CE_PREFIX or name[:9] == TOOLEXEC_PREFIX
                       or name == CONTENT_TYPE_HEADER) and name not in SIGNATURE_HEADERS)
    body = "\n".join(lines).encode("utf-8") + b"\n\n" + (value or b"")
    return hashlib.sha256(body).hexdigest()[:DIGEST_HEX]


_LINE_HEADS: Final = {name: f"{name}=".encode("ascii") for name in WRITTEN_HEADER_NAMES
                      if name not in SIGNATURE_HEADERS}


def _written_digest(headers: list[tuple[str, Any]], value: bytes | None) -> str | None:
    """`record_digest` of headers as toolexec writes them (known names, ASCII bytes
    values), from the bytes without decoding them: for ASCII a line's UTF-8 bytes are
    its text's and sort alike. None for any other headers (the general reading).

    One comprehension and one check of the joined lines (a value that is not bytes
    leaves None in the list, which sorting or joining refuses): half the work of
    checking each header in a loop."""
    try:
        lines = [_LINE_HEADS[name] + raw if type(raw) is bytes else None
                 for name, raw in headers if name not in SIGNATURE_HEADERS]
        lines.sort()
        head = b"\n".join(lines)
    except (KeyError, TypeError, ValueError):  # other names, values or shapes
        return None
    if not head.isascii():
        return None
    return hashlib.sha256(b"".join((head, b"\n\n", value or b""))).hexdigest()[:DIGEST_HEX]


class FactSigner:
    """Signs batches of fact records with one Ed25519 key."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self.public_key = private_key.public_key()
        self.kid = key_id(self.public_key)
        # Signed by libsodium: the same (deterministic) signatures as OpenSSL's, in
        # 20 us against 32 on the bench machine; the pipeline signs every batch.
        self._key = SigningKey(private_key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
            serialization.NoEncryption()))

    def sign(self, records: Sequence[KafkaRecord], *, after: str | None = None
             ) -> list[KafkaRecord]:
        """`records` with the batch's signature headers (any earlier ones replaced),
        linked to the batch whose `chain_link` is `after`, if any."""
        records = [replace(r, headers=[h for h in r.headers if h[0] not in SIGNATURE_HEADERS])
                   for r in records]
        added = self.batch_headers([(r.headers, r.value) for r in records], after=after)
        return [replace(r, headers=[*r.headers, *added]) for r in records]

    def batch_headers(self, records: Sequence[tuple[list[tuple[str, bytes]], bytes | None]],
                      *, after: str | None = None) -> list[tuple[str, bytes]]:
        """The signature headers of a batch of (headers, value) records that carry no
        signature headers yet; each record of the batch gets all three. `after`: the
        `chain_link` of the batch signed before it on the same partition, if any."""
        digests = ".".join(record_digest(headers, value) for headers, value in records)
        if after is not None:
            digests = f"{digests}.{after}"
        signature = base64.urlsafe_b64encode(
            self._key.sign(_message(self.kid, digests)).signature).rstrip(b"=")
        _remember(self.kid, digests, signature.decode("ascii"), True)  # our own: valid
        return [(CE_PREFIX + KID, self.kid.encode()), (CE_PREFIX + SET, digests.encode()),
                (CE_PREFIX + SIG, signature)]


class Verdict(StrEnum):
    """How a record's signature checks out."""

    VALID = "valid"
    UNSIGNED = "unsigned"
    UNKNOWN_KEY = "unknown_key"
    INVALID = "invalid"


class FactVerifier:
    """Checks fact records against the pipeline's public keys (several: rotation).

    A batch signature is verified by libsodium (PyNaCl): 55 µs against OpenSSL's 106
    on the bench machine, and a rebuild checks one per batch of the whole log. It is
    the stricter of the two (it also refuses small-order points), which no signature
    made by the pipeline's key can hit."""

    def __init__(self, public_keys: Iterable[Ed25519PublicKey]) -> None:
        self._keys = {key_id(key): key for key in public_keys}
        self._verify_keys = {kid: VerifyKey(_raw(key)) for kid, key in self._keys.items()}

    @property
    def key_ids(self) -> frozenset[str]:
        return frozenset(self._keys)

    def raw_keys(self) -> tuple[bytes, ...]:
        """The trusted public keys as raw bytes (to hand to another process)."""
        return tuple(_raw(key) for key in self._keys.values())

    @classmethod
    def from_raw(cls, raw_keys: Iterable[bytes]) -> FactVerifier:
        """A verifier trusting the raw public keys `raw_keys` (see `raw_keys`)."""
        return cls(Ed25519PublicKey.from_public_bytes(raw) for raw in raw_keys)

    def verify(self, headers: Iterable[tuple[str, Any]], value: bytes | None) -> Verdict:
        """The verdict on the record with `headers` and `value`."""
        batch = self._batch_of(list(headers), value)
        if isinstance(batch, Verdict):
            return batch
        return Verdict.VALID if self._batch_valid(self._verify_keys[batch[0]], *batch) \
            else Verdict.INVALID

    def _batch_of(self, headers: list[tuple[str, Any]], value: bytes | None
                  ) -> Verdict | tuple[str, str, str]:
        """The record's batch (key id, digests, signature) when only the batch's
        signature is left to check; otherwise the record's verdict."""
        kid, digests, signature = _signature_values(headers)
        if kid is None and digests is None and signature is None:
            return Verdict.UNSIGNED
        if not (kid and digests and signature):
            return Verdict.INVALID
        if kid not in self._verify_keys:
            return Verdict.UNKNOWN_KEY
        if record_digest(headers, value) not in digests.split("."):
            return Verdict.INVALID
        return kid, digests, signature

    def verify_all(self, records: Sequence[Any]) -> list[Verdict]:
        """The verdicts on `records` (each with `headers` and `value`, e.g. one fetch's
        records of a partition): those `verify` gives each, with one Ed25519
        verification per chain of linked batches among them rather than per batch.
        (A trusted key links only to batches it signed itself: the signer keeps the
        link of its last batch, it never takes one from the log.)"""
        verdicts: list[Verdict] = []
        batches: dict[tuple[str, str, str], list[int]] = {}
        for index, record in enumerate(records):
            headers = record.headers if type(record.headers) is list else list(record.headers)
            batch = self._batch_of(headers, record.value)
            if isinstance(batch, Verdict):
                verdicts.append(batch)
            else:
                verdicts.append(Verdict.VALID)  # if its batch is: settled below
                batches.setdefault(batch, []).append(index)
        for batch, valid in self._batches_valid(list(batches)).items():
            if not valid:
                for index in batches[batch]:
                    verdicts[index] = Verdict.INVALID
        return verdicts

    def _batches_valid(self, batches: list[tuple[str, str, str]]
                       ) -> dict[tuple[str, str, str], bool]:
        """Whether each batch (key id, digests, signature; the key trusted) is validly
        signed. From the last batch back: a batch a valid batch links to is valid
        without a verification of its own; any other is verified (or known)."""
        by_link = {chain_link(*batch): batch for batch in batches} if len(batches) > 1 else {}
        valid: dict[tuple[str, str, str], bool] = {}
        for batch in reversed(batches):
            if batch in valid:
                continue
            kid, digests, signature = batch
            valid[batch] = self._batch_valid(self._verify_keys[kid], kid, digests, signature)
            vouching = [batch] if valid[batch] else []
            while vouching:
                for element in vouching.pop()[1].split("."):
                    earlier = by_link.get(element) if len(element) == LINK_HEX else None
                    if earlier is not None and earlier not in valid:
                        valid[earlier] = True
                        _remember(*earlier, True)
                        vouching.append(earlier)
        return valid

    def _batch_valid(self, key: VerifyKey, kid: str, digests: str, signature: str) -> bool:
        cache_key = (kid, digests, signature)
        known = _CHECKED.get(cache_key)
        if known is not None:
            return known
        try:
            raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
            key.verify(_message(kid, digests), raw)
            valid = True
        except (BadSignatureError, binascii.Error, ValueError, TypeError):
            valid = False
        _remember(kid, digests, signature, valid)
        return valid


_TAIL: Final = (CE_PREFIX + KID, CE_PREFIX + SET, CE_PREFIX + SIG)
"""The signature headers in the order `FactSigner` appends them, last of a record."""


def _signature_values(headers: list[tuple[str, Any]]) -> tuple[str | None, ...]:
    """(key id, digests, signature) as text: the last value of each signature header
    (None where there is none). A record as the pipeline writes it ends with the three,
    in `_TAIL`'s order: the last of each, read without walking the other headers."""
    if len(headers) >= 3:
        tail = headers[-3:]
        (kid, raw_kid), (digests, raw_digests), (sig, raw_sig) = tail
        if (kid, digests, sig) == _TAIL and type(raw_kid) is bytes \
                and type(raw_digests) is bytes and type(raw_sig) is bytes:
            return (raw_kid.decode("ascii", "replace"), raw_digests.decode("ascii", "replace"),
                    raw_sig.decode("ascii", "replace"))
    found: dict[str, str] = {}
    for name, raw in headers:
        if name in SIGNATURE_HEADERS:
            found[name] = raw.decode("ascii", "replace") if isinstance(raw, bytes | bytearray) \
                else str(raw)
    return tuple(found.get(name) for name in _TAIL)


def chain_link(kid: str | bytes, digests: str | bytes, signature: str | bytes) -> str:
    """The link to a signed batch (its `sigkid`, `sigset` and `sig` values) that the
    next batch of the same signer on the same partition carries in its `sigset`."""
    parts = [part if isinstance(part, bytes) else part.encode("utf-8")
             for part in (kid, digests, signature)]
    return hashlib.sha256(b"\n".join(parts)).hexdigest()


def batch_link(signature_headers: Sequence[tuple[str, bytes]]) -> str:
    """`chain_link` of the batch whose signature headers (`FactSigner.batch_headers`)
    are `signature_headers`."""
    values = dict(signature_headers)
    return chain_link(values[CE_PREFIX + KID], values[CE_PREFIX + SET], values[CE_PREFIX + SIG])


def forget_checked() -> None:
    """Forget every batch verdict this process holds (a measurement's cold start: a
    reader in another process has checked none of the batches this one signed)."""
    _CHECKED.clear()


def _remember(kid: str, digests: str, signature: str, valid: bool) -> None:
    _CHECKED[(kid, digests, signature)] = valid
    while len(_CHECKED) > CACHE_SIZE:
        with contextlib.suppress(KeyError):  # another thread emptied it meanwhile
            _CHECKED.popitem(last=False)


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes | bytearray) else str(raw)


def _message(kid: str, digests: str) -> bytes:
    return f"{kid}.{digests}".encode("ascii")
