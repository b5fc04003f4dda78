"""Pure folds of the SQL read models: event in, rows out, no database."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from domain import redaction
from projections.audit_document import GENESIS, audit_document, audit_entry, chain_hash
from projections.circuit_table import evolve_circuit
from projections.invocations import evolve_invocation
from projections.registry_table import fold_registry
from projections.store import Rows
from tests.projection_events import (
    at,
    captoken,
    circuit,
    invocation,
    lifecycle,
    published,
)


def _registry(*events) -> Rows:
    rows: Rows = {"registry_tools": [], "registry_versions": []}
    for event in events:
        rows = fold_registry(rows, event)
    return rows


def _invocation(events):
    row = None
    for event in events:
        row = evolve_invocation(row, event)
    return row


# --- registry ----------------------------------------------------------------------------

def test_published_tool_gets_a_tool_row_and_a_version_row() -> None:
    rows = _registry(published("grep", "1.0.0", tags=["text", "search"],
                               description="Find lines"))
    tool = rows["registry_tools"][0]
    assert (tool["current_version"], tool["latest_version"], tool["versions_count"]) == (
        "1.0.0", "1.0.0", 1)
    assert tool["tags"] == ["search", "text"]
    assert "find lines" in tool["search_text"] and "grep" in tool["search_text"]
    version = rows["registry_versions"][0]
    assert version["integrity"].startswith("sha256:")
    assert version["files"] == [{"path": "main.py", "sha256": "cd" * 32, "size": 3,
                                 "is_executable": False}]


def test_current_version_is_the_highest_active_one() -> None:
    rows = _registry(published("grep", "1.2.0"), published("grep", "1.10.0"),
                     published("grep", "1.9.0"), lifecycle("grep", "deprecated", "1.10.0"))
    tool = rows["registry_tools"][0]
    assert tool["current_version"] == "1.9.0"
    assert tool["latest_version"] == "1.10.0"
    assert [v["version"] for v in rows["registry_versions"]] == ["1.2.0", "1.9.0", "1.10.0"]


def test_lifecycle_without_version_moves_every_version() -> None:
    rows = _registry(published("grep", "1.0.0"), published("grep", "2.0.0"),
                     lifecycle("grep", "removed"))
    assert {v["lifecycle"] for v in rows["registry_versions"]} == {"removed"}
    assert rows["registry_tools"][0]["current_version"] is None
    assert rows["registry_tools"][0]["lifecycle"] == "removed"


def test_republishing_a_version_keeps_the_first_publication() -> None:
    rows = _registry(published("grep", "1.0.0"),
                     published("grep", "1.0.0", integrity="sha256:" + "ef" * 32))
    assert rows["registry_versions"][0]["integrity"] == "sha256:" + "ab" * 32


def test_lifecycle_of_an_unknown_tool_adds_nothing() -> None:
    assert _registry(lifecycle("ghost", "deprecated")) == {"registry_tools": [],
                                                           "registry_versions": []}


# --- invocations -------------------------------------------------------------------------

def test_completed_invocation_row_has_status_result_and_timeline() -> None:
    row = _invocation(invocation("inv-1"))
    assert row["status"] == "completed"
    assert (row["tool_id"], row["version"], row["subject"], row["attempts"]) == (
        "py_echo", "1.0.0", "bob", 1)
    assert row["duration_ms"] == 12.5
    assert [e["type"] for e in row["timeline"]][0] == "tool.invoke.requested"
    assert len(row["timeline"]) == 6
    assert "bob@example.com" in row["result_summary"]  # the caller's result, as returned
    assert row["finished_at"] is not None and row["error_code"] is None


def test_failed_invocation_keeps_error_code_and_stage() -> None:
    row = _invocation(invocation("inv-2", outcome="failed"))
    assert (row["status"], row["error_code"], row["failed_stage"]) == ("failed", "E3401",
                                                                         "execute")


def test_denied_invocation_never_reaches_authorized() -> None:
    row = _invocation(invocation("inv-3", outcome="denied"))
    assert (row["status"], row["error_code"]) == ("failed", "E3204")
    assert [e.get("decision") for e in row["timeline"] if "decision" in e] == ["deny"]


def test_terminal_status_is_final() -> None:
    events = invocation("inv-4")
    row = _invocation([*events, events[3]])  # a late execution.started
    assert row["status"] == "completed"


def test_subject_comes_from_the_token_before_authorization() -> None:
    row = _invocation(invocation("inv-5", token=captoken("carol", "j9"))[:1])
    assert (row["status"], row["subject"]) == ("requested", "carol")


def test_invocation_first_seen_mid_way_still_gets_a_row() -> None:
    row = _invocation(invocation("inv-6")[2:])
    assert row["status"] == "completed" and row["requested_at"] is None


# --- circuits ----------------------------------------------------------------------------

def test_circuit_row_follows_the_latest_transition() -> None:
    row = evolve_circuit(None, circuit("api.example", "closed", "open", failures=5, when=at(1)))
    row = evolve_circuit(row, circuit("api.example", "open", "half_open", when=at(31)))
    assert (row["state"], row["previous_state"], row["transitions"]) == ("half_open", "open", 2)
    assert row["since"].startswith("2026-11-22T12:00:31")


# --- audit -------------------------------------------------------------------------------

def test_audit_document_is_a_cloudevent_with_data_redacted() -> None:
    event = invocation("inv-7", parameters={"password": "hunter2", "note": "call 415-555-2671"})[0]
    document, count = audit_document(event)
    assert (document["specversion"], document["type"], document["id"]) == (
        "1.0", "tool.invoke.requested", "req-inv-7")
    assert document["data"]["parameters"]["password"] == "[REDACTED]"
    assert "415-555-2671" not in json.dumps(document)
    assert count == 2


def test_capability_token_never_enters_the_audit() -> None:
    token = captoken("carol", "jti-42")
    event = invocation("inv-8", token=token)[0]
    document, _ = audit_document(event)
    text = json.dumps(document)
    assert token not in text and "captoken" not in document
    assert (document["capsubject"], document["capjti"]) == ("carol", "jti-42")


def test_published_files_are_kept_by_digest_not_content() -> None:
    document, _ = audit_document(published("grep", "1.0.0"))
    assert document["data"]["files"] == [{"path": "main.py", "sha256": "cd" * 32,
                                          "is_executable": False, "size": 3}]


def test_audit_entries_chain_by_hash() -> None:
    first, second = invocation("inv-9")[:2]
    a = audit_entry(first, topic="t", partition=0, offset=0, prev_hash=GENESIS)
    b = audit_entry(second, topic="t", partition=0, offset=1, prev_hash=a.hash)
    assert b.prev_hash == a.hash != b.hash
    assert chain_hash(a.hash, b.as_row(), json.loads(b.document)) == b.hash
    tampered = {**b.as_row(), "tool_id": "other"}
    assert chain_hash(a.hash, tampered, json.loads(b.document)) != b.hash


@given(st.text(alphabet="0123456789 .-:+()@abcxyz", max_size=60))
def test_the_audit_record_of_an_event_is_the_same_on_every_replay(note: str) -> None:
    event = invocation("inv-10", parameters={"note": note, "password": "hunter2"})[0]
    first = audit_entry(event, topic="toolexec.requests", partition=0, offset=3,
                        prev_hash=GENESIS)
    redaction._redact_short_text.cache_clear()  # a fresh process replaying the log
    again = audit_entry(event, topic="toolexec.requests", partition=0, offset=3,
                        prev_hash=GENESIS)
    assert again == first and "hunter2" not in first.document
