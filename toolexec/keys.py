"""Capability-token keys: the embedded dev key pair, signing, and verification keys.

The embedded profile makes an RSA key pair under `<state_dir>/keys/` on first start
(`private.pem` mode 0600, `public.pem`), so `toolexec token issue` works with no setup
and `toolexec up` accepts the tokens it signs. Verification keys are read from PEM
files or JWKS files (`{"keys": [...]}`, `.json`/`.jwks`), every file listed in
`TOOLEXEC_TOKEN_PUBLIC_KEYS` (rotation: list old and new), plus the dev public key
in the embedded profile.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from contracts import token_seal
from domain.capability import ALGORITHM, TokenLifetime
from domain.errors import InvalidRequest
from domain.publisher_signature import (
    KEY_ID_PREFIX,
    TrustStore,
    public_key_of,
    publisher_key_id,
)
from domain.scopes import NO_SCOPES, Scopes
from toolexec.settings import Settings
from toolexec.state_files import ensure_state_dir

KEY_BITS = 2048


@dataclass(frozen=True)
class KeyPair:
    """Paths of a PEM key pair."""

    private: Path
    public: Path


def dev_key_pair(state_dir: Path) -> KeyPair:
    return KeyPair(state_dir / "keys" / "private.pem", state_dir / "keys" / "public.pem")


def ensure_dev_keys(state_dir: Path) -> KeyPair:
    """The embedded profile's key pair, created on first call."""
    pair = dev_key_pair(state_dir)
    if pair.private.exists() and pair.public.exists():
        return pair
    ensure_state_dir(state_dir)
    pair.private.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)
    private_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    fd = os.open(pair.private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private_pem)
    pair.public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pair


def load_private_key(path: Path) -> Any:
    return serialization.load_pem_private_key(path.read_bytes(), password=None)


def load_public_keys(paths: Iterable[Path]) -> list[Any]:
    """RSA public keys from PEM files and JWKS files (every RSA key of a set). A file
    is parsed again only when its size or modification time changed (rotation)."""
    keys: list[Any] = []
    for path in paths:
        stat = path.stat()
        cache_key = (str(path), stat.st_mtime_ns, stat.st_size)
        loaded = _LOADED.get(cache_key)
        if loaded is None:
            loaded = _LOADED[cache_key] = _parse_public_keys(path.read_bytes())
        keys.extend(loaded)
    return keys


_LOADED: dict[tuple[str, int, int], list[Any]] = {}


def _parse_public_keys(raw: bytes) -> list[Any]:
    if raw.lstrip().startswith(b"{"):
        document = json.loads(raw)
        entries = document.get("keys", [document])
        return [jwt.PyJWK(entry, algorithm=ALGORITHM).key for entry in entries
                if entry.get("kty") == "RSA"]
    return [serialization.load_pem_public_key(raw)]


def verification_keys(settings: Settings) -> list[Any]:
    """Keys accepted for capability tokens: the configured files, plus the dev public
    key in the embedded profile when it exists. Read on each call (rotation)."""
    paths = list(settings.token_public_keys)
    dev = dev_key_pair(Path(settings.state_dir)).public
    if settings.embedded and dev.exists():
        paths.append(dev)
    return load_public_keys(paths)


def token_lifetime(settings: Settings) -> TokenLifetime:
    """The lifetime bounds every token check of this process applies."""
    return TokenLifetime(max_ttl_seconds=settings.token_max_ttl_seconds,
                         clock_skew_seconds=settings.token_clock_skew_seconds)


def issue_token(private_key: Any, *, subject: str, tools: Sequence[tuple[str, str]],
                ttl_seconds: int, now: int, jti: str | None = None,
                scopes: Scopes = NO_SCOPES) -> str:
    """Sign an RS256 capability token granting `tools` [(tool_id, version_range)] to
    invoke and `scopes` (publish, lifecycle, approve, policy, audit, admin)."""
    claims: dict[str, Any] = {
        "sub": subject, "iat": now, "exp": now + ttl_seconds, "jti": jti or str(uuid.uuid4()),
        "tools": [{"tool_id": tool_id, "version_range": version_range}
                  for tool_id, version_range in tools],
    }
    if not scopes.empty:
        claims["scopes"] = scopes.to_claim()
    return jwt.encode(claims, private_key, algorithm=ALGORITHM)


