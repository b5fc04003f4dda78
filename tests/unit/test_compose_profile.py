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
