"""SQL tables of the read models (SQLAlchemy Core), one metadata for one Alembic history.

Times are stored as fixed-width UTC text (`iso`), so they sort and compare the same
way on SQLite and PostgreSQL and survive a round trip unchanged (rebuilt tables must
equal incremental ones value for value). JSON columns hold redacted JSON values.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

ISO_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


@lru_cache(maxsize=4096)  # every read model formats each event's time: once per event
def iso(moment: datetime) -> str:
    """`moment` as fixed-width UTC text, e.g. ``2026-11-22T12:00:00.000000Z``."""
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    # isoformat is the same text as strftime(ISO_FORMAT) for years 1000..9999, faster.
    return moment.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


# --- bookkeeping of every runner -------------------------------------------------------

projection_offsets = Table(
    "projection_offsets", metadata,
    Column("consumer", String(100), primary_key=True),
    Column("topic", String(200), primary_key=True),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("next_offset", BigInteger, nullable=False),
    Column("last_record", String(64)),
)
"""Next offset to read per (read model, topic, partition); written with the rows, with
the fingerprint of the record just before it (`last_record`): the log still holding
that record at that offset is what tells a read model it follows the same log."""

projection_sources = Table(
    "projection_sources", metadata,
    Column("consumer", String(100), primary_key=True),
    Column("cluster_id", String(200)),
    Column("updated_at", String(32), nullable=False),
)
"""The cluster id of the log each read model follows: another cluster's log is refused."""

projection_applied = Table(
    "projection_applied", metadata,
    Column("consumer", String(100), primary_key=True),
    Column("event_id", String(200), primary_key=True),
)
"""Event ids a read model has applied: a redelivered event is skipped."""

# --- registry ----------------------------------------------------------------------------

registry_tools = Table(
    "registry_tools", metadata,
    Column("tool_id", String(200), primary_key=True),
    Column("tool_type", String(40), nullable=False),
    Column("description", Text, nullable=False),
    Column("current_version", String(100)),
    Column("latest_version", String(100), nullable=False),
    Column("lifecycle", String(20), nullable=False),
    Column("tags", JSON, nullable=False),
    Column("search_text", Text, nullable=False),
    Column("versions_count", Integer, nullable=False),
    Column("updated_at", String(32), nullable=False),
    Column("search_name", Text, nullable=False, server_default=""),
    Column("search_tags", Text, nullable=False, server_default=""),
    Column("search_parameters", Text, nullable=False, server_default=""),
    Column("search_hash", String(64), nullable=False, server_default=""),
)
"""`search_*`: the indexed fields besides `description`, as space-separated words
(`domain.search.field_texts`); `search_hash` is the sha256 of everything indexed, the
key of a tool's stored embedding. The full-text index itself (SQLite FTS5 table kept
by triggers, PostgreSQL generated tsvector column) is made by migration 0006 only."""

registry_versions = Table(
    "registry_versions", metadata,
    Column("tool_id", String(200), primary_key=True),
    Column("version", String(100), primary_key=True),
    Column("tool_type", String(40), nullable=False),
    Column("executor", String(200)),
    Column("executor_pin", JSON),
    Column("integrity", String(80), nullable=False),
    Column("lifecycle", String(20), nullable=False),
    Column("lifecycle_reason", Text),
    Column("replacement_tool_id", String(200)),
    Column("description", Text, nullable=False),
    Column("manifest", JSON, nullable=False),
    Column("files", JSON, nullable=False),
    Column("published_at", String(32), nullable=False),
    Column("published_by", String(200)),
    Column("source", Text),
    Column("event_id", String(200), nullable=False),
    Column("publisher_signature", JSON),
)

tool_definitions = Table(
    "tool_definitions", metadata,
    Column("server_tool_id", String(200), primary_key=True),
    Column("mcp_tool_name", String(200), primary_key=True),
    Column("state", String(20), nullable=False),
    Column("definition_hash", String(80), nullable=False),
    Column("definition", JSON, nullable=False),
    Column("pinned_how", String(20), nullable=False),
    Column("approved_by", String(200)),
    Column("server_version", String(100)),
    Column("server_integrity", String(80)),
    Column("pinned_at", String(32), nullable=False),
    Column("pin_event_id", String(200), nullable=False),
    Column("pending", JSON, nullable=False),
    Column("event_ids", JSON, nullable=False),
    Column("updated_at", String(32), nullable=False),
)
"""The pinned definition of each MCP tool of each server (`projections.definitions`):
`state` pinned or drifted, `pending` the drifted definitions waiting for approval
(hash, definition, diff, when and by which server version seen), `event_ids` the
definition events folded in (a repeated one is skipped)."""

