"""Capability tokens sealed to the pipeline, and bound to the one command they ride on.

A request's invoke token and an approval decision's approver token travel in the
command's `captoken` extension on `toolexec.requests`, which more principals can read
than should hold the tokens (docs/broker-security.md). A producer that knows the
pipeline's X25519 public key seals the token instead of sending it:

    captoken = "sealed1." + identity + "." + base64url(sender key (32) || salt (16) || ciphertext)

The ciphertext is ChaCha20-Poly1305 under a key derived (HKDF-SHA256, the random salt)
from an X25519 exchange between the producer client's own key (made when it starts)
and the pipeline's key, with the command's binding as associated data: its type, id,
partition key and data exactly as sent, and `identity`. `identity` is the token's `sub`
and `jti` as a JWT payload segment (unverified, as ever), where the read models and
the audit trail read them. So a reader of the topic never sees the token, and a sealed
value copied onto another command (another invocation, decision, call hash or
approver) does not open: an approver's sealed token read off the topic cannot decide
any other waiting call. The same command written again is the same command (its id),
which the pipeline already treats as a repeat.

Sealing hides and binds; it does not authenticate the producer (anyone can seal to a
public key): the token inside is checked as ever (signature, lifetime, scopes).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections import OrderedDict
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from contracts.envelope import Envelope

PREFIX: Final = "sealed1."
INFO: Final = b"toolexec captoken seal v1"
_RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw
_NONCE: Final = bytes(12)
"""A constant nonce is safe: each seal's key is derived with a fresh random salt."""
SALT_BYTES: Final = 16
SENDERS_KEPT: Final = 4096
"""Producer keys whose exchange the pipeline keeps (one per producer client)."""


class SealBroken(ValueError):
    """The sealed token does not open: sealed to another command or another key, or
    not a sealed token at all."""


def is_sealed(value: str) -> bool:
    """Whether a `captoken` value is a sealed token (a JWT never starts so)."""
    return value.startswith(PREFIX)


def binding(envelope: Envelope) -> bytes:
    """What a sealed token is bound to: the command's type, id, partition key and data
    as its record carries it."""
    digest = hashlib.sha256()
    for part in (envelope.type, envelope.id, envelope.partitionkey):
        digest.update(part.encode())
        digest.update(b"\x00")
    digest.update(envelope.data.__pydantic_serializer__.to_json(envelope.data))
    return digest.digest()


class TokenSealer:
    """Seals tokens to the pipeline's key for one producer. Its X25519 key is made once
    (per producer client), so the exchange is done once and the pipeline caches it by
    the sender key: each seal then costs a key derivation with a fresh random salt (a
    key of its own, so the constant nonce is never reused) and one AEAD encryption."""

    def __init__(self, pipeline_key: X25519PublicKey) -> None:
        sender = X25519PrivateKey.generate()
        self._sender = sender.public_key().public_bytes(*_RAW)
        self._context = INFO + self._sender + pipeline_key.public_bytes(*_RAW)
        self._shared = sender.exchange(pipeline_key)

    def seal(self, token: str, envelope: Envelope) -> str:
        """`token` sealed and bound to `envelope` (the command it rides on, built
        already)."""
        salt = os.urandom(SALT_BYTES)
        identity = _identity(token)
        sealed = ChaCha20Poly1305(_key(self._shared, salt, self._context)).encrypt(
            _NONCE, token.encode(), binding(envelope) + identity.encode())
        return f"{PREFIX}{identity}.{_b64(self._sender + salt + sealed)}"


class TokenOpener:
    """Opens tokens sealed to this pipeline's X25519 key; the exchange with each
    producer's key is kept (bounded), so opening costs a key derivation and one AEAD
    decryption."""

    def __init__(self, private_key: X25519PrivateKey, capacity: int = SENDERS_KEPT) -> None:
        self._key = private_key
        self._public = private_key.public_key().public_bytes(*_RAW)
        self._shared: OrderedDict[bytes, bytes] = OrderedDict()
        self._capacity = capacity

    def open(self, value: str, envelope: Envelope) -> str:
        """The token sealed in `value` for `envelope`; raises SealBroken."""
        if not is_sealed(value):
            raise SealBroken("not a sealed token")
        identity, _, text = value[len(PREFIX):].partition(".")
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise SealBroken("the sealed token is not base64url") from None
        if len(raw) < 32 + SALT_BYTES + 16:
            raise SealBroken("the sealed token is too short")
        sender, salt, sealed = raw[:32], raw[32:32 + SALT_BYTES], raw[32 + SALT_BYTES:]
        try:
            key = _key(self._exchange(sender), salt, INFO + sender + self._public)
            return ChaCha20Poly1305(key).decrypt(_NONCE, sealed, binding(envelope)
                                                 + identity.encode()).decode()
        except (InvalidTag, ValueError):
            raise SealBroken("the token was sealed for another command or to another "
                             "key") from None

    def _exchange(self, sender: bytes) -> bytes:
        shared = self._shared.get(sender)
        if shared is None:
            shared = self._key.exchange(X25519PublicKey.from_public_bytes(sender))
            self._shared[sender] = shared
            if len(self._shared) > self._capacity:
                self._shared.popitem(last=False)
        return shared


def _identity(token: str) -> str:
    """The token's `sub` and `jti` as a JWT payload segment (base64url JSON), read
    unverified from it, for the read models and the audit trail; `e30` ({}) for a
    token that is no JWT."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        claims = {}
    shown = {k: claims[k] for k in ("sub", "jti")
             if isinstance(claims, dict) and isinstance(claims.get(k), str)}
    return _b64(json.dumps(shown, separators=(",", ":")).encode())


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _key(shared: bytes, salt: bytes, context: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=context).derive(shared)


def new_private_key() -> X25519PrivateKey:
    """A fresh pipeline sealing key."""
    return X25519PrivateKey.generate()


def private_pem(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def public_pem(key: X25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def load_private(pem: bytes) -> X25519PrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, X25519PrivateKey):
        raise ValueError("not an X25519 private key")
    return key


def load_public(pem: bytes) -> X25519PublicKey:
    key = serialization.load_pem_public_key(pem)
    if not isinstance(key, X25519PublicKey):
        raise ValueError("not an X25519 public key")
    return key

