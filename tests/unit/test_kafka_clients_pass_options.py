"""Every Kafka client toolexec makes passes the connection options
(`settings.kafka_client_options`): a client built without them would connect
unauthenticated, and a broker with ACLs would refuse it only in production.

An AST scan over toolexec/, consumers/ and projections/: each `AIOKafka*(...)` call has a
`**` expansion or explicit `security_protocol=`, each `KafkaBroker(...)` a `security=`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("toolexec", "consumers", "projections")

ALLOWED: dict[tuple[str, str], str] = {
    # The replay benchmark writes and reads a log on the embedded broker it starts itself
    # (`toolexec bench`): PLAINTEXT on loopback by construction.
    ("toolexec/bench/replay.py", "AIOKafkaProducer"): "bench on its own embedded broker",
    ("toolexec/bench/replay.py", "AIOKafkaConsumer"): "bench on its own embedded broker",
    ("toolexec/bench/hops.py", "AIOKafkaConsumer"): "bench on its own embedded broker",
}


def _name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _client_calls() -> list[tuple[str, int, str, ast.Call]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            relative = path.relative_to(ROOT).as_posix()
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and (name := _name(node)) is not None and (
                        name.startswith("AIOKafka") or name == "KafkaBroker"):
                    found.append((relative, node.lineno, name, node))
    return found


def _passes_options(name: str, call: ast.Call) -> bool:
    keywords = {k.arg for k in call.keywords}
    if name == "KafkaBroker":
        return "security" in keywords
    # A `**` expansion (arg None) counts unless it is a dict comprehension: those pick
    # tuning keys out of a mapping and would drop the connection options.
    expansions = [k.value for k in call.keywords if k.arg is None]
    return "security_protocol" in keywords or any(
        not isinstance(value, ast.DictComp) for value in expansions)


def test_every_kafka_client_passes_the_connection_options() -> None:
    missing = [f"{path}:{line} {name}(...)" for path, line, name, call in _client_calls()
               if (path, name) not in ALLOWED and not _passes_options(name, call)]
    assert not missing, ("Kafka clients made without the connection options "
                         "(pass **kafka_client_options(settings) / client_options, or "
                         f"allow-list with a reason): {missing}")


def test_the_scan_sees_the_clients() -> None:
    calls = _client_calls()
    names = {name for _, _, name, _ in calls}
    assert {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient",
            "KafkaBroker"} <= names
    assert len(calls) >= 20
    seen = {(path, name) for path, _, name, _ in calls}
    assert set(ALLOWED) <= seen, "an allow-listed client is gone: drop it from ALLOWED"
