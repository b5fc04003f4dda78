"""Callback URLs the operator allows, and the HMAC signature a receiver verifies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.callbacks import (
    check_callback_addresses,
    check_callback_url,
    signature,
    verify_signature,
)
from domain.errors import InvalidRequest, NetworkPolicyViolation

HOSTS = ("hooks.example.com", "*.example.org", "127.0.0.1")


def test_a_listed_host_is_allowed_with_its_port() -> None:
    target = check_callback_url("https://hooks.example.com/done?x=1", HOSTS)
    assert (target.host, target.port, target.listed_exactly) == ("hooks.example.com", 443, True)
    assert check_callback_url("http://a.example.org:8080/", HOSTS).port == 8080
    assert not check_callback_url("http://a.example.org/", HOSTS).listed_exactly


@pytest.mark.parametrize("url", ["https://evil.example.net/", "http://example.org/",
                                 "http://10.0.0.1/", "http://localhost/"])
def test_a_host_not_listed_is_refused_with_E3406(url: str) -> None:
    with pytest.raises(NetworkPolicyViolation) as refused:
        check_callback_url(url, HOSTS)
    assert refused.value.code == "E3406"


@pytest.mark.parametrize("url", ["ftp://hooks.example.com/", "hooks.example.com/x", "",
                                 "https://user:pw@hooks.example.com/", "http://[::1/",
                                 "https://hooks.example.com:99999/", "https://x/" + "a" * 2000])
def test_a_malformed_url_is_E3004(url: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_callback_url(url, HOSTS)
    assert refused.value.code == "E3004"


def test_private_addresses_need_an_exact_listing() -> None:
    assert check_callback_url("http://127.0.0.1:9/", HOSTS).listed_exactly
    with pytest.raises(NetworkPolicyViolation):
        check_callback_url("http://10.1.2.3/", ("*.1.2.3", "10.1.2.4"))
    wildcard = check_callback_url("https://in.example.org/", HOSTS)
    with pytest.raises(NetworkPolicyViolation) as inside:
        check_callback_addresses(wildcard, ["93.184.216.34", "192.168.1.5"])
    assert inside.value.details["range"] == "private"
    check_callback_addresses(wildcard, ["93.184.216.34"])
    check_callback_addresses(check_callback_url("http://127.0.0.1/", HOSTS), ["127.0.0.1"])
    with pytest.raises(NetworkPolicyViolation):
        check_callback_addresses(wildcard, [])


def test_the_documented_signature_of_a_body() -> None:
    header = signature(b"s3cret", 1_700_000_000, b'{"a":1}')
    # hmac.new(b"s3cret", b'1700000000.{"a":1}', sha256).hexdigest()
    assert header == ("t=1700000000,v1=" + __import__("hmac").new(
        b"s3cret", b'1700000000.{"a":1}', "sha256").hexdigest())
    assert verify_signature(b"s3cret", header, b'{"a":1}', now=1_700_000_100)


@given(st.binary(max_size=200), st.binary(min_size=1, max_size=32), st.integers(0, 2**31))
def test_any_change_of_body_secret_or_time_fails_verification(body: bytes, secret: bytes,
                                                              t: int) -> None:
    header = signature(secret, t, body)
    assert verify_signature(secret, header, body, now=t)
    assert not verify_signature(secret + b"x", header, body, now=t)
    assert not verify_signature(secret, header, body + b" ", now=t)
    assert not verify_signature(secret, header, body, now=t + 301)
    assert not verify_signature(secret, header.replace(f"t={t}", f"t={t + 1}"), body, now=t)
    assert not verify_signature(secret, "v1=00", body, now=t)
