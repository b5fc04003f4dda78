"""Contracts: topics, error registry, event models, envelopes and exported schemas."""

from __future__ import annotations

import ast
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

import contracts
from contracts import topics
from contracts.envelope import Envelope, derived_event_id, new_envelope
from contracts.errors import ERROR_CODES, ErrorInfo, http_status_for
from contracts.events import (
    EVENT_MODELS,
    SCHEMA_VERSION,
    ChainLink,
    ExecutionStarted,
    InvokeCancelRequested,
    InvokeFailed,
    InvokeRequested,
    PublishedFile,
)
from contracts.export import (
    ERRORS_DOCUMENT,
    SCHEMA_DIRECTORY,
    export_schemas,
    render,
    render_error_table,
    schema_filename,
)

NOW = datetime(2025, 3, 1, 9, 30, tzinfo=UTC)
CATALOG = {
    "tool.published", "tool.publish.rejected", "tool.lifecycle.changed",
    "tool.definition.pinned", "tool.definition.drifted", "tool.definition.approved",
    "tool.invoke.requested", "tool.chain.resolved", "tool.permission.decided",
    "tool.execution.started", "tool.execution.progressed", "tool.execution.checkpointed", "tool.execution.finished",
    "tool.invoke.completed", "tool.invoke.failed", "tool.invoke.cancel.requested",
    "tool.approval.requested", "tool.approval.decided", "tool.approval.received",
    "circuit.state.changed", "policy.updated", "callback.delivered", "callback.failed",
}
CONTRACTS_DIR = Path(contracts.__file__).parent


def request() -> InvokeRequested:
    return InvokeRequested(invocation_id="inv-1", tool_id="hello")


# --- topics --------------------------------------------------------------------------


def test_every_catalog_type_has_a_model_and_a_topic() -> None:
    assert CATALOG | {"deadletter.recorded"} == set(EVENT_MODELS) == set(topics.TOPIC_OF_TYPE)
    assert set(topics.TOPIC_OF_TYPE.values()) == set(topics.ALL_TOPICS)


def test_commands_go_to_the_requests_topic_and_facts_to_the_invocations_topic() -> None:
    invocation_types = {t for t in CATALOG if t.startswith(("tool.invoke", "tool.execution",
                                                            "tool.chain", "tool.permission",
                                                            "tool.approval"))}
    commands = {"tool.invoke.requested", "tool.invoke.cancel.requested",
                "tool.approval.decided"}
    assert commands == topics.COMMAND_TYPES
    assert {topics.TOPIC_OF_TYPE[t] for t in commands} == {"toolexec.requests"}
    assert {topics.TOPIC_OF_TYPE[t] for t in invocation_types - commands} == {
        "toolexec.invocations"}
    assert topics.TOPIC_OF_TYPE["tool.published"] == "toolexec.registry"
    assert {topics.TOPIC_OF_TYPE[t] for t in CATALOG if t.startswith("tool.definition")} == {
        "toolexec.registry"}
    assert topics.TOPIC_OF_TYPE["circuit.state.changed"] == "toolexec.circuits"
    assert topics.TOPIC_OF_TYPE["policy.updated"] == "toolexec.policies"
    assert topics.TOPIC_OF_TYPE["deadletter.recorded"] == "toolexec.deadletter"


# --- errors --------------------------------------------------------------------------


def test_registry_holds_the_spec_codes_with_their_statuses() -> None:
    # the spec's 58, E3804 (a fact the pipeline did not sign), E3805 and E3806 (audit
    # export), E3107 (publisher signature missing or untrusted), E3108 (an MCP tool
    # definition changed since it was approved: a state conflict, not a missing right),
    # E3208-E3210 (approvals)
    assert len(ERROR_CODES) == 66
    assert http_status_for("E3209") == 403
    assert http_status_for("E3804") == 403
    assert http_status_for("E3107") == 403
    assert http_status_for("E3108") == 409
    assert http_status_for("E3004") == 400
    assert http_status_for("E3101") == 404
    assert http_status_for("E3105") == 422
    assert http_status_for("E3201") == 401
    assert http_status_for("E3501") == 503
    assert http_status_for("E3703") == 499
    assert ERROR_CODES["E3402"].title == "Tool timeout"
    assert ERROR_CODES["E3206"].family == "permission"


def test_unregistered_code_maps_to_internal_error_status() -> None:
    assert http_status_for("E3999") == 500


@pytest.mark.parametrize("code", ["E999", "E40001", "e3001", "X3001", ""])
def test_error_info_rejects_codes_outside_the_e3xxx_range(code: str) -> None:
    with pytest.raises(ValidationError):
        ErrorInfo(code=code, message="x")


def test_error_info_details_must_be_json() -> None:
    assert ErrorInfo(code="E3301", message="bad", details={"issues": [{"path": "$"}]})
    with pytest.raises(ValidationError):
        ErrorInfo(code="E3301", message="bad", details={"when": object()})


# --- event models --------------------------------------------------------------------


def test_models_are_frozen() -> None:
    with pytest.raises(ValidationError):
        request().tool_id = "other"  # type: ignore[misc]


def test_models_reject_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="extra"):
        InvokeRequested(invocation_id="inv-1", tool_id="hello", captoken="jwt")


def test_request_defaults_describe_a_plain_sync_call() -> None:
    req = request()
    assert (req.version_range, req.parameters, req.lockfile, req.execution_mode) == (
        "*", {}, None, "sync")


