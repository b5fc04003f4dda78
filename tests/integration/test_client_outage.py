"""The invocation client across a broker outage: it reconnects, and what it cannot
see to its end it reports with a code instead of hanging."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from tests.cli_process import toolexec
from tests.log_reading import pretend_pipeline_key, put_facts, request_on_the_log, terminal_failure
from tests.s3_store import s3_store, tansu_s3_env
from toolexec.client import InvocationClient, InvocationNotDelivered, InvocationUnresolved
from toolexec.embedded_broker import EmbeddedBroker
from toolexec.runtime_file import acquire_up_lock
from toolexec.settings import Settings
from toolexec.stack import TOPIC_PARTITIONS

pytestmark = pytest.mark.integration




async def test_a_request_the_broker_cannot_take_is_reported_as_not_delivered(
        tmp_path: Path) -> None:
    _, verifier = pretend_pipeline_key()
    async with EmbeddedBroker(TOPIC_PARTITIONS, log_dir=tmp_path) as broker, \
            InvocationClient(broker.bootstrap, verifier=verifier) as client:
        await broker.stop()
        with pytest.raises(InvocationNotDelivered) as reported:
            await client.invoke("echo", invocation_id="inv-down", timeout=1.5)
    assert reported.value.code == "E3001"
    assert reported.value.details["invocation_id"] == "inv-down"


async def test_a_request_without_a_result_in_time_is_reported_as_unresolved(
        tmp_path: Path) -> None:
    _, verifier = pretend_pipeline_key()
    async with EmbeddedBroker(TOPIC_PARTITIONS, log_dir=tmp_path) as broker, \
            InvocationClient(broker.bootstrap, verifier=verifier) as client:  # no pipeline
        with pytest.raises(InvocationUnresolved) as reported:
            await client.invoke("echo", invocation_id="inv-slow", timeout=1.0)
    assert reported.value.code == "E3002"
    assert reported.value.details == {"invocation_id": "inv-slow", "delivered": True}


async def test_the_client_reconnects_after_a_broker_restart(tmp_path: Path) -> None:
    signer, verifier = pretend_pipeline_key()
    with s3_store() as (endpoint, _):
        # Tansu's s3 fetch answers empty when its reads outlast a 5 ms fetch wait.
        async with EmbeddedBroker(TOPIC_PARTITIONS, log_dir=tmp_path, storage_engine="s3://toolexec/",
                                  env=tansu_s3_env(endpoint)) as broker, \
                InvocationClient(broker.bootstrap, fetch_waits=(100, 100),
                                 verifier=verifier) as client:
            await broker.restart()
            waiting = asyncio.create_task(
                client.invoke("echo", invocation_id="inv-after", timeout=30))
            await request_on_the_log(broker.bootstrap, "inv-after")
            # What a pipeline would do, signed with the key the client trusts:
            await put_facts(broker.bootstrap, [terminal_failure("inv-after")], signer=signer)
            terminal = await waiting
    assert (terminal.type, terminal.correlationid) == ("tool.invoke.failed", "inv-after")


async def test_run_reports_e3002_when_no_result_arrives_in_time(tmp_path: Path) -> None:
    async with EmbeddedBroker(TOPIC_PARTITIONS, log_dir=tmp_path) as broker:
        # A "running system" whose pipeline never answers: the broker, no consumers.
        state = tmp_path / ".toolexec"
        state.mkdir()
        lock = acquire_up_lock(Settings(state_dir=state))  # held by a running `up`
        assert lock is not None
        (state / "runtime.json").write_text(json.dumps(
            {"kafka_bootstrap": broker.bootstrap, "pid": os.getpid()}))
        try:
            run = await asyncio.to_thread(toolexec, "run", "echo", "--timeout", "1", "--json",
                                          cwd=tmp_path)
        finally:
            lock.release()
    assert run.returncode == 1, run.stderr
    assert json.loads(run.stdout)["error"]["code"] == "E3002"
