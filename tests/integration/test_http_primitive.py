"""The http_client primitive against a real HTTP/1.1 server on 127.0.0.1.

Loopback is out of a tool's reach by default, so the primitive under test is given
the operator's allowance for 127.0.0.1 (TOOLEXEC_EGRESS_ALLOWED_NETWORKS), except
where the tests check that very rule."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio

from consumers.primitives.http_primitive import HttpPrimitive
from domain.model import HttpPlan, NetworkPolicy

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-token-value"


@dataclass
class Seen:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    """A tiny keep-alive HTTP/1.1 responder that records every request it gets."""

    port: int = 0
    requests: list[Seen] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def policy(self, **changes: Any) -> NetworkPolicy:
        base: dict[str, Any] = {"allowed_domains": ("127.0.0.1",), "allowed_ports": (self.port,)}
        return NetworkPolicy(**(base | changes))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                seen = await self._parse(head, reader)
                self.requests.append(seen)
                writer.write(await self._respond(seen))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _parse(self, head: bytes, reader: asyncio.StreamReader) -> Seen:
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip()
                   for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        return Seen(method, target, headers, body)

    async def _respond(self, seen: Seen) -> bytes:
        status, extra, body = 200, "", json.dumps({"target": seen.target}).encode()
        if seen.target.startswith("/status/"):
            status, body = int(seen.target.rsplit("/", 1)[1]), b"upstream says no"
        elif seen.target == "/redirect":
            status, extra = 302, "location: http://169.254.169.254/latest/meta-data/\r\n"
        elif seen.target == "/slow":
            await asyncio.sleep(1.5)
        elif seen.target == "/echo-auth":
            extra = (f"x-echo: {seen.headers.get('authorization', '')}\r\n"
                     "set-cookie: session=abc; Path=/\r\n")
            body = b"ok"
        return (f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{extra}"
                f"content-length: {len(body)}\r\n\r\n").encode() + body


@pytest_asyncio.fixture
async def server() -> AsyncIterator[Server]:
    state = Server()
    listener = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    state.port = listener.sockets[0].getsockname()[1]
    async with listener:
        yield state


@pytest_asyncio.fixture
async def http() -> AsyncIterator[HttpPrimitive]:
    primitive = HttpPrimitive(allowed_networks=("127.0.0.1/32",))
    yield primitive
    await primitive.aclose()


@pytest_asyncio.fixture
async def default_http() -> AsyncIterator[HttpPrimitive]:
    """The primitive as an operator who allowed nothing runs it."""
    primitive = HttpPrimitive()
    yield primitive
    await primitive.aclose()


def secrets(name: str) -> str | None:
    return SECRET if name == "API_TOKEN" else None


def get(server: Server, path: str, **changes: Any) -> HttpPlan:
    base: dict[str, Any] = {"method": "GET", "url_template": server.url(path),
                            "network": server.policy()}
    return HttpPlan(**(base | changes))


# -- requests ---------------------------------------------------------------------------

async def test_path_and_query_parameters_are_url_encoded(
        http: HttpPrimitive, server: Server) -> None:
    plan = get(server, "/lookup/{word}?q={query}")
    outcome = await http.run(plan, {"word": "a b/c é", "query": "x y&z=1"}, secrets=secrets)
    assert outcome.ok and outcome.status_code == 200
    assert server.requests[0].target == "/lookup/a%20b%2Fc%20%C3%A9?q=x+y%26z%3D1"
    assert json.loads(outcome.stdout)["target"] == server.requests[0].target
    assert outcome.headers["content-type"] == "application/json"


async def test_unused_parameters_of_a_get_go_to_the_query_string(
        http: HttpPrimitive, server: Server) -> None:
    plan = get(server, "/items/{id}", query={"lang": "{lang}", "fixed": "1"})
    outcome = await http.run(plan, {"id": 7, "lang": "en", "tags": ["a", "b c"], "flag": True},
                             secrets=secrets)
    assert outcome.ok
    assert server.requests[0].target == "/items/7?lang=en&fixed=1&tags=a&tags=b+c&flag=true"


async def test_unused_parameters_of_a_post_form_the_json_body(
        http: HttpPrimitive, server: Server) -> None:
    plan = get(server, "/users/{id}", method="POST", body_from_params=True)
    outcome = await http.run(plan, {"id": "u1", "name": "Zoë", "age": 3}, secrets=secrets)
    assert outcome.ok
    seen = server.requests[0]
    assert (seen.method, seen.target) == ("POST", "/users/u1")
    assert json.loads(seen.body) == {"name": "Zoë", "age": 3}


async def test_missing_url_parameter_is_E3301_and_nothing_is_sent(
        http: HttpPrimitive, server: Server) -> None:
    outcome = await http.run(get(server, "/lookup/{word}"), {}, secrets=secrets)
    assert outcome.error is not None and outcome.error["code"] == "E3301"
    assert server.requests == []


# -- secrets ----------------------------------------------------------------------------

async def test_secret_header_reaches_the_server_but_never_the_outcome(
        http: HttpPrimitive, server: Server) -> None:
    plan = get(server, "/echo-auth", headers={"Authorization": "Bearer ${API_TOKEN}"})
    outcome = await http.run(plan, {}, secrets=secrets)
    assert outcome.ok
    assert server.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in repr(outcome)
    assert outcome.headers["x-echo"] == "Bearer [REDACTED]"
    assert "set-cookie" not in outcome.headers


async def test_missing_secret_is_E3602_and_nothing_is_sent(
        http: HttpPrimitive, server: Server) -> None:
    plan = get(server, "/x", headers={"X-Key": "${NOT_THERE}"})
    outcome = await http.run(plan, {}, secrets=secrets)
    assert outcome.error is not None and outcome.error["code"] == "E3602"
    assert server.requests == []


async def test_cookies_are_not_carried_between_calls(
        http: HttpPrimitive, server: Server) -> None:
    await http.run(get(server, "/echo-auth"), {}, secrets=secrets)
    await http.run(get(server, "/next"), {}, secrets=secrets)
    assert "cookie" not in server.requests[1].headers


# -- network policy ---------------------------------------------------------------------

@pytest.mark.parametrize("policy", [
    {"allowed_domains": ("example.com",)},
    {"allowed_domains": ("*.0.0.1",), "allowed_ports": (1,)},
    {"allowed_ports": (80, 443)},
    {"deny_all_egress": True},
])
async def test_policy_refusal_is_E3406_and_makes_no_request(
        http: HttpPrimitive, server: Server, policy: dict[str, Any]) -> None:
    outcome = await http.run(get(server, "/x", network=server.policy(**policy)), {},
                             secrets=secrets)
    assert outcome.error is not None and outcome.error["code"] == "E3406"
    assert outcome.error["details"]["host"] == "127.0.0.1"
    assert outcome.error["details"]["port"] == server.port
    assert server.requests == []


async def test_wildcard_domain_does_not_match_the_bare_domain(http: HttpPrimitive) -> None:
    plan = HttpPlan(method="GET", url_template="https://example.com/x",
                    network=NetworkPolicy(allowed_domains=("*.example.com",)))
    outcome = await http.run(plan, {}, secrets=secrets)
    assert outcome.error is not None and outcome.error["code"] == "E3406"


async def test_host_parameter_cannot_steer_around_the_policy(
        http: HttpPrimitive, server: Server) -> None:
    plan = get(server, "/x", url_template="http://{host}/x")
    outcome = await http.run(plan, {"host": f"evil.test:{server.port}"}, secrets=secrets)
    assert outcome.error is not None and outcome.error["code"] == "E3406"


async def test_an_empty_allowed_ports_allows_no_port(
        http: HttpPrimitive, server: Server) -> None:
    outcome = await http.run(get(server, "/x", network=server.policy(allowed_ports=())), {},
                             secrets=secrets)
    assert outcome.error is not None and outcome.error["code"] == "E3406"
    assert "allows no port" in outcome.error["message"]
    assert server.requests == []


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]"])
async def test_loopback_is_refused_without_the_operators_allowance(
        default_http: HttpPrimitive, server: Server, host: str) -> None:
    plan = HttpPlan(method="GET", url_template=f"http://{host}:{server.port}/x",
                    network=NetworkPolicy(allowed_ports=(server.port,)))
    outcome = await default_http.run(plan, {}, secrets=secrets)
    assert outcome.error is not None and outcome.error["code"] == "E3406", outcome
    assert outcome.error["details"]["range"].startswith("loopback")
    assert server.requests == []


async def test_a_literal_address_is_checked_without_a_lookup(
        http: HttpPrimitive, default_http: HttpPrimitive, server: Server,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An address in the URL is its own answer: checked as it is, with no lookup (a
    lookup is a thread hop per request), and still refused where the rules say so."""
    lookups: list[str] = []

    async def no_lookup(host: str, *args: Any, **kwargs: Any) -> Any:
        lookups.append(host)
        raise OSError("no lookup expected")

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", no_lookup)
    allowed = await http.run(get(server, "/x"), {}, secrets=secrets)
    refused = await default_http.run(get(server, "/y"), {}, secrets=secrets)
    assert allowed.ok, allowed
    assert refused.error is not None and refused.error["code"] == "E3406", refused
    assert [r.target for r in server.requests] == ["/x"]
    assert lookups == []


