from __future__ import annotations

import base64
import hashlib
import hmac
import json

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from domain.capability import authorise, verify_token
from domain.errors import AuthorizationError

NOW = 1_800_000_000


@pytest.fixture(scope="module")
def keys() -> tuple[rsa.RSAPrivateKey, rsa.RSAPublicKey]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return private, private.public_key()


def _token(private: rsa.RSAPrivateKey, **overrides: object) -> str:
    claims = {"sub": "did:example:agent", "iat": NOW - 10, "exp": NOW + 300, "jti": "j-1",
              "tools": [{"tool_id": "hello", "version_range": "^1.0.0"}]}
    claims.update(overrides)
    claims = {k: v for k, v in claims.items() if v is not None}
    return jwt.encode(claims, private, algorithm="RS256")


def _code(call: object) -> str:
    with pytest.raises(AuthorizationError) as caught:
        call()  # type: ignore[operator]
    return caught.value.code


def test_valid_token_grants_tool_in_range(keys) -> None:
    private, public = keys
    capability = authorise(_token(private), [public], tool_id="hello", version="1.2.0", now=NOW)
    assert capability.subject == "did:example:agent"
    assert capability.jti == "j-1"


def test_expired_token_is_E3201(keys) -> None:
    private, public = keys
    assert _code(lambda: verify_token(_token(private, exp=NOW - 1), [public], now=NOW)) == "E3201"


def test_token_signed_by_another_key_is_E3202(keys) -> None:
    _, public = keys
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert _code(lambda: verify_token(_token(other), [public], now=NOW)) == "E3202"


def test_rotated_keys_accept_either_signer(keys) -> None:
    private, public = keys
    old = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert verify_token(_token(old), [public, old.public_key()], now=NOW).jti == "j-1"


def test_garbage_is_malformed_E3203(keys) -> None:
    _, public = keys
    assert _code(lambda: verify_token("not.a.jwt", [public], now=NOW)) == "E3203"


def test_missing_token_is_refused_like_a_malformed_one(keys) -> None:
    _, public = keys
    assert _code(lambda: authorise(None, [public], tool_id="hello", version="1.0.0",
                                   now=NOW)) == "E3203"


def test_tool_outside_the_token_is_E3204(keys) -> None:
    private, public = keys
    assert _code(lambda: authorise(_token(private), [public], tool_id="hello", version="2.0.0",
                                   now=NOW)) == "E3204"
    assert _code(lambda: authorise(_token(private), [public], tool_id="other", version="1.0.0",
                                   now=NOW)) == "E3204"


def test_alg_none_is_rejected(keys) -> None:
    _, public = keys
    header = base64.urlsafe_b64encode(json.dumps({"alg": "none", "typ": "JWT"}).encode()).rstrip(b"=")
    body = base64.urlsafe_b64encode(json.dumps(
        {"sub": "x", "exp": NOW + 60, "iat": NOW, "jti": "j", "tools": []}).encode()).rstrip(b"=")
    token = f"{header.decode()}.{body.decode()}."
    assert _code(lambda: verify_token(token, [public], now=NOW)) == "E3203"


def test_hs256_with_the_public_key_as_secret_is_rejected(keys) -> None:
    _, public = keys
    pem = public.public_bytes(serialization.Encoding.PEM,
                              serialization.PublicFormat.SubjectPublicKeyInfo)
    header = base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()).rstrip(b"=")
    body = base64.urlsafe_b64encode(json.dumps(
        {"sub": "x", "exp": NOW + 60, "iat": NOW, "jti": "j",
         "tools": [{"tool_id": "hello"}]}).encode()).rstrip(b"=")
    signing_input = header + b"." + body
    sig = base64.urlsafe_b64encode(hmac.new(pem, signing_input, hashlib.sha256).digest()).rstrip(b"=")
    forged = (signing_input + b"." + sig).decode()
    assert _code(lambda: verify_token(forged, [public], now=NOW)) == "E3203"


def test_token_without_exp_is_rejected(keys) -> None:
    private, public = keys
    assert _code(lambda: verify_token(_token(private, exp=None), [public], now=NOW)) == "E3203"


def test_a_token_seen_before_is_not_verified_again(keys) -> None:
    from domain.capability import VerifiedTokens

    private, public = keys
    verified = VerifiedTokens()
    token = _token(private)
    for _ in range(3):
        authorise(token, [public], tool_id="hello", version="1.0.0", now=NOW, verified=verified)
    assert (verified.misses, verified.hits) == (1, 2)


def test_a_cached_token_still_expires_and_still_names_its_tools(keys) -> None:
    from domain.capability import VerifiedTokens

    private, public = keys
    verified = VerifiedTokens()
    token = _token(private)
    verified.verify(token, [public], now=NOW)
    assert _code(lambda: verified.verify(token, [public], now=NOW + 301)) == "E3201"
    assert _code(lambda: authorise(token, [public], tool_id="other", version="1.0.0", now=NOW,
                                   verified=verified)) == "E3204"


