"""Where a tool may connect: its network policy, then the operator's address rules.

Two questions, asked in this order for every connection a tool makes (a script
tool through the egress proxy, an API tool through the http primitive):

1. `check_destination(policy, host, port)` — does the tool's own network policy
   name this destination? `deny_all_egress` refuses everything; a non-empty
   `allowed_domains` must match the host (exact, or `*.example.com` for any
   subdomain of example.com but not example.com itself; case-insensitive, a
   trailing dot ignored); the port must be in `allowed_ports`, and an empty
   `allowed_ports` allows no port at all.
2. `check_address(address, allowed_networks)` — after the host name was resolved,
   is every address it resolved to one a tool may reach? Loopback, link-local,
   private, shared (CGNAT), unspecified, multicast, reserved and documentation
   ranges are refused — for IPv6 too, and for IPv4 addresses embedded in IPv6
   (mapped, NAT64, 6to4, Teredo) — unless the address lies in one of the operator's
   `allowed_networks` (CIDR blocks). The caller then connects to that checked
   address, never to the name again, so a second DNS answer cannot lead elsewhere.

Both raise NetworkPolicyViolation (E3406). Also here: the parsing of the request
head an HTTP proxy receives (`parse_proxy_request`), so the egress proxy itself
only moves bytes.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from domain.errors import NetworkPolicyViolation
from domain.model import NetworkPolicy

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_SHARED = ipaddress.ip_network("100.64.0.0/10")
_DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_HEAD_BYTES = 64 * 1024
_TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_HOST = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)$")
_ABSOLUTE = re.compile(r"^[Hh][Tt][Tt][Pp]://(?P<authority>[^/?#]*)(?P<path>[^#]*)")


# ------------------------------------------------------------------ the tool's policy


def host_matches(host: str, pattern: str) -> bool:
    """`pattern` is a host name (exact) or `*.domain` (any subdomain, not the domain)."""
    host = host.lower().rstrip(".")
    pattern = pattern.lower().rstrip(".")
    if pattern.startswith("*."):
        suffix = pattern[1:]
        return host.endswith(suffix) and len(host) > len(suffix)
    return host == pattern


def check_destination(policy: NetworkPolicy, host: str, port: int | None, *,
                      scheme: str | None = None) -> None:
    """Refuse (E3406) a destination the tool's own policy does not allow."""
    host = host.lower().rstrip(".")
    details: dict[str, object] = {"host": host, "port": port}
    if scheme is not None:
        details["scheme"] = scheme
    if policy.deny_all_egress:
        raise NetworkPolicyViolation("the tool's network policy denies all egress",
                                     details=details)
    if policy.allowed_domains and not any(host_matches(host, pattern)
                                          for pattern in policy.allowed_domains):
        raise NetworkPolicyViolation(f"host {host!r} is not in the allowed domains",
                                     details={**details,
                                              "allowed_domains": list(policy.allowed_domains)})
    if port not in policy.allowed_ports:
        reason = ("the network policy allows no port (allowed_ports is empty)"
                  if not policy.allowed_ports else f"port {port} is not allowed")
        raise NetworkPolicyViolation(reason, details={
            **details, "allowed_ports": list(policy.allowed_ports)})


# --------------------------------------------------------------- the operator's rules