def jwks_of(public_keys: Iterable[Any]) -> dict[str, Any]:
    """A JWKS document of RSA public keys (for publishing the verification keys)."""
    entries = []
    for key in public_keys:
        entry = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key))
        entries.append({**entry, "alg": ALGORITHM, "use": "sig"})
    return {"keys": entries}


# --- the pipeline's fact-signing keys ---------------------------------------------------


def facts_key_path(state_dir: Path) -> Path:
    """Where the embedded profile keeps the pipeline's Ed25519 fact-signing key."""
    return state_dir / "keys" / "facts.pem"


def fact_signing_key(settings: Settings) -> ed25519.Ed25519PrivateKey:
    """The key this pipeline signs its facts with: `TOOLEXEC_FACT_SIGNING_KEY` (a PEM
    file), else (embedded) one made under the state directory on first use (0600)."""
    if settings.fact_signing_key is None and not settings.embedded:
        raise ValueError("TOOLEXEC_FACT_SIGNING_KEY is required with TOOLEXEC_KAFKA_BOOTSTRAP: "
                         "every pipeline replica signs its facts with the Ed25519 key it "
                         "names (one key shared by the replicas, or each one's public key "
                         "in TOOLEXEC_FACT_PUBLIC_KEYS)")
    path = settings.fact_signing_key or facts_key_path(Path(settings.state_dir))
    if settings.fact_signing_key is None and not path.exists():
        _write_private(path, ed25519.Ed25519PrivateKey.generate(), Path(settings.state_dir))
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ValueError(f"{path} does not hold an Ed25519 private key")
    return key


def fact_verify_keys(settings: Settings) -> list[ed25519.Ed25519PublicKey]:
    """Public keys whose fact signatures are trusted: `TOOLEXEC_FACT_PUBLIC_KEYS` (PEM
    files: list old and new while rotating), the signing key's own when this process
    has one, and the embedded state directory's."""
    keys: list[ed25519.Ed25519PublicKey] = []
    for path in settings.fact_public_keys:
        key = serialization.load_pem_public_key(path.read_bytes())
        if not isinstance(key, ed25519.Ed25519PublicKey):
            raise ValueError(f"{path} does not hold an Ed25519 public key")
        keys.append(key)
    private_paths = [settings.fact_signing_key] if settings.fact_signing_key else []
    embedded = facts_key_path(Path(settings.state_dir))
    if settings.embedded and embedded.exists():
        private_paths.append(embedded)
    for path in private_paths:
        with contextlib.suppress(OSError, ValueError):
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
            if isinstance(key, ed25519.Ed25519PrivateKey):
                keys.append(key.public_key())
    return keys


# --- the pipeline's token-sealing key ------------------------------------------------


def token_seal_key_path(state_dir: Path) -> Path:
    """Where the embedded profile keeps the pipeline's X25519 token-sealing key."""
    return state_dir / "keys" / "token-seal.pem"


def token_opener(settings: Settings) -> token_seal.TokenOpener | None:
    """What opens the tokens sealed to this pipeline: `TOOLEXEC_TOKEN_SEAL_KEY`, else
    (embedded) a key made under the state directory on first use (0600); None in
    production without the setting (tokens then travel unsealed)."""
    path = settings.token_seal_key
    if path is None:
        if not settings.embedded:
            return None
        path = token_seal_key_path(Path(settings.state_dir))
        if not path.exists():
            with contextlib.suppress(FileExistsError):  # another process made it first
                _write_private(path, token_seal.new_private_key(), Path(settings.state_dir))
    return token_seal.TokenOpener(token_seal.load_private(path.read_bytes()))