async def test_the_operators_allowance_opens_exactly_its_networks(server: Server) -> None:
    elsewhere = HttpPrimitive(allowed_networks=("127.0.0.2/32",))
    try:
        outcome = await elsewhere.run(get(server, "/x"), {}, secrets=secrets)
    finally:
        await elsewhere.aclose()
    assert outcome.error is not None and outcome.error["code"] == "E3406"
    assert server.requests == []


async def test_a_redirect_is_returned_not_followed(http: HttpPrimitive, server: Server) -> None:
    outcome = await http.run(get(server, "/redirect"), {}, secrets=secrets)
    assert outcome.ok and outcome.status_code == 302
    assert [seen.target for seen in server.requests] == ["/redirect"]


async def test_non_http_scheme_is_refused(http: HttpPrimitive) -> None:
    plan = HttpPlan(method="GET", url_template="ftp://127.0.0.1/file")
    outcome = await http.run(plan, {}, secrets=secrets)
    assert outcome.error is not None and outcome.error["code"] == "E3406"


# -- remote failures --------------------------------------------------------------------

async def test_server_error_is_E3502_with_status_and_body(
        http: HttpPrimitive, server: Server) -> None:
    outcome = await http.run(get(server, "/status/500"), {}, secrets=secrets)
    assert not outcome.ok and outcome.status_code == 500
    assert outcome.error is not None and outcome.error["code"] == "E3502"
    assert outcome.stdout == b"upstream says no"


