"""The production compose file only sets settings that exist, with values they accept."""

from pathlib import Path

import yaml

from toolexec.settings import Settings

COMPOSE = Path(__file__).resolve().parents[2] / "compose" / "docker-compose.yml"


def _toolexec_environment() -> dict[str, str]:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    return {k: str(v) for k, v in services["toolexec"]["environment"].items()}


def test_every_variable_names_a_setting() -> None:
    fields = {f"TOOLEXEC_{name.upper()}" for name in Settings.model_fields}
    assert set(_toolexec_environment()) <= fields


def test_environment_is_the_production_profile(monkeypatch) -> None:
    for key, value in _toolexec_environment().items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert not settings.embedded
    assert settings.auth_required
    assert settings.database_url.startswith("postgresql+psycopg://")
    assert settings.redis_url.startswith("redis://")
    assert settings.token_public_keys == [Path("/run/secrets/toolexec_token_public_key")]


# --- broker security (docs/broker-security.md) -------------------------------------------

INIT_SCRIPT = COMPOSE.parent / "kafka" / "init-security.sh"


def _services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_toolexec_authenticates_with_scram_and_a_mounted_password(monkeypatch) -> None:
    from toolexec.settings import faststream_security

    for key, value in _toolexec_environment().items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.kafka_security_protocol == "SASL_PLAINTEXT"
    assert settings.kafka_sasl_mechanism == "SCRAM-SHA-512"
    assert settings.kafka_sasl_username == "toolexec"
    secret = Path(str(settings.kafka_sasl_password_file))
    assert secret.parent == Path("/run/secrets")
    assert secret.name in _services()["toolexec"]["secrets"]
    assert settings.fact_signing_key is not None
    assert settings.fact_signing_key.name in _services()["toolexec"]["secrets"]
    assert faststream_security({"security_protocol": "SASL_PLAINTEXT",
                                "sasl_mechanism": settings.kafka_sasl_mechanism,
                                "sasl_plain_username": "toolexec",
                                "sasl_plain_password": "x"}) is not None


def test_kafka_refuses_unauthenticated_and_unauthorized_clients() -> None:
    kafka = _services()["kafka"]["environment"]
    protocols = dict(item.split(":") for item in
                     kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = dict(item.split("://") for item in kafka["KAFKA_LISTENERS"].split(","))
    # Every listener a client can reach authenticates; plaintext ones are loopback only.
    for name, address in listeners.items():
        if protocols[name] == "PLAINTEXT":
            assert address.startswith("127.0.0.1:"), name
        else:
            assert protocols[name] in ("SASL_PLAINTEXT", "SASL_SSL"), name
    assert kafka["KAFKA_CONTROLLER_LISTENER_NAMES"] == "CONTROLLER"
    assert kafka["KAFKA_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    assert kafka["KAFKA_AUTHORIZER_CLASS_NAME"] == \
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert kafka["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert "User:admin" in kafka["KAFKA_SUPER_USERS"].split(";")
    bootstrap_host, port = _toolexec_environment()["TOOLEXEC_KAFKA_BOOTSTRAP"].split(":")
    assert listeners["CLIENTS"] == f":{port}" and bootstrap_host == "kafka"


def test_the_init_service_makes_every_principal_toolexec_runs_with() -> None:
    services = _services()
    init = services["kafka-init"]
    assert init["image"] == services["kafka"]["image"]
    assert init["network_mode"] == "service:kafka"
    assert services["toolexec"]["depends_on"]["kafka-init"] == {
        "condition": "service_completed_successfully"}
    script = INIT_SCRIPT.read_text()
    for user in ("admin", "toolexec", "producer", "reader"):
        assert f"kafka_{user}_password" in init["secrets"]
    assert "for user in admin toolexec producer reader" in script
    from contracts import topics

    assert all(topic.startswith("toolexec.") for topic in topics.ALL_TOPICS)
    assert f"--topic {topics.REQUESTS}" in script
    assert f"--topic {topics.INVOCATIONS}" in script
