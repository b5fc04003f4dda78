"""Applying an ABAC policy set: Cedar text (a `.cedar` file, or a JSON list of Cedar
JSON policies) checked to parse, then sent as `policy.updated` by a caller holding the
policy scope when authorization is on; and testing one first: the recorded permission
decisions replayed against it (`policy_what_if`), nothing emitted."""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from consumers.adapters.policy_engine import CedarEvaluator, cedar_text_from_json, compile_policies
from contracts.envelope import Envelope, new_envelope
from contracts.events import PermissionDecided, PolicyUpdated
from contracts.kafka_binding import UndecodableRecord, from_document
from domain.capability import Capability
from domain.errors import InvalidRequest
from domain.policy import DefaultDecision, ToolResource
from domain.policy_what_if import RecordedDecision, WhatIf, what_if, with_set
from domain.scopes import POLICY_NEED
from projections.audit import AuditQuery, audit_records
from projections.policy_view import PolicyView
from projections.registry_snapshot import registry_snapshot
from toolexec import rights

SOURCE = "urn:toolexec:cli"


def read_policy_file(path: Path) -> str:
    """Cedar text of a `.cedar` file, or of a JSON list of Cedar JSON policies, checked
    to parse. Raises InvalidRequest (missing or unreadable file, bad JSON) or
    AuthorizationError (E3206, Cedar that does not parse)."""
    try:
        raw = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            loaded = json.loads(raw)
            raw = cedar_text_from_json(loaded if isinstance(loaded, list) else [loaded])
    except FileNotFoundError:
        raise InvalidRequest(f"{path} does not exist", details={"path": str(path)}) from None
    except (OSError, ValueError) as error:
        raise InvalidRequest(f"{path}: {error}", details={"path": str(path)}) from None
    compile_policies(raw)
    return raw


def policy_event(text: str, *, policy_set_id: str, version: str | None = None) -> Envelope:
    """A `policy.updated` for Cedar policy text; the version defaults to a content hash."""
    version = version or "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
    data = PolicyUpdated(policy_set_id=policy_set_id, version=version, policies=text)
    return new_envelope(data, source=SOURCE, partitionkey=policy_set_id,
                        correlationid=policy_set_id, id=str(uuid.uuid4()),
                        time=datetime.now(UTC))


async def apply_policy(bootstrap: str, event: Envelope, capability: Capability | None,
                       client_options: Mapping[str, Any]) -> None:
    """Send `event` to the running system once `capability` holds the policy scope
    (None: authorization off). Raises AuthorizationError (E3206), E3001 when the broker
    does not take it."""
    from toolexec.client import InvocationClient  # Kafka only for this use case

    rights.demand(capability, [POLICY_NEED])
    async with InvocationClient(bootstrap, client_options=dict(client_options)) as client:
        await client.send(event)


async def policy_what_if(engine: AsyncEngine, text: str, *, policy_set_id: str,
                         version: str | None = None, since: datetime | None = None,
                         tool_id: str | None = None,
                         default: DefaultDecision = "allow") -> WhatIf:
    """Replay the permission decisions the audit read model holds (since `since`, of
    `tool_id`) against the policy sets in force with `policy_set_id` replaced by the
    Cedar `text`, as `policy apply` would leave them. Nothing is emitted."""
    candidate_version = version or policy_event(text, policy_set_id=policy_set_id).data.version
    async with engine.connect() as conn:
        in_force = PolicyView(validate=compile_policies, to_text=cedar_text_from_json)
        async for row in audit_records(conn, AuditQuery(type="policy.updated")):
            with contextlib.suppress(UndecodableRecord):
                in_force.apply(from_document(row["document"].encode()))
        decisions = [decision async for decision in _recorded_decisions(conn, since, tool_id)]
        registry = await registry_snapshot(conn, {d.tool_id for d in decisions})

    def resource(tool: str, version: str) -> ToolResource | None:
        tv = registry.get(tool, version)
        return None if tv is None else ToolResource.from_manifest(tool, version, tv.manifest)

    candidate = with_set(in_force.current(), policy_set_id, candidate_version, text)
    return what_if(decisions, resource, candidate, CedarEvaluator(), default=default)


async def _recorded_decisions(conn: AsyncConnection, since: datetime | None,
                              tool_id: str | None) -> AsyncIterator[RecordedDecision]:
    query = AuditQuery(since=since, tool_id=tool_id, type="tool.permission.decided")
    async for row in audit_records(conn, query):
        try:
            envelope = from_document(row["document"].encode())
        except UndecodableRecord:
            continue
        data = envelope.data
        if not isinstance(data, PermissionDecided):
            continue
        subject = data.subject
        if subject is None and data.error is not None:  # a policy deny recorded before
            found = data.error.details.get("subject")  # the field was filled on denies
            subject = found if isinstance(found, str) else None
        yield RecordedDecision(
            invocation_id=data.invocation_id, tool_id=data.tool_id, version=data.version,
            subject=subject, parameter_keys=tuple(sorted(data.parameters)),
            now=int(envelope.time.timestamp()), decision=data.decision,
            enforced=data.enforced, code=None if data.error is None else data.error.code)


def what_if_json(result: WhatIf) -> dict[str, Any]:
    """The what-if as the front ends answer it."""
    return {"replayed": result.replayed, "skipped": result.skipped,
            "changed": len(result.changes),
            "by_tool_and_agent": [
                {"tool_id": tool, "subject": subject,
                 "allow_to_deny": counts["allow->deny"], "deny_to_allow": counts["deny->allow"]}
                for (tool, subject), counts in sorted(result.by_tool_and_agent().items())],
            "changes": [{"invocation_id": c.invocation_id, "tool_id": c.tool_id,
                         "version": c.version, "subject": c.subject, "before": c.before,
                         "after": c.after, "reason": c.reason} for c in result.changes]}