def test_integrity_and_file_hashes_are_checked_for_shape() -> None:
    with pytest.raises(ValidationError):
        ChainLink(tool_id="t", version="1.0.0", integrity="md5:abc", tool_type="script",
                  executor=None)
    with pytest.raises(ValidationError):
        PublishedFile(path="a", sha256="ABC", is_executable=False, size=0, content_b64gz="")


def test_attempts_start_at_one() -> None:
    with pytest.raises(ValidationError):
        ExecutionStarted(invocation_id="i", attempt=0, tool_id="t", version="1",
                         primitive="subprocess", sandbox="none", plan_summary={})


def test_failure_stage_is_one_of_the_pipeline_stages() -> None:
    error = ErrorInfo(code="E3000", message="boom")
    assert InvokeFailed(invocation_id="i", error=error, stage="request").tool_id is None
    with pytest.raises(ValidationError):
        InvokeFailed(invocation_id="i", error=error, stage="somewhere")


def test_deadline_must_be_timezone_aware() -> None:
    with pytest.raises(ValidationError):
        InvokeRequested(invocation_id="i", tool_id="t", deadline=datetime(2025, 1, 1))


def test_every_model_documents_every_field() -> None:
    for event_type, model in EVENT_MODELS.items():
        assert model.__doc__, event_type
        for name, field in model.model_fields.items():
            assert field.description, f"{event_type}.{name}"
        assert event_type == model.EVENT_TYPE
        released = {"tool.published": "3", "tool.execution.checkpointed": "2"}
        assert SCHEMA_VERSION[event_type] == released.get(event_type, "1")


# --- envelope ------------------------------------------------------------------------


def test_derived_ids_are_deterministic_and_distinct_per_step() -> None:
    first = derived_event_id("cause-1", "resolve")
    assert first == derived_event_id("cause-1", "resolve")
    assert first != derived_event_id("cause-1", "authorize")
    assert first != derived_event_id("cause-2", "resolve")


def test_derived_ids_survive_releases() -> None:
    # Pinned: a changed namespace would make every redelivery look like a new event.
    assert derived_event_id("cause-1", "resolve") == "c92ca426-c7c5-5fac-a69b-3cc7f56a0dd8"


def test_new_envelope_takes_type_from_data_and_derives_id_from_cause() -> None:
    env = new_envelope(InvokeCancelRequested(invocation_id="inv-1"), source="urn:test",
                       partitionkey="inv-1", correlationid="inv-1", causationid="req-1",
                       time=NOW)
    assert env.type == "tool.invoke.cancel.requested"
    assert env.id == derived_event_id("req-1", "tool.invoke.cancel.requested")


def test_event_without_cause_needs_an_explicit_id() -> None:
    with pytest.raises(ValueError, match="id is required"):
        new_envelope(request(), source="urn:test", partitionkey="inv-1",
                     correlationid="inv-1", time=NOW)


@pytest.mark.parametrize(
    "overrides",
    [
        {"time": datetime(2025, 1, 1)},
        {"type": "tool.published"},
        {"extensions": {"Bad-Name": "x"}},
        {"extensions": {"partitionkey": "x"}},
        {"extensions": {"captoken": 5}},
        {"correlationid": ""},
    ],
)
def test_invalid_envelopes_are_refused(overrides: dict) -> None:
    fields: dict = dict(id="e-1", type="tool.invoke.requested", source="urn:test", time=NOW,
                        data=request(), correlationid="inv-1", partitionkey="inv-1")
    fields.update(overrides)
    with pytest.raises(ValueError, match="invalid envelope"):
        Envelope(**fields)


# --- schemas -------------------------------------------------------------------------


@pytest.mark.parametrize("event_type", sorted(EVENT_MODELS))
def test_exported_schema_matches_the_model(event_type: str) -> None:
    path = SCHEMA_DIRECTORY / schema_filename(event_type)
    assert path.is_file(), f"missing {path}; run python -m contracts.export"
    assert path.read_text(encoding="utf-8") == render(event_type), (
        f"{path.name} drifted from the model; run python -m contracts.export")


def test_the_error_table_in_docs_lists_every_code_of_the_registry() -> None:
    assert ERRORS_DOCUMENT.read_text(encoding="utf-8") == render_error_table(), (
        "docs/errors.md drifted from contracts/errors.py; run python -m contracts.export")
    rows = [line.split(" | ") for line in render_error_table().splitlines()
            if line.startswith("| E3")]
    assert {row[0].lstrip("| "): int(row[2]) for row in rows} == {
        code: info.http_status for code, info in ERROR_CODES.items()}


def test_export_writes_one_identified_schema_per_type(tmp_path: Path) -> None:
    written = export_schemas(tmp_path)
    assert sorted(p.name for p in written) == sorted(f"{t}.schema.json" for t in EVENT_MODELS)
    schema = json.loads((tmp_path / "tool.invoke.requested.schema.json").read_text())
    assert schema["$id"] == "urn:toolexec:schema:tool.invoke.requested:v1"
    assert schema["title"] == "tool.invoke.requested"
    assert schema["additionalProperties"] is False


# --- layering ------------------------------------------------------------------------


def test_contracts_import_only_stdlib_pydantic_cloudevents_and_the_crypto_libraries() -> None:
    # cryptography (signing, keys) and nacl (libsodium's verification): the pipeline's
    # fact signatures are part of the wire contract
    allowed = set(sys.stdlib_module_names) | {"pydantic", "cloudevents", "cryptography",
                                              "nacl", "contracts"}
    for path in CONTRACTS_DIR.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = [node.module.split(".")[0]]
            else:
                continue
            assert set(roots) <= allowed, f"{path.name} imports {roots}"
