"""Dev key pair, token issuing and JWKS loading (toolexec.keys)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from domain.capability import verify_token
from toolexec.keys import (
    ensure_dev_keys,
    issue_token,
    jwks_of,
    load_private_key,
    load_public_keys,
    verification_keys,
)
from toolexec.settings import Settings


def test_dev_keys_are_made_once_and_private_key_is_owner_only(tmp_path: Path) -> None:
    pair = ensure_dev_keys(tmp_path)
    first = pair.private.read_bytes()
    assert ensure_dev_keys(tmp_path).private.read_bytes() == first
    assert stat.S_IMODE(pair.private.stat().st_mode) == 0o600


def test_issued_token_verifies_with_pem_and_jwks(tmp_path: Path) -> None:
    pair = ensure_dev_keys(tmp_path)
    token = issue_token(load_private_key(pair.private), subject="did:a",
                        tools=[("py_echo", "^1")], ttl_seconds=60, now=1000, jti="j")
    pem_keys = load_public_keys([pair.public])
    jwks = tmp_path / "keys.json"
    jwks.write_text(json.dumps(jwks_of(pem_keys)))
    for keys in (pem_keys, load_public_keys([jwks])):
        capability = verify_token(token, keys, now=1001)
        assert (capability.subject, capability.tools) == ("did:a", (("py_echo", "^1"),))


def test_embedded_profile_accepts_the_dev_key(tmp_path: Path) -> None:
    ensure_dev_keys(tmp_path)
    settings = Settings(state_dir=tmp_path, user_tools_dir=None)
    assert len(verification_keys(settings)) == 1
