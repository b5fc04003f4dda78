"""The TOOLEXEC_KAFKA_* security settings: what they map to for aiokafka and FastStream,
and what is refused before any client is made."""

from __future__ import annotations

import pickle
import ssl
from pathlib import Path
from typing import Any

import pytest
from faststream.kafka.security import parse_security
from faststream.security import BaseSecurity, SASLScram256, SASLScram512
from pydantic import ValidationError

from projections.kafka_connection import live_client_options, portable_client_options
from toolexec.settings import (
    KafkaSettingsError,
    Settings,
    faststream_security,
    kafka_client_options,
)

BOOTSTRAP = "kafka:9094"


@pytest.fixture(autouse=True)
def _no_kafka_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("TOOLEXEC_KAFKA_"):
            monkeypatch.delenv(key)


def _settings(**values: Any) -> Settings:
    return Settings(kafka_bootstrap=BOOTSTRAP, user_tools_dir=None, **values)


def test_plaintext_needs_no_options() -> None:
    assert kafka_client_options(_settings()) == {}
    assert kafka_client_options(Settings(user_tools_dir=None)) == {}  # embedded
    assert faststream_security({}) is None


def test_sasl_plaintext_defaults_to_scram_sha_512() -> None:
    settings = _settings(kafka_security_protocol="SASL_PLAINTEXT",
                         kafka_sasl_username="toolexec", kafka_sasl_password="s3cret")
    assert kafka_client_options(settings) == {
        "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "toolexec", "sasl_plain_password": "s3cret"}
    assert "s3cret" not in repr(settings)  # a SecretStr


def test_scram_sha_256_is_allowed() -> None:
    settings = _settings(kafka_security_protocol="SASL_PLAINTEXT",
                         kafka_sasl_mechanism="scram-sha-256",
                         kafka_sasl_username="u", kafka_sasl_password="p")
    assert kafka_client_options(settings)["sasl_mechanism"] == "SCRAM-SHA-256"


def test_the_password_file_is_read_at_use(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("first\n")
    settings = _settings(kafka_security_protocol="SASL_PLAINTEXT",
                         kafka_sasl_username="u", kafka_sasl_password_file=secret)
    assert kafka_client_options(settings)["sasl_plain_password"] == "first"
    secret.write_text("rotated")
    assert kafka_client_options(settings)["sasl_plain_password"] == "rotated"
    secret.unlink()
    with pytest.raises(KafkaSettingsError, match="cannot read kafka_sasl_password_file"):
        kafka_client_options(settings)
    secret.write_text("\n")
    with pytest.raises(KafkaSettingsError, match="is empty"):
        kafka_client_options(settings)


def test_sasl_ssl_builds_a_verifying_context(tmp_path: Path) -> None:
    settings = _settings(kafka_security_protocol="SASL_SSL", kafka_sasl_username="u",
                         kafka_sasl_password="p")
    options = kafka_client_options(settings)
    assert options["security_protocol"] == "SASL_SSL"
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_ssl_with_a_missing_ca_file_fails_at_use(tmp_path: Path) -> None:
    settings = _settings(kafka_security_protocol="SSL",
                         kafka_ssl_cafile=tmp_path / "missing-ca.pem")
    with pytest.raises(FileNotFoundError):
        kafka_client_options(settings)


def test_environment_variables_map_to_settings(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    monkeypatch.setenv("TOOLEXEC_KAFKA_BOOTSTRAP", BOOTSTRAP)
    monkeypatch.setenv("TOOLEXEC_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("TOOLEXEC_KAFKA_SASL_USERNAME", "producer")
    monkeypatch.setenv("TOOLEXEC_KAFKA_SASL_PASSWORD_FILE", str(secret))
    options = kafka_client_options(Settings(user_tools_dir=None))
    assert options["sasl_plain_username"] == "producer"
    assert options["sasl_plain_password"] == "from-file"


@pytest.mark.parametrize(("values", "message"), [
    ({"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "PLAIN",
      "kafka_sasl_username": "u", "kafka_sasl_password": "p"}, "SASL PLAIN is refused"),
    ({"kafka_sasl_mechanism": "GSSAPI"}, "unsupported SASL mechanism"),
    ({"kafka_security_protocol": "SASL_PLAINTEXT"}, "needs kafka_sasl_username"),
    ({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_username": "u"},
     "exactly one of kafka_sasl_password and kafka_sasl_password_file"),
    ({"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_username": "u",
      "kafka_sasl_password": "p", "kafka_sasl_password_file": "/run/secrets/pw"},
     "exactly one of"),
    ({"kafka_sasl_username": "u", "kafka_sasl_password": "p"},
     "kafka_security_protocol is PLAINTEXT"),
    ({"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_username": "u",
      "kafka_sasl_password": "p", "kafka_ssl_cafile": "/ca.pem"}, "no TLS"),
    ({"kafka_security_protocol": "TLS"}, "kafka_security_protocol"),
])
def test_refused_settings(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _settings(**values)


def test_the_embedded_profile_takes_no_credentials() -> None:
    with pytest.raises(ValidationError, match="needs kafka_bootstrap"):
        Settings(user_tools_dir=None, kafka_security_protocol="SASL_PLAINTEXT",
                 kafka_sasl_username="u", kafka_sasl_password="p")


@pytest.mark.parametrize(("mechanism", "kind"), [("SCRAM-SHA-512", SASLScram512),
                                                 ("SCRAM-SHA-256", SASLScram256)])
def test_faststream_security_matches_the_client_options(mechanism: str, kind: type) -> None:
    for protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        options = kafka_client_options(_settings(
            kafka_security_protocol=protocol, kafka_sasl_mechanism=mechanism,
            kafka_sasl_username="toolexec", kafka_sasl_password="s3cret"))
        security = faststream_security(options)
        assert isinstance(security, kind)
        # FastStream hands its clients exactly what toolexec's own clients get.
        assert parse_security(security) == {"ssl_context": None, **options}


def test_faststream_security_for_tls_only() -> None:
    options = kafka_client_options(_settings(kafka_security_protocol="SSL"))
    security = faststream_security(options)
    assert type(security) is BaseSecurity
    assert parse_security(security) == options


def test_options_cross_to_worker_processes() -> None:
    plain = kafka_client_options(_settings(
        kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_username="u",
        kafka_sasl_password="p"))
    assert live_client_options(pickle.loads(pickle.dumps(portable_client_options(plain)))) \
        == plain
    tls = kafka_client_options(_settings(
        kafka_security_protocol="SASL_SSL", kafka_sasl_username="u", kafka_sasl_password="p"))
    crossed = live_client_options(pickle.loads(pickle.dumps(portable_client_options(tls))))
    assert isinstance(crossed["ssl_context"], ssl.SSLContext)
    assert {k: v for k, v in crossed.items() if k != "ssl_context"} == \
        {k: v for k, v in tls.items() if k != "ssl_context"}
    with pytest.raises(ValueError, match="not made by kafka_ssl_context"):
        portable_client_options({"ssl_context": ssl.create_default_context()})
