"""Where a tool may connect: its own policy, then the operator's address rules."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.egress import (
    ProxyRequestInvalid,
    check_address,
    check_addresses,
    check_destination,
    forbidden_reason,
    host_matches,
    parse_proxy_request,
)
from domain.errors import NetworkPolicyViolation
from domain.model import NetworkPolicy


@pytest.mark.parametrize(("host", "pattern", "matches"), [
    ("api.example.com", "api.example.com", True),
    ("API.Example.com.", "api.example.com", True),
    ("a.example.com", "*.example.com", True),
    ("example.com", "*.example.com", False),
    ("evilexample.com", "*.example.com", False),
    ("example.com.evil", "example.com", False),
])
def test_host_patterns(host: str, pattern: str, matches: bool) -> None:
    assert host_matches(host, pattern) is matches


def test_an_empty_allowed_ports_allows_no_port() -> None:
    with pytest.raises(NetworkPolicyViolation, match="allows no port"):
        check_destination(NetworkPolicy(allowed_ports=()), "example.com", 443)


def test_listed_host_and_port_pass_and_others_do_not() -> None:
    policy = NetworkPolicy(allowed_domains=("api.example.com",), allowed_ports=(443,))
    check_destination(policy, "api.example.com", 443)
    for host, port in (("api.example.com", 80), ("other.example.com", 443)):
        with pytest.raises(NetworkPolicyViolation):
            check_destination(policy, host, port)


def test_deny_all_egress_wins() -> None:
    with pytest.raises(NetworkPolicyViolation, match="denies all egress"):
        check_destination(NetworkPolicy(("a.com",), (443,), True), "a.com", 443)


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.8.9.10", "::1", "10.1.2.3", "172.16.0.1", "192.168.1.1",
    "169.254.169.254", "fe80::1", "100.64.0.1", "0.0.0.0", "::", "224.0.0.1", "ff02::1",
    "240.0.0.1", "255.255.255.255", "fc00::1", "::ffff:127.0.0.1", "64:ff9b::7f00:1",
    "2002:7f00:1::1", "192.0.2.1",
])
def test_inside_and_special_addresses_are_refused(address: str) -> None:
    with pytest.raises(NetworkPolicyViolation) as refused:
        check_address(address)
    assert refused.value.code == "E3406"


@pytest.mark.parametrize("address", ["93.184.215.14", "1.1.1.1", "2606:4700:4700::1111",
                                     "::ffff:8.8.8.8"])
def test_public_addresses_pass(address: str) -> None:
    assert check_address(address) == ipaddress.ip_address(address)


def test_the_operator_can_allow_a_network() -> None:
    assert str(check_address("127.0.0.2", ("127.0.0.2/32",))) == "127.0.0.2"
    assert check_address("::ffff:10.0.0.5", ("10.0.0.0/8",)) == ipaddress.ip_address(
        "::ffff:10.0.0.5")
    with pytest.raises(NetworkPolicyViolation):
        check_address("127.0.0.1", ("127.0.0.2/32",))


def test_one_forbidden_address_refuses_the_whole_name() -> None:
    with pytest.raises(NetworkPolicyViolation, match="rebind.example"):
        check_addresses(["93.184.215.14", "127.0.0.1"], host="rebind.example")


@given(st.ip_addresses())
def test_every_address_is_either_public_or_refused_with_a_reason(address) -> None:
    reason = forbidden_reason(address)
    if reason is None:
        assert address.is_global and not address.is_multicast
    else:
        with pytest.raises(NetworkPolicyViolation):
            check_address(str(address))


def test_connect_requests_are_parsed() -> None:
    request = parse_proxy_request(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (request.tunnel, request.host, request.port) == (True, "api.example.com", 443)
    ipv6 = parse_proxy_request(b"CONNECT [2606:4700::1]:8443 HTTP/1.1\r\n\r\n")
    assert (ipv6.host, ipv6.port) == ("2606:4700::1", 8443)


def test_absolute_requests_are_forwarded_in_origin_form_with_connection_close() -> None:
    request = parse_proxy_request(
        b"GET http://user:pw@Example.com:8080/a?b=1 HTTP/1.1\r\nHost: example.com:8080\r\n"
        b"Proxy-Authorization: x\r\nConnection: keep-alive\r\n\r\n")
    assert (request.tunnel, request.host, request.port) == (False, "example.com", 8080)
    assert request.forward_head == (b"GET /a?b=1 HTTP/1.1\r\nHost: example.com:8080\r\n"
                                    b"Connection: close\r\n\r\n")


@pytest.mark.parametrize("head", [
    b"GET /relative HTTP/1.1\r\n\r\n", b"CONNECT example.com HTTP/1.1\r\n\r\n",
    b"GET ftp://example.com/ HTTP/1.1\r\n\r\n", b"CONNECT a b:1 HTTP/1.1\r\n\r\n",
    b"CONNECT example.com:99999 HTTP/1.1\r\n\r\n", b"\xff\xfe\r\n\r\n",
])
def test_other_requests_are_refused(head: bytes) -> None:
    with pytest.raises(ProxyRequestInvalid):
        parse_proxy_request(head)