async def test_client_error_is_E3401_with_status(http: HttpPrimitive, server: Server) -> None:
    outcome = await http.run(get(server, "/status/404"), {}, secrets=secrets)
    assert not outcome.ok and outcome.status_code == 404
    assert outcome.error is not None and outcome.error["code"] == "E3401"


async def test_slow_server_is_E3503(http: HttpPrimitive, server: Server) -> None:
    outcome = await http.run(get(server, "/slow", timeout_seconds=0.3), {}, secrets=secrets)
    # E3503, not the 200 the server sends after 1.5 s: the call stopped at its timeout.
    assert outcome.error is not None and outcome.error["code"] == "E3503"
    assert outcome.status_code is None


async def test_connection_refused_is_E3502(http: HttpPrimitive) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    plan = HttpPlan(method="GET", url_template=f"http://127.0.0.1:{port}/x",
                    network=NetworkPolicy(allowed_domains=("127.0.0.1",), allowed_ports=(port,)))
    outcome = await http.run(plan, {}, secrets=secrets)
    assert outcome.error is not None and outcome.error["code"] == "E3502"
    assert outcome.status_code is None


async def test_concurrent_requests_share_the_pool(http: HttpPrimitive, server: Server) -> None:
    outcomes = await asyncio.gather(*(http.run(get(server, f"/n/{i}"), {}, secrets=secrets)
                                      for i in range(50)))
    assert all(outcome.ok for outcome in outcomes)
    assert len(server.requests) == 50
