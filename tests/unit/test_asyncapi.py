"""The AsyncAPI document: valid for the official parser, and true of the records
toolexec writes (headers, correlation id, key, payload), one channel per topic."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from contracts import topics
from contracts.events import EVENT_MODELS, EventData
from contracts.kafka_binding import encode
from tests.unit.test_kafka_binding import SAMPLES, envelope_of
from toolexec.asyncapi import asyncapi_document

PARSER_DIR = Path(__file__).resolve().parents[2] / ".ci" / "asyncapi"
DOCUMENT = asyncapi_document()


def _parser_ready() -> str | None:
    """None when the official parser can run, else why not (the skip message)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return ("node/npm not installed: the AsyncAPI document is not checked by the "
                "official parser (.ci/run installs them with apt-get)")
    if (PARSER_DIR / "node_modules" / "@asyncapi" / "parser").is_dir():
        return None
    done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--silent"],
                          cwd=PARSER_DIR, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return (f"could not install @asyncapi/parser from npm into {PARSER_DIR} "
                f"(offline?): {done.stderr.strip()[-300:]}")
    return None


def test_official_parser_finds_nothing_to_report() -> None:
    missing = _parser_ready()
    if missing:
        pytest.skip(missing)
    done = subprocess.run(["node", str(PARSER_DIR / "validate.mjs")], input=json.dumps(DOCUMENT),
                          capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(done.stdout)["diagnostics"] == []


def test_parser_check_can_fail() -> None:
    """The check above reports a broken document (so its empty list means something)."""
    missing = _parser_ready()
    if missing:
        pytest.skip(missing)
    broken = json.loads(json.dumps(DOCUMENT))
    broken["operations"]["sendInvocations"]["channel"] = {"$ref": "#/channels/nowhere"}
    done = subprocess.run(["node", str(PARSER_DIR / "validate.mjs")], input=json.dumps(broken),
                          capture_output=True, text=True, timeout=300, check=True)
    assert any(d["severity"] == 0 for d in json.loads(done.stdout)["diagnostics"])


def test_one_channel_per_topic_with_one_named_message_per_event_type() -> None:
    channels = DOCUMENT["channels"]
    assert sorted(c["address"] for c in channels.values()) == sorted(topics.ALL_TOPICS)
    messages = DOCUMENT["components"]["messages"]
    for channel in channels.values():
        for ref in channel["messages"].values():
            message = messages[ref["$ref"].rsplit("/", 1)[1]]
            assert topics.TOPIC_OF_TYPE[message["name"]] == channel["address"]
    assert sorted(m["name"] for m in messages.values()) == sorted(EVENT_MODELS)
    assert len({m["title"] for m in messages.values()}) == len(EVENT_MODELS)


def test_toolexec_receives_requests_and_sends_the_rest() -> None:
    actions = {DOCUMENT["channels"][op["channel"]["$ref"].rsplit("/", 1)[1]]["address"]:
               op["action"] for op in DOCUMENT["operations"].values()}
    assert actions == {t: "receive" if t == topics.REQUESTS else "send"
                       for t in topics.ALL_TOPICS}


def _message_of(event_type: str) -> dict:
    return next(m for m in DOCUMENT["components"]["messages"].values()
                if m["name"] == event_type)


def _payload_validator(message: dict) -> jsonschema.Validator:
    """Validates against the message's payload, resolving `#/components/...` in DOCUMENT."""
    resource = Resource.from_contents({"components": DOCUMENT["components"]},
                                      default_specification=DRAFT202012)
    registry = Registry().with_resource("urn:asyncapi", resource)
    return jsonschema.Draft202012Validator({"$ref": "urn:asyncapi" + message["payload"]["$ref"]},
                                           registry=registry)


@pytest.mark.parametrize("data", SAMPLES, ids=lambda d: d.EVENT_TYPE)
def test_every_record_matches_its_message(data: EventData) -> None:
    record = encode(envelope_of(data))
    headers = {name: value.decode() for name, value in record.headers}
    message = _message_of(data.EVENT_TYPE)
    jsonschema.validate(headers, message["headers"])
    location = message["correlationId"]["location"]
    assert location.startswith("$message.header#/")
    assert headers[location.removeprefix("$message.header#/")] == envelope_of(data).correlationid
    assert message["bindings"]["kafka"]["key"]["type"] == "string"
    _payload_validator(message).validate(json.loads(record.value))


def test_headers_of_another_type_do_not_match() -> None:
    record = encode(envelope_of(SAMPLES[0]))
    headers = {name: value.decode() for name, value in record.headers}
    other = next(t for t in EVENT_MODELS if t != SAMPLES[0].EVENT_TYPE)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(headers, _message_of(other)["headers"])


def test_payload_without_a_required_field_does_not_match() -> None:
    with pytest.raises(jsonschema.ValidationError):
        _payload_validator(_message_of("tool.invoke.requested")).validate({"tool_id": "hello"})
