"""A callback goes to the address its host resolved to when it was checked, never to
one a second resolution would give (DNS rebinding): real receivers on two loopback
addresses, the deliverer's resolver port answering with the address checked, and the
Host header, TLS server name (SNI) and certificate name kept those of the URL."""

from __future__ import annotations

import datetime as dt
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from contracts.envelope import Envelope, new_envelope
from contracts.events import InvokeCompleted
from domain.callbacks import CallbackTarget, check_callback_url
from toolexec.callback_delivery import CallbackPolicy, deliver

pytestmark = pytest.mark.integration

POLICY = CallbackPolicy(hosts=(), secret=b"callback-secret", max_attempts=2,
                        first_backoff_seconds=0.01)
TLS_NAME = "callback.test"  # resolvable by nothing but the deliverer's resolver port


@dataclass
class Receiver:
    """An HTTP(S) receiver on one loopback address: the Host headers and TLS server
    names it saw."""

    server: ThreadingHTTPServer
    hosts: list[str] = field(default_factory=list)
    server_names: list[str | None] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])


def _serve(address: str, port: int = 0, tls: ssl.SSLContext | None = None) -> Receiver:
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            seen.append(self.headers.get("Host", ""))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((address, port), Handler)
    receiver = Receiver(server, hosts=seen)
    if tls is not None:
        tls.sni_callback = lambda _sock, name, _ctx: receiver.server_names.append(name)
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return receiver


@pytest.fixture
def two_receivers() -> Iterator[tuple[Receiver, Receiver]]:
    """Receivers on 127.0.0.2 (the address checked) and 127.0.0.1 (where `localhost`
    resolves again), on the same port."""
    checked = _serve("127.0.0.2")
    rebound = _serve("127.0.0.1", checked.port)
    yield checked, rebound
    for receiver in (checked, rebound):
        receiver.server.shutdown()
        receiver.server.server_close()


def _terminal() -> Envelope:
    data = InvokeCompleted(invocation_id="inv-pinned", tool_id="hello", version="1.0.0",
                           result={"ok": True}, duration_ms=1.0, attempts=1)
    return new_envelope(data, source="urn:test", partitionkey="inv-pinned",
                        correlationid="inv-pinned", causationid="cause", time=datetime.now(UTC))


def _resolver(*addresses: str):  # the deliverer's resolver port
    calls: list[str] = []

    async def resolve(target: CallbackTarget) -> list[str]:
        calls.append(target.host)
        return list(addresses)
    return resolve, calls


async def test_the_post_goes_to_the_address_checked_not_to_a_new_resolution(
        two_receivers: tuple[Receiver, Receiver]) -> None:
    checked, rebound = two_receivers
    target = check_callback_url(f"http://localhost:{checked.port}/done", ["localhost"])
    resolve, calls = _resolver("127.0.0.2")
    async with httpx.AsyncClient() as http:
        delivery = await deliver(http, target, _terminal(), POLICY, resolve=resolve)
    assert delivery.error is None and delivery.status_code == 200
    assert checked.hosts == [f"localhost:{checked.port}"]  # the URL's Host, kept
    assert rebound.hosts == [] and calls == ["localhost"]  # resolved once


async def test_every_address_is_checked_before_any_connection(
        two_receivers: tuple[Receiver, Receiver]) -> None:
    checked, rebound = two_receivers
    target = check_callback_url(f"http://hooks.example.net:{checked.port}/done",
                                ["*.example.net"])
    resolve, _ = _resolver("93.184.216.34", "127.0.0.2")
    async with httpx.AsyncClient() as http:
        delivery = await deliver(http, target, _terminal(), POLICY, resolve=resolve)
    assert delivery.error is not None and delivery.error.code == "E3406"
    assert delivery.error.details["address"] == "127.0.0.2"
    assert checked.hosts == rebound.hosts == []


def _certificates(directory: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A CA, a server certificate for TLS_NAME it signed: the receiver's context and
    a client context trusting only that CA."""
    now = datetime.now(UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "toolexec test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=1))
          .not_valid_after(now + dt.timedelta(hours=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, TLS_NAME)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(TLS_NAME)]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(*_pem_files(directory, leaf, key))
    client = ssl.create_default_context(cadata=ca.public_bytes(
        serialization.Encoding.PEM).decode())
    return server, client


def _pem_files(directory: Path, cert: x509.Certificate,
               key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_https_keeps_the_server_name_and_checks_the_certificate_against_it(
        tmp_path: Path) -> None:
    server_tls, client_tls = _certificates(tmp_path)
    receiver = _serve("127.0.0.2", tls=server_tls)
    try:
        target = check_callback_url(f"https://{TLS_NAME}:{receiver.port}/done", [TLS_NAME])
        resolve, _ = _resolver("127.0.0.2")
        async with httpx.AsyncClient(verify=client_tls) as http:
            delivery = await deliver(http, target, _terminal(), POLICY, resolve=resolve)
        assert delivery.error is None and delivery.status_code == 200, delivery
        assert receiver.server_names == [TLS_NAME]
        assert receiver.hosts == [f"{TLS_NAME}:{receiver.port}"]
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