# --- invocations -------------------------------------------------------------------------

invocations = Table(
    "invocations", metadata,
    Column("invocation_id", String(200), primary_key=True),
    Column("status", String(20), nullable=False),
    Column("tool_id", String(200)),
    Column("version_range", String(200)),
    Column("version", String(100)),
    Column("subject", String(200)),
    Column("requested_by", String(200)),
    Column("attempts", Integer, nullable=False),
    Column("duration_ms", Float),
    Column("error_code", String(10)),
    Column("error_message", Text),
    Column("failed_stage", String(20)),
    Column("result_summary", Text),
    Column("cancel_requested", Boolean, nullable=False),
    Column("timeline", JSON, nullable=False),
    Column("requested_at", String(32)),
    Column("updated_at", String(32), nullable=False),
    Column("finished_at", String(32)),
    Column("callback_url", Text),
    Column("progress_sequence", Integer),
    Column("progress_fraction", Float),
    Column("progress_message", Text),
    Column("progress_at", String(32)),
    Column("checkpoints", Integer, nullable=False, server_default="0"),
    Column("checkpoint_bytes", BigInteger, nullable=False, server_default="0"),
    Column("checkpoint_stored_bytes", BigInteger, nullable=False, server_default="0"),
    Column("last_checkpoint_hash", String(80)),
    Index("ix_invocations_tool_status", "tool_id", "status"),
)

# --- circuit breakers --------------------------------------------------------------------

circuits = Table(
    "circuits", metadata,
    Column("service_id", String(200), primary_key=True),
    Column("state", String(20), nullable=False),
    Column("previous_state", String(20), nullable=False),
    Column("failure_count", Integer, nullable=False),
    Column("success_count", Integer, nullable=False),
    Column("since", String(32), nullable=False),
    Column("reason", Text),
    Column("transitions", Integer, nullable=False),
    Column("updated_at", String(32), nullable=False),
)

approvals = Table(
    "approvals", metadata,
    Column("invocation_id", String(200), primary_key=True),
    Column("tool_id", String(200)),
    Column("version", String(100)),
    Column("integrity", String(71)),
    Column("subject", String(200)),
    Column("policy_version", String(200)),
    Column("call_hash", String(71)),
    Column("parameters", JSON),
    Column("reasons", JSON),
    Column("requested_at", String(32)),
    Column("expires_at", String(32)),
    Column("decision", String(10)),
    Column("approved_hash", String(71)),
    Column("decided_by", String(200)),
    Column("decision_reason", Text),
    Column("decided_at", String(32)),
    Column("outcome", String(20)),
    Column("error_code", String(10)),
    Column("finished_at", String(32)),
    Index("ix_approvals_pending", "outcome", "expires_at"),
)
"""One row per invocation whose call needed approval (or that got a decision): the
request, the first decision read, how the invocation ended."""

# --- audit trail -------------------------------------------------------------------------

audit_log = Table(
    "audit_log", metadata,
    Column("topic", String(200), primary_key=True),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("offset", BigInteger, primary_key=True, autoincrement=False),
    Column("event_id", String(200), nullable=False),
    Column("type", String(100), nullable=False),
    Column("time", String(32), nullable=False),
    Column("invocation_id", String(200)),
    Column("tool_id", String(200)),
    Column("document", Text, nullable=False),
    Column("redactions", Integer, nullable=False),
    Column("prev_hash", String(64), nullable=False),
    Column("hash", String(64), nullable=False),
    Column("signature", String(16)),
    Index("ix_audit_log_time", "time"),
    Index("ix_audit_log_invocation", "invocation_id"),
    Index("ix_audit_log_tool", "tool_id"),
    Index("ix_audit_log_type", "type"),
)
"""One row per log record: the redacted CloudEvent (canonical JSON) in a hash chain,
and (facts) how its pipeline signature checked out, outside the chain."""

audit_heads = Table(
    "audit_heads", metadata,
    Column("topic", String(200), primary_key=True),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("last_offset", BigInteger, nullable=False),
    Column("hash", String(64), nullable=False),
    Column("records", BigInteger, nullable=False),
)
"""Head of each partition's chain: deleting the newest rows is detected too."""