def token_seal_public_key(settings: Settings) -> X25519PublicKey | None:
    """The key producers seal tokens to: `TOOLEXEC_TOKEN_SEAL_PUBLIC_KEY`, else that of
    `TOOLEXEC_TOKEN_SEAL_KEY` or of the embedded state directory's key; None if none."""
    if settings.token_seal_public_key is not None:
        return token_seal.load_public(settings.token_seal_public_key.read_bytes())
    path = settings.token_seal_key
    if path is None and settings.embedded:
        path = token_seal_key_path(Path(settings.state_dir))
    if path is None or not path.exists():
        return None
    return token_seal.load_private(path.read_bytes()).public_key()


# --- publisher keys ------------------------------------------------------------------


@dataclass(frozen=True)
class PublisherKeys:
    """A publisher key pair written by `toolexec keys new`, and its key id."""

    private: Path
    public: Path
    key_id: str


def new_publisher_keys(private: Path) -> PublisherKeys:
    """Make an Ed25519 publisher key pair: `private` (PEM, 0600; refused when it
    exists) and `<private>.pub` beside it (PEM public key, to hand to operators)."""
    key = ed25519.Ed25519PrivateKey.generate()
    public = private.with_name(private.name + ".pub")
    for path in (private, public):
        if path.exists():
            raise FileExistsError(f"{path} exists: a key is never overwritten")
    _write_private_file(private, key)
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return PublisherKeys(private, public, publisher_key_id(key.public_key()))


def load_publisher_private_key(path: Path) -> ed25519.Ed25519PrivateKey:
    """The Ed25519 private key in the PEM file `path` (ValueError otherwise)."""
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ValueError(f"{path} does not hold an Ed25519 private key")
    return key


def publisher_key_id_of(entry: str) -> str:
    """A trust store entry as a key id: a key id (`ed25519:...`) as it is, or the path
    of a PEM public key file. ValueError when it is neither."""
    if entry.startswith(KEY_ID_PREFIX):
        public_key_of(entry)
        return entry
    key = serialization.load_pem_public_key(Path(entry).read_bytes())
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ValueError(f"{entry} does not hold an Ed25519 public key")
    return publisher_key_id(key)


def trust_store(settings: Settings) -> TrustStore:
    """The trust store of `settings`: `trusted_publishers` (prefix -> key ids or PEM
    files) and `require_signatures`. InvalidRequest (E3004) naming an entry that is no
    Ed25519 public key."""
    prefixes: dict[str, list[str]] = {}
    for prefix, entries in settings.trusted_publishers.items():
        for entry in entries:
            try:
                prefixes.setdefault(prefix, []).append(publisher_key_id_of(entry))
            except (OSError, ValueError) as error:
                raise InvalidRequest(
                    f"TOOLEXEC_TRUSTED_PUBLISHERS[{prefix!r}]: {entry!r} is neither a "
                    f"publisher key id nor an Ed25519 public key file: {error}",
                    details={"prefix": prefix, "entry": entry}) from None
    return TrustStore.of(prefixes, required=settings.require_signatures)


def _write_private(path: Path, key: Any, state_dir: Path) -> None:
    ensure_state_dir(state_dir)
    _write_private_file(path, key)


def _write_private_file(path: Path, key: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)


def callback_key_path(state_dir: Path) -> Path:
    """Where a state directory keeps the key callbacks are signed with."""
    return state_dir / "keys" / "callback.key"


def callback_secret(settings: Settings) -> bytes:
    """The HMAC key of callbacks: `TOOLEXEC_CALLBACK_SECRET_FILE`'s content (surrounding
    whitespace dropped), else one made under the state directory on first use (0600,
    64 hex characters; give receivers that file's content)."""
    path = settings.callback_secret_file or callback_key_path(Path(settings.state_dir))
    if settings.callback_secret_file is None and not path.exists():
        ensure_state_dir(Path(settings.state_dir))
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileExistsError):  # another process made it first
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(32) + "\n")
    secret = path.read_bytes().strip()
    if len(secret) < 16:
        raise ValueError(f"{path}: a callback secret needs at least 16 bytes")
    return secret