def test_a_rotated_key_set_verifies_cached_tokens_again(keys) -> None:
    from domain.capability import VerifiedTokens

    private, public = keys
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    verified = VerifiedTokens()
    token = _token(private)
    verified.verify(token, [public], now=NOW)
    # The signing key was retired: the cached verification does not carry over.
    assert _code(lambda: verified.verify(token, [other], now=NOW)) == "E3202"
    # A forged token never enters the cache.
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    assert _code(lambda: verified.verify(forged, [public], now=NOW)) in ("E3202", "E3203")
    assert verified.misses == 3 and verified.hits == 0


# --- lifetime ---------------------------------------------------------------------------


def test_a_token_living_far_beyond_the_maximum_is_refused(keys) -> None:
    private, public = keys
    assert _code(lambda: verify_token(_token(private, exp=1e30), [public], now=NOW)) == "E3203"
    day_and_a_bit = _token(private, iat=NOW, exp=NOW + 24 * 3600 + 1)
    assert _code(lambda: verify_token(day_and_a_bit, [public], now=NOW)) == "E3203"
    assert verify_token(_token(private, iat=NOW, exp=NOW + 24 * 3600), [public], now=NOW)


def test_the_maximum_lifetime_is_a_setting(keys) -> None:
    from domain.capability import TokenLifetime

    private, public = keys
    hour = TokenLifetime(max_ttl_seconds=3600)
    token = _token(private, iat=NOW, exp=NOW + 7200)
    assert _code(lambda: verify_token(token, [public], now=NOW, lifetime=hour)) == "E3203"


def test_a_token_issued_in_the_future_is_refused_beyond_the_clock_skew(keys) -> None:
    private, public = keys
    later = _token(private, iat=NOW + 3600, exp=NOW + 7200)
    assert _code(lambda: verify_token(later, [public], now=NOW)) == "E3203"
    skewed = _token(private, iat=NOW + 30, exp=NOW + 300)
    assert verify_token(skewed, [public], now=NOW).issued_at == NOW + 30


def test_a_token_not_valid_yet_is_refused(keys) -> None:
    private, public = keys
    assert _code(lambda: verify_token(_token(private, nbf=NOW + 600), [public], now=NOW)) \
        == "E3203"


@pytest.mark.parametrize("claim", ["exp", "iat"])
def test_times_must_be_finite_numbers(keys, claim: str) -> None:
    private, public = keys
    for value in ("soon", True):
        assert _code(lambda v=value: verify_token(_token(private, **{claim: v}), [public],
                                                  now=NOW)) == "E3203"


def test_the_pipelines_cache_applies_its_lifetime(keys) -> None:
    from domain.capability import TokenLifetime, VerifiedTokens

    private, public = keys
    verified = VerifiedTokens(lifetime=TokenLifetime(max_ttl_seconds=60))
    assert _code(lambda: authorise(_token(private), [public], tool_id="hello", version="1.0.0",
                                   now=NOW, verified=verified)) == "E3203"


# --- scopes -----------------------------------------------------------------------------


def test_a_token_with_only_tools_may_only_invoke(keys) -> None:
    from domain.capability import authorise_action
    from domain.scopes import POLICY_NEED, publish_need

    private, public = keys
    token = _token(private)
    assert authorise(token, [public], tool_id="hello", version="1.0.0", now=NOW)
    for need in (publish_need("hello", "script"), POLICY_NEED):
        assert _code(lambda n=need: authorise_action(token, [public], n, now=NOW)) == "E3206"


def test_scopes_grant_what_they_name_and_nothing_else(keys) -> None:
    from domain.capability import authorise_action
    from domain.scopes import AUDIT_NEED, lifecycle_need, publish_need

    private, public = keys
    token = _token(private, tools=[], scopes={"publish": ["acme_*"], "audit": True})
    capability = authorise_action(token, [public], publish_need("acme_fetch", "script"), now=NOW)
    assert capability.reads_everything and capability.grants(AUDIT_NEED)
    assert _code(lambda: authorise_action(token, [public], lifecycle_need("acme_fetch"),
                                          now=NOW)) == "E3206"
    assert _code(lambda: authorise(token, [public], tool_id="acme_fetch", version="1.0.0",
                                   now=NOW)) == "E3204"


def test_malformed_scopes_are_a_malformed_token(keys) -> None:
    private, public = keys
    token = _token(private, scopes={"publish": "everything"})
    assert _code(lambda: verify_token(token, [public], now=NOW)) == "E3203"


def test_issued_tokens_carry_their_scopes(keys) -> None:
    from domain.scopes import Scopes
    from toolexec.keys import issue_token

    private, public = keys
    scopes = Scopes(lifecycle=("acme_*",), policy=True)
    token = issue_token(private, subject="did:ops", tools=[], ttl_seconds=60, now=NOW,
                        scopes=scopes)
    assert verify_token(token, [public], now=NOW).scopes == scopes
