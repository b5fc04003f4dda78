"""What the read models' process is started with: the parent's settings, secrets
included, over its stdin only (the command line and the environment stay as they are)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from aiokafka import TopicPartition
from pydantic import SecretStr

from toolexec.read_model_child import decode_ends, encode_ends, settings_from
from toolexec.read_model_process import settings_document
from toolexec.settings import Settings


def _production(tmp_path: Path) -> Settings:
    return Settings(kafka_bootstrap="kafka:9093", kafka_security_protocol="SASL_SSL",
                    kafka_sasl_username="reader", kafka_sasl_password=SecretStr("s3cret"),
                    database_url="postgresql+asyncpg://toolexec:pw@db/toolexec",
                    state_dir=tmp_path, projections_verify_seconds=7.5)


def test_the_child_validates_back_the_parents_settings_with_their_secrets(tmp_path: Path) -> None:
    settings = _production(tmp_path)
    order = json.loads(json.dumps({"settings": settings_document(settings)}))
    again = settings_from(order)
    assert again.kafka_sasl_password is not None
    assert again.kafka_sasl_password.get_secret_value() == "s3cret"
    assert again.model_dump(exclude={"log_level"}) == settings.model_dump(exclude={"log_level"})


def test_the_child_logs_at_the_level_the_parent_logs_at(tmp_path: Path) -> None:
    root = logging.getLogger()
    before = root.level
    root.setLevel(logging.WARNING)
    try:
        assert settings_from({"settings": settings_document(_production(tmp_path))}
                             ).log_level == "WARNING"
    finally:
        root.setLevel(before)


def test_partition_ends_cross_the_pipe_unchanged() -> None:
    ends = {TopicPartition("toolexec.invocations", 3): 1234, TopicPartition("toolexec.registry", 0): 0}
    assert decode_ends(json.loads(json.dumps(encode_ends(ends)))) == ends