@lru_cache(maxsize=64)
def parse_networks(cidrs: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    """The operator's allowed networks; raises ValueError on a malformed block."""
    return tuple(ipaddress.ip_network(cidr.strip(), strict=False) for cidr in cidrs)


def forbidden_reason(address: IPAddress) -> str | None:
    """Why a tool may not reach `address` by default, or None for a public address."""
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        reason = forbidden_reason(embedded)
        return None if reason is None else f"{reason} (embedded in {address})"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_unspecified:
        return "unspecified"
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return "shared address space (CGNAT)"
    if address.is_private:
        return "private"
    if address.is_reserved or not address.is_global:
        return "reserved"
    return None


def check_address(address: str, allowed_networks: tuple[str, ...] = (), *,
                  host: str | None = None) -> IPAddress:
    """The parsed address when a tool may connect to it; E3406 otherwise."""
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        raise NetworkPolicyViolation(f"{address!r} is not an IP address",
                                     details={"address": address}) from None
    reason = forbidden_reason(parsed)
    if reason is None:
        return parsed
    candidates = [parsed]
    embedded = _embedded_ipv4(parsed)
    if embedded is not None:
        candidates.append(embedded)
    for network in parse_networks(allowed_networks):
        if any(c.version == network.version and c in network for c in candidates):
            return parsed
    details: dict[str, object] = {"address": str(parsed), "range": reason}
    if host is not None:
        details["host"] = host
    raise NetworkPolicyViolation(
        f"{host or parsed} resolves to {parsed}, a {reason} address tools may not reach "
        "(the operator can allow it with TOOLEXEC_EGRESS_ALLOWED_NETWORKS)", details=details)


def check_addresses(addresses: Iterable[str], allowed_networks: tuple[str, ...] = (), *,
                    host: str) -> list[IPAddress]:
    """Every address `host` resolved to, each checked: one forbidden address refuses
    the host (a name that also points inside is not reached at all)."""
    checked = [check_address(a, allowed_networks, host=host) for a in addresses]
    if not checked:
        raise NetworkPolicyViolation(f"{host} did not resolve to any address",
                                     details={"host": host})
    return list(dict.fromkeys(checked))


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64 or address in _NAT64_LOCAL:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


# ------------------------------------------------------------- the proxy's requests


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    """What a client asked an HTTP proxy for.

    `tunnel` is a CONNECT (any TCP stream, TLS usually); otherwise an absolute-form
    request whose `forward_head` is the head to send upstream: origin-form target,
    proxy headers removed, `Connection: close` (one request per connection, so a
    later request on the same connection can never reach another host)."""

    tunnel: bool
    host: str
    port: int
    forward_head: bytes = b""


class ProxyRequestInvalid(ValueError):
    """The head is not an HTTP proxy request this proxy accepts (answered 400)."""


def parse_proxy_request(head: bytes) -> ProxyRequest:
    """Parse a request head (up to and including the blank line)."""
    if len(head) > MAX_HEAD_BYTES:
        raise ProxyRequestInvalid("request head too large")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[2].startswith(b"HTTP/1."):
        raise ProxyRequestInvalid("malformed request line")
    method, target, version = parts
    try:
        text = target.decode("ascii")
    except UnicodeDecodeError:
        raise ProxyRequestInvalid("non-ASCII request target") from None
    if method == b"CONNECT":
        host, port = _authority(text, None)
        return ProxyRequest(tunnel=True, host=host, port=port)
    match = _ABSOLUTE.match(text)
    if match is None:
        raise ProxyRequestInvalid("only absolute http:// targets or CONNECT are proxied")
    host, port = _authority(match.group("authority").rsplit("@", 1)[-1],
                            _DEFAULT_PORTS["http"])
    path = match.group("path") or "/"
    if not path.startswith("/"):
        path = "/" + path
    headers = [line for line in lines[1:] if line and not _hop_by_hop(line)]
    forward = b"\r\n".join([method + b" " + path.encode("ascii") + b" " + version, *headers,
                            b"Connection: close", b"", b""])
    return ProxyRequest(tunnel=False, host=host, port=port, forward_head=forward)


def _authority(text: str, default_port: int | None) -> tuple[str, int]:
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[1:end], text[end + 1:]
        if end < 0 or (rest and not rest.startswith(":")):
            raise ProxyRequestInvalid("malformed IPv6 authority")
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    if not port_text:
        if default_port is None:
            raise ProxyRequestInvalid("CONNECT needs host:port")
        port = default_port
    elif port_text.isdigit() and 0 < int(port_text) < 65536:
        port = int(port_text)
    else:
        raise ProxyRequestInvalid("malformed port")
    if not host or not _HOST.match(host if ":" not in host else f"[{host}]"):
        raise ProxyRequestInvalid("malformed host")
    return host.lower().rstrip("."), port


_HOP_BY_HOP = (b"connection:", b"proxy-connection:", b"proxy-authorization:", b"keep-alive:",
               b"proxy-authenticate:", b"te:", b"trailer:", b"upgrade:")


def _hop_by_hop(line: bytes) -> bool:
    return line.lower().startswith(_HOP_BY_HOP)
