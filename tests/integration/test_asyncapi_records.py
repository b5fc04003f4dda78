"""The AsyncAPI document `toolexec up` serves is true of the records it writes: every
record on every topic matches the headers, correlation id and payload of the message
named by its `ce_type`, and events about a tool carry it as `ce_subject`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import jsonschema
import pytest
from aiokafka import AIOKafkaConsumer
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.integration.gateway_support import (
    RunningGateway,
    refused_api_tool,
    running_gateway,
    wait_until,
)
from tests.waiting import WAIT

pytestmark = pytest.mark.integration


async def _all_records(bootstrap: str, addresses: list[str]) -> list:
    consumer = AIOKafkaConsumer(*addresses, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    records: list = []
    try:
        async with asyncio.timeout(WAIT):
            while not consumer.assignment():
                await asyncio.sleep(0.05)
            ends = await consumer.end_offsets(list(consumer.assignment()))
            while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    records.extend(batch)
    finally:
        await consumer.stop()
    return records


def test_every_record_written_matches_the_served_document(tmp_path: Path) -> None:
    with running_gateway(tmp_path) as gateway:
        assert gateway.invoke("py_echo", {"text": "documented"}).status_code == 200
        assert gateway.invoke("no_such_tool").status_code == 404
        assert gateway.register(refused_api_tool("refused_doc", "doc-service")).is_success
        assert gateway.invoke("refused_doc").status_code == 503
        wait_until(lambda: any(c["service_id"] == "doc-service"
                               for c in gateway.http.get("/v1/circuits").json()["circuits"]))
        _approved_call(gateway)
        document = gateway.http.get("/asyncapi.json").json()
        bootstrap = json.loads((tmp_path / ".toolexec" / "broker" / "broker.json")
                               .read_text())["bootstrap"]
        addresses = [channel["address"] for channel in document["channels"].values()]
        records = asyncio.run(_all_records(bootstrap, addresses))

    messages = {m["name"]: m for m in document["components"]["messages"].values()}
    registry = Registry().with_resource("urn:doc", Resource.from_contents(
        {"components": document["components"]}, default_specification=DRAFT202012))
    seen: set[str] = set()
    for record in records:
        headers = {name: value.decode() for name, value in record.headers}
        message = messages[headers["ce_type"]]
        seen.add(headers["ce_type"])
        jsonschema.validate(headers, message["headers"])
        jsonschema.Draft202012Validator({"$ref": "urn:doc" + message["payload"]["$ref"]},
                                        registry=registry).validate(json.loads(record.value))
        location = message["correlationId"]["location"].removeprefix("$message.header#/")
        assert headers[location]
        tool_id = json.loads(record.value).get("tool_id")
        assert headers.get("ce_subject") == tool_id
    assert {"tool.published", "tool.invoke.requested", "tool.invoke.completed",
            "tool.invoke.failed", "circuit.state.changed", "tool.approval.requested",
            "tool.approval.decided"} <= seen


def _approved_call(gateway: RunningGateway) -> None:
    """A call that waits for an approver, approved (both approval events on the log)."""
    manifest = {"tool_id": "approved_doc", "version": "1.0.0", "tool_type": "script",
                "executor": "python_runtime", "config": {"entrypoint": "main.py"},
                "description": "Prints an empty object, once approved.",
                "approval": {"required": True}}
    assert gateway.register(manifest, [{"path": "main.py", "content": "print('{}')\n"}]
                            ).is_success
    accepted = gateway.invoke("approved_doc", execution_mode="async")
    invocation_id = accepted.json()["invocation_id"]
    wait_until(lambda: any(r["invocation_id"] == invocation_id for r in
                           gateway.http.get("/v1/approvals").json()["approvals"]))
    assert gateway.http.post(f"/v1/invocations/{invocation_id}/approval",
                             json={"decision": "approve"}).status_code == 202
    wait_until(lambda: gateway.http.get(f"/v1/invocations/{invocation_id}").json()["status"]
               == "completed")
