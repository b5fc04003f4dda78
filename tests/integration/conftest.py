"""A real Kafka-protocol broker for the integration tests, chosen once per session.

In order: the broker named by `TOOLEXEC_TEST_KAFKA_BOOTSTRAP`; a Kafka container when
`testcontainers` is installed and a Docker engine answers; otherwise an embedded Tansu
broker. Every toolexec topic exists before the first test runs.

Tansu keeps everything in memory for the whole session, so records and consumer groups
of one test are visible to the next: use `fresh_topic_prefix` (or unique ids and
group names) to keep tests apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolexec.embedded_broker import EmbeddedBroker, ensure_topics
from toolexec.settings import EMBEDDED_CONSUMER_TUNING, PRODUCTION_CONSUMER_TUNING
from toolexec.stack import TOPIC_PARTITIONS as STACK_TOPICS

TOPIC_PARTITIONS: dict[str, int] = dict(STACK_TOPICS)
"""Every toolexec topic with its partition count in the test broker (as `up` makes them)."""

EXTERNAL_BOOTSTRAP_ENV = "TOOLEXEC_TEST_KAFKA_BOOTSTRAP"


@pytest.fixture(scope="session")
def broker_logs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session's embedded broker (and tests' own brokers) write their logs."""
    return tmp_path_factory.mktemp("broker-logs")


@pytest.fixture(scope="session")
def kafka_broker_kind(broker_logs_dir: Path) -> Iterator[tuple[str, str]]:
    """`(kind, bootstrap)` of the session broker; kind is external|container|embedded."""
    external = os.environ.get(EXTERNAL_BOOTSTRAP_ENV, "").strip()
    if external:
        asyncio.run(ensure_topics(external, TOPIC_PARTITIONS))
        yield "external", external
        return
    with _kafka_container() as container_bootstrap:
        if container_bootstrap is not None:
            asyncio.run(ensure_topics(container_bootstrap, TOPIC_PARTITIONS))
            yield "container", container_bootstrap
            return
    # Started synchronously from the main thread, so tests of any loop scope can use it.
    with EmbeddedBroker(TOPIC_PARTITIONS, log_dir=broker_logs_dir) as broker:
        yield "embedded", broker.bootstrap


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker_kind: tuple[str, str]) -> str:
    """Bootstrap servers of the session's broker, with all toolexec topics created."""
    return kafka_broker_kind[1]


@pytest.fixture(scope="session")
def kafka_consumer_kwargs(kafka_broker_kind: tuple[str, str]) -> dict[str, Any]:
    """Consumer-group tuning that suits the session broker (fast joins on Tansu).

    Real Kafka refuses session timeouts below 6 s, so only the embedded broker gets
    the 1 s values.
    """
    kind = kafka_broker_kind[0]
    return dict(EMBEDDED_CONSUMER_TUNING if kind == "embedded" else PRODUCTION_CONSUMER_TUNING)


@pytest.fixture(scope="session")
def kafka_topic_partitions() -> dict[str, int]:
    """The toolexec topics the session broker holds, with their partition counts."""
    return dict(TOPIC_PARTITIONS)


@pytest.fixture
def fresh_topic_prefix() -> str:
    """A prefix no other test uses, for topic names, group ids and keys."""
    return f"t{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def _kafka_container() -> Iterator[str | None]:
    """A testcontainers Kafka when it is installed and Docker answers, else None."""
    if not _docker_reachable():
        yield None
        return
    try:
        from testcontainers.kafka import KafkaContainer  # type: ignore[import-not-found]
    except ImportError:
        yield None
        return
    container = KafkaContainer()
    try:
        container.start()
    except Exception:  # noqa: BLE001 - any Docker trouble means "use the embedded broker"
        with contextlib.suppress(Exception):
            container.stop()
        yield None
        return
    try:
        yield container.get_bootstrap_server()
    finally:
        container.stop()


def _docker_reachable() -> bool:
    """Quick check for a Docker engine: DOCKER_HOST, or a live /var/run/docker.sock."""
    if os.environ.get("DOCKER_HOST"):
        return True
    path = "/var/run/docker.sock"
    if not os.path.exists(path):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True
