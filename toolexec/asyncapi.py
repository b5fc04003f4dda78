"""The AsyncAPI 3.1 document of the event contracts, for code generators and catalogs.

One channel per topic (`registry`, `requests`, `invocations`...), holding one named
message per CloudEvent type it carries. Each message has its CloudEvents binary-mode
Kafka headers as a header schema (`ce_type` and `ce_dataschema` fixed to its type and
contract version), its key as a Kafka message binding, `ce_correlationid` (every
record carries it) as its correlation id and the contract's JSON Schema (pydantic) as
its payload. Toolexec receives on `toolexec.requests` and sends on every other topic.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic.json_schema import models_json_schema

from consumers.runtime.recovery import RESUME_HEADER
from contracts import topics
from contracts.events import EVENT_MODELS, EventData, dataschema_uri
from contracts.fact_signature import KID, SET, SIG
from contracts.kafka_binding import CE_PREFIX, CONTENT_TYPE_HEADER, DATA_CONTENT_TYPE, SPECVERSION

KAFKA_BINDING_VERSION: Final = "0.5.0"
CORRELATION_HEADER: Final = CE_PREFIX + "correlationid"

CHANNELS: Final[dict[str, tuple[str, str]]] = {
    "registry": (topics.REGISTRY, "tool_id"),
    "requests": (topics.REQUESTS, "invocation_id"),
    "invocations": (topics.INVOCATIONS, "invocation_id"),
    "circuits": (topics.CIRCUITS, "service_id"),
    "policies": (topics.POLICIES, "policy_set_id"),
    "deadletter": (topics.DEADLETTER, "the original record's key"),
    "callbacks": (topics.CALLBACKS, "invocation_id"),
}
"""Channel id -> (topic, what the record key is)."""

DESCRIPTION = (
    "Every record is a CloudEvent 1.0 in Kafka binary mode: attributes as `ce_*` headers "
    "(`content-type` for datacontenttype), the data as JSON in the value, the key = the "
    "aggregate id (the `ce_partitionkey` extension). Producers write commands "
    "(tool.invoke.requested, tool.invoke.cancel.requested, tool.approval.decided) to "
    "`toolexec.requests` only; "
    "the pipeline writes the facts of an invocation to the same partition number of "
    "`toolexec.invocations` (both topics have the same partition count), signed "
    "(`ce_sigkid`, `ce_sigset`, `ce_sig`) and with a `toolexec-resume` header. "
    "Consumer-group settings for third-party clients: docs/kafka-clients.md."
)


def _string(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


COMMON_HEADERS: Final[dict[str, dict[str, Any]]] = {
    CE_PREFIX + "specversion": _string("CloudEvents spec version.", const=SPECVERSION),
    CE_PREFIX + "id": _string("Event id; derived events have deterministic ids, so "
                              "consumers de-duplicate on it."),
    CE_PREFIX + "source": _string("URI of the component that emitted the event."),
    CE_PREFIX + "type": _string("Event type."),
    CE_PREFIX + "subject": _string("The tool id, on events about one tool (absent on the "
                                   "others)."),
    CE_PREFIX + "time": _string("When the event happened (RFC 3339, UTC).",
                                format="date-time"),
    CONTENT_TYPE_HEADER: _string("CloudEvents datacontenttype of the value.",
                                 const=DATA_CONTENT_TYPE),
    CE_PREFIX + "dataschema": _string("The contract version of the data (its JSON Schema "
                                      "`$id`)."),
    CORRELATION_HEADER: _string("Id shared by every event of one invocation (or "
                                "publication, policy change); the correlation id."),
    CE_PREFIX + "causationid": _string("Id of the event this one was derived from."),
    CE_PREFIX + "partitionkey": _string("The record key: the aggregate id."),
    CE_PREFIX + "traceparent": _string("W3C trace context, propagated from the request."),
    CE_PREFIX + "tracestate": _string("W3C trace state, propagated with traceparent."),
}
REQUIRED_HEADERS: Final = [CE_PREFIX + "specversion", CE_PREFIX + "id", CE_PREFIX + "source",
                           CE_PREFIX + "type", CE_PREFIX + "time", CONTENT_TYPE_HEADER,
                           CE_PREFIX + "dataschema", CORRELATION_HEADER,
                           CE_PREFIX + "partitionkey"]
FACT_HEADERS: Final[dict[str, dict[str, Any]]] = {
    CE_PREFIX + KID: _string("Id of the Ed25519 key that signed the fact's batch."),
    CE_PREFIX + SET: _string("Digests of every fact of the signed batch (32 hex each), "
                             "then, if any, the link to the batch signed before it on the "
                             "partition (64 hex), joined by `.`."),
    CE_PREFIX + SIG: _string("Ed25519 signature over `sigkid.sigset`, base64url."),
    RESUME_HEADER: _string("`<L> <F>`: where a new owner of the partition resumes.",
                           pattern=r"^\d+ \d+$"),
}
REQUEST_HEADERS: Final[dict[str, dict[str, Any]]] = {
    CE_PREFIX + "captoken": _string("Capability token (JWT) of the producer, or "
                                    "`sealed1.<identity>.<sealed>`: sealed to the "
                                    "pipeline's X25519 key and bound to this command "
                                    "(contracts/token_seal.py); only on "
                                    "tool.invoke.requested and (the approver's) on "
                                    "tool.approval.decided."),
}


TOKEN_CARRIERS: Final = frozenset({"tool.invoke.requested", "tool.approval.decided"})


def _headers(event_type: str, model: type[EventData]) -> dict[str, Any]:
    properties = dict(COMMON_HEADERS)
    properties[CE_PREFIX + "type"] = {**properties[CE_PREFIX + "type"], "const": event_type}
    properties[CE_PREFIX + "dataschema"] = {
        **properties[CE_PREFIX + "dataschema"],
        "const": dataschema_uri(event_type, model.SCHEMA_VERSION)}
    topic = topics.TOPIC_OF_TYPE[event_type]
    if topic == topics.INVOCATIONS:
        properties.update(FACT_HEADERS)
    if event_type in TOKEN_CARRIERS:
        properties.update(REQUEST_HEADERS)
    return {"type": "object", "properties": properties, "required": list(REQUIRED_HEADERS)}


def _summary(model: type[EventData]) -> str:
    return " ".join((model.__doc__ or model.EVENT_TYPE).split())


def _message(event_type: str, model: type[EventData], key: str) -> dict[str, Any]:
    return {
        "name": event_type,
        "title": model.__name__,
        "summary": _summary(model),
        "contentType": DATA_CONTENT_TYPE,
        "headers": _headers(event_type, model),
        "correlationId": {"location": f"$message.header#/{CORRELATION_HEADER}",
                          "description": "The invocation (or publication) the event is part of."},
        "payload": {"$ref": f"#/components/schemas/{model.__name__}"},
        "bindings": {"kafka": {"key": {"type": "string", "description": f"Record key: {key}."},
                               "bindingVersion": KAFKA_BINDING_VERSION}},
    }


def _schemas() -> dict[str, Any]:
    _, document = models_json_schema(
        [(model, "validation") for model in EVENT_MODELS.values()],
        ref_template="#/components/schemas/{model}")
    return document["$defs"]


def asyncapi_document(bootstrap: str = "localhost:9092", version: str = "0.1.0") -> dict[str, Any]:
    """AsyncAPI 3.1 document (a JSON-able dict) of every topic and event type."""
    by_topic: dict[str, list[str]] = {}
    for event_type in sorted(EVENT_MODELS):
        by_topic.setdefault(topics.TOPIC_OF_TYPE[event_type], []).append(event_type)
    messages: dict[str, Any] = {}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for channel, (topic, key) in CHANNELS.items():
        names = {event_type: EVENT_MODELS[event_type].__name__
                 for event_type in by_topic.get(topic, [])}
        for event_type, name in names.items():
            messages[name] = _message(event_type, EVENT_MODELS[event_type], key)
        channels[channel] = {
            "address": topic,
            "title": topic,
            "description": f"Kafka topic `{topic}`; record key = {key}.",
            "messages": {name: {"$ref": f"#/components/messages/{name}"}
                         for name in names.values()},
            "bindings": {"kafka": {"topic": topic, "bindingVersion": KAFKA_BINDING_VERSION}},
        }
        action = "receive" if topic == topics.REQUESTS else "send"
        operations[f"{action}{channel.title()}"] = {
            "action": action,
            "channel": {"$ref": f"#/channels/{channel}"},
            "summary": f"toolexec {'reads commands from' if action == 'receive' else 'writes'} "
                       f"`{topic}`.",
            "messages": [{"$ref": f"#/channels/{channel}/messages/{name}"}
                         for name in names.values()],
        }
    return {
        "asyncapi": "3.1.0",
        "info": {"title": "toolexec events", "version": version, "description": DESCRIPTION},
        "defaultContentType": DATA_CONTENT_TYPE,
        "servers": {"development": {"host": bootstrap, "protocol": "kafka",
                                    "description": "The toolexec broker (embedded Tansu or "
                                                   "Kafka)."}},
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": _schemas()},
    }


def main() -> None:
    """`python -m toolexec.asyncapi > asyncapi.json` exports the document."""
    import json
    import sys

    json.dump(asyncapi_document(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
