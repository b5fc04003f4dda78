"""Forged facts on the log, as anyone who can produce to the broker would write them:
an allow decision for a request the pipeline would deny, an allow for an invocation
nobody requested, a completion raced against the real one. Only facts the pipeline
signed count: a forgery never runs a tool, never reaches a caller, and is
dead-lettered (E3804), never becomes read-model state, and the audit names it.
Forgeries come unsigned and signed with an attacker's key."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer
from aiokafka.partitioner import DefaultPartitioner
from sqlalchemy.ext.asyncio import AsyncEngine

from consumers.steps.derived_events import derive
from consumers.steps.resolve import chain_links
from contracts import topics
from contracts.envelope import Envelope, new_envelope
from contracts.events import ChainResolved, InvokeCompleted, InvokeRequested, PermissionDecided
from contracts.fact_signature import FactSigner, FactVerifier
from contracts.kafka_binding import decode
from domain.chain import resolve_chain
from domain.integrity import seal
from domain.registry import InMemoryRegistry
from projections.audit import audit_findings, verify_audit
from projections.catalog import read_models
from projections.database import make_engine, migrate
from projections.queries import invocation_status
from projections.runner import ProjectionRunner
from tests.chaos.up_process import signing_key
from tests.log_reading import pretend_pipeline_key, put_facts, request_on_the_log
from tests.projection_db import run_to_end
from tests.waiting import WAIT
from toolexec import keys
from toolexec.client import InvocationClient
from toolexec.embedded_broker import EmbeddedBroker
from toolexec.publishing import publish_event
from toolexec.read_models import SIGNED_TOPICS
from toolexec.settings import Settings
from toolexec.sources import load_builtin_sources, load_source
from toolexec.stack import TOPIC_PARTITIONS, Stack

pytestmark = [pytest.mark.security, pytest.mark.integration]

APPEND_ID = Path(__file__).parent.parent / "chaos" / "tools" / "append_id"
PARTITIONS = TOPIC_PARTITIONS[topics.REQUESTS]
NOW = datetime.now(UTC)


def sources() -> list[Any]:
    return load_builtin_sources() + [load_source(APPEND_ID)]


def request(invocation_id: str, ledger: Path, token: str | None = None) -> Envelope:
    return new_envelope(
        InvokeRequested(invocation_id=invocation_id, tool_id="append_id",
                        parameters={"id": invocation_id, "ledger": str(ledger)}),
        source="urn:attacker", partitionkey=invocation_id, correlationid=invocation_id,
        id=str(uuid.uuid4()), time=NOW, extensions={"captoken": token} if token else {})


def forged_allow(of_request: Envelope) -> list[Envelope]:
    """The resolution and the allowing decision a pipeline would write for the request:
    a forger can compute every field, chain integrities included."""
    chain = resolve_chain(InMemoryRegistry(seal(s) for s in sources()), "append_id")
    data: InvokeRequested = of_request.data
    resolved = derive(of_request, ChainResolved(
        invocation_id=data.invocation_id, tool_id="append_id", version=chain.leaf.version,
        chain=chain_links(chain), parameters=data.parameters), step="resolve", now=NOW)
    decided = derive(resolved, PermissionDecided(
        invocation_id=data.invocation_id, tool_id="append_id", version=chain.leaf.version,
        decision="allow", reason="forged", enforced=True, subject="did:example:mallory",
        chain=chain_links(chain), parameters=data.parameters), step="authorize", now=NOW)
    return [resolved, decided]


def partition_of(invocation_id: str) -> int:
    return DefaultPartitioner()(invocation_id.encode(), list(range(PARTITIONS)),
                                list(range(PARTITIONS)))


ATTACKERS = {"unsigned": None, "attacker's key": "attacker"}


def attacker_signer(kind: str | None) -> FactSigner | None:
    return None if kind is None else pretend_pipeline_key()[0]


@pytest_asyncio.fixture
async def broker(tmp_path: Path) -> AsyncIterator[EmbeddedBroker]:
    async with EmbeddedBroker(TOPIC_PARTITIONS, log_dir=tmp_path / "logs") as running:
        yield running


def secured(broker: EmbeddedBroker, tmp_path: Path) -> Settings:
    """A pipeline requiring capability tokens, signing with a key of its own."""
    issuer = keys.ensure_dev_keys(tmp_path / "issuer")
    state = tmp_path / "state"
    return Settings(kafka_bootstrap=broker.bootstrap, state_dir=state,
                    tools_dir=tmp_path / "none", user_tools_dir=None, require_auth=True,
                    token_public_keys=[issuer.public], fact_signing_key=signing_key(state),
                    sandbox="rlimits")


async def publish_tools(stack: Stack) -> None:
    for source in sources():
        await stack.publish(publish_event(source, now=NOW))
    await stack.registry.catch_up(20)


async def dead_letter_codes(bootstrap: str, key: str, at_least: int) -> list[str]:
    """Codes of the dead-letter records of `key`, once there are `at_least`."""
    consumer = AIOKafkaConsumer(topics.DEADLETTER, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest", fetch_max_wait_ms=100)
    await consumer.start()
    codes: list[str] = []
    try:
        async with asyncio.timeout(WAIT):
            async for record in consumer:
                if record.key == key.encode():
                    codes.append(decode(record.key, record.value, record.headers).data.error.code)
                    if len(codes) >= at_least:
                        return codes
    finally:
        await consumer.stop()
    return codes


async def folded(bootstrap: str, verifier: FactVerifier, database: Path) -> AsyncEngine:
    """Every read model folded from the log as `toolexec up` folds it (facts checked
    against the pipeline's keys), into a fresh SQLite database."""
    engine = make_engine(f"sqlite:///{database}")
    await migrate(engine)
    await run_to_end(ProjectionRunner(engine, list(read_models().values()), bootstrap,
                                      verifier=verifier, signed_topics=SIGNED_TOPICS))
    return engine


def places(records: Any) -> set[tuple[str, str | None]]:
    return {(r.type, r.invocation_id) for r in records}


@pytest.mark.parametrize("attacker", ATTACKERS.values(), ids=ATTACKERS.keys())
async def test_a_forged_allow_on_the_log_never_runs_a_request_the_pipeline_denies(
        broker: EmbeddedBroker, tmp_path: Path, attacker: str | None) -> None:
    ledger = tmp_path / "ledger.txt"
    invocation = str(uuid.uuid4())
    wanted = request(invocation, ledger)  # no capability token: the pipeline denies it
    # Written before any pipeline runs: the pipeline meets the forged facts while it
    # reads back where the request's partition stands.
    await put_facts(broker.bootstrap, [wanted])
    await put_facts(broker.bootstrap, forged_allow(wanted), signer=attacker_signer(attacker),
                    partition=partition_of(invocation))
    async with Stack(secured(broker, tmp_path)) as stack:
        await publish_tools(stack)
        async with InvocationClient(stack.bootstrap, verifier=stack.verifier) as client:
            terminal = await client.invoke("append_id", {"id": "after", "ledger": str(ledger)},
                                           timeout=WAIT)  # the pipeline is past the forgery
    assert terminal.data.error.code == "E3203"  # no token: denied
    assert not ledger.exists()  # neither the forged request nor the one after ran
    assert "E3804" in await dead_letter_codes(broker.bootstrap, invocation, at_least=2)


@pytest.mark.parametrize("attacker", ATTACKERS.values(), ids=ATTACKERS.keys())
async def test_an_allow_for_an_invocation_nobody_requested_runs_nothing(
        broker: EmbeddedBroker, tmp_path: Path, attacker: str | None) -> None:
    ledger = tmp_path / "ledger.txt"
    invocation = str(uuid.uuid4())
    async with Stack(secured(broker, tmp_path)) as stack:
        await publish_tools(stack)
        await put_facts(broker.bootstrap, forged_allow(request(invocation, ledger)),
                        signer=attacker_signer(attacker), partition=partition_of(invocation))
        codes = await dead_letter_codes(broker.bootstrap, invocation, at_least=2)
        engine = await folded(broker.bootstrap, stack.verifier, tmp_path / "views.db")
    assert codes == ["E3804", "E3804"]
    assert not ledger.exists()
    try:
        async with engine.connect() as conn:
            assert await invocation_status(conn, invocation) is None  # no state from it
            findings = await audit_findings(conn)
    finally:
        await engine.dispose()
    forged = {("tool.chain.resolved", invocation), ("tool.permission.decided", invocation)}
    assert places(findings.untrusted) == forged
    assert {r.signature for r in findings.untrusted} == {
        "unsigned" if attacker is None else "unknown_key"}
    assert places(findings.orphaned) == forged  # and nobody requested it


@pytest.mark.parametrize("attacker", ATTACKERS.values(), ids=ATTACKERS.keys())
async def test_a_forged_completion_never_reaches_the_caller(
        broker: EmbeddedBroker, tmp_path: Path, attacker: str | None) -> None:
    ledger = tmp_path / "ledger.txt"
    invocation = str(uuid.uuid4())
    settings = secured(broker, tmp_path).model_copy(update={"require_auth": False})
    async with Stack(settings) as stack:
        await publish_tools(stack)
        # An external producer: it follows the facts on the log, where the forgery is.
        async with InvocationClient(stack.bootstrap, verifier=stack.verifier) as client:
            real = asyncio.create_task(client.invoke(
                "append_id", {"id": invocation, "ledger": str(ledger)},
                invocation_id=invocation, timeout=WAIT))
            await request_on_the_log(broker.bootstrap, invocation)
            forged = new_envelope(
                InvokeCompleted(invocation_id=invocation, tool_id="append_id",
                                version="1.0.0", result={"ok": "forged"}, duration_ms=1,
                                attempts=1),
                source="urn:attacker", partitionkey=invocation, correlationid=invocation,
                id=str(uuid.uuid4()), time=NOW)
            await put_facts(broker.bootstrap, [forged], signer=attacker_signer(attacker),
                            partition=partition_of(invocation))
            terminal = await real
        assert client.untrusted >= 1  # it saw the forgery, and left it
        engine = await folded(broker.bootstrap, stack.verifier, tmp_path / "views.db")
    assert terminal.data.result == {"ok": True}
    assert ledger.read_text().split() == [invocation]
    try:
        async with engine.connect() as conn:
            shown = await invocation_status(conn, invocation)
            findings = await audit_findings(conn)
            verified = await verify_audit(conn)
    finally:
        await engine.dispose()
    assert shown is not None and shown["status"] == "completed"
    assert shown["result_summary"] == '{"ok": true}'  # the read model shows the real run
    assert forged.id not in {entry["id"] for entry in shown["timeline"]}
    assert verified.ok  # the chain holds: the forgery is in the trail, marked
    assert [(r.type, r.event_id) for r in findings.untrusted] == [
        ("tool.invoke.completed", forged.id)]
    assert findings.double_terminal_invocations == 1
    assert {(r.event_id == forged.id, r.signature) for r in findings.double_terminal} == {
        (True, "unsigned" if attacker is None else "unknown_key"), (False, "valid")}
    assert not findings.orphaned
