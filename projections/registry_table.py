"""The registry read model as SQL: tools and their versions, folded from `toolexec.registry`.

The SQL counterpart of the in-memory `registry_view` (which the resolver uses): the
same rules — a version is immutable, the first publication wins; a lifecycle change
names one version or all — plus what people search by: the current version (highest
active, else highest deprecated), tags, a lower-case search text and the fields of the
full-text index (`domain.search`). File contents
stay in the log; rows keep each file's path, sha256, size and executable bit.
"""

from __future__ import annotations

from typing import Any

from contracts import topics
from contracts.envelope import Envelope
from contracts.events import ToolLifecycleChanged, ToolPublished
from domain.search import content_hash, field_texts
from domain.semver import sort_versions
from projections.store import AggregateModel, Row, Rows
from projections.tables import iso, registry_tools, registry_versions

NAME = "registry"
TOOLS = registry_tools.name
VERSIONS = registry_versions.name


def fold_registry(rows: Rows, envelope: Envelope) -> Rows:
    """Fold one registry event into one tool's rows (pure)."""
    data = envelope.data
    versions = {row["version"]: row for row in rows[VERSIONS]}
    if isinstance(data, ToolPublished):
        if data.version in versions:
            return rows  # immutable: the first publication of a version stays
        versions[data.version] = _version_row(data, envelope)
    elif isinstance(data, ToolLifecycleChanged):
        targets = [data.version] if data.version is not None else list(versions)
        for version in targets:
            if version in versions:
                versions[version] = {**versions[version], "lifecycle": data.lifecycle,
                                     "lifecycle_reason": data.reason,
                                     "replacement_tool_id": data.replacement_tool_id}
    else:
        return rows
    if not versions:
        return rows
    ordered = [versions[v] for v in sort_versions(sorted(versions))]
    return {TOOLS: [_tool_row(ordered, iso(envelope.time))], VERSIONS: ordered}


def _version_row(data: ToolPublished, envelope: Envelope) -> Row:
    pin = data.executor_pin
    return {"tool_id": data.tool_id, "version": data.version, "tool_type": data.tool_type,
            "executor": data.executor,
            "executor_pin": None if pin is None else pin.model_dump(mode="json"),
            "integrity": data.integrity, "lifecycle": "active",
            "lifecycle_reason": None, "replacement_tool_id": None,
            "description": str(data.manifest.get("description") or ""),
            "manifest": data.manifest,
            "files": [{"path": f.path, "sha256": f.sha256, "size": f.size,
                       "is_executable": f.is_executable} for f in data.files],
            "published_at": iso(envelope.time), "published_by": data.published_by,
            "source": data.source, "event_id": envelope.id,
            "publisher_signature": None if data.publisher_signature is None
            else data.publisher_signature.model_dump(mode="json")}


def current_version(ordered: list[Row]) -> Row | None:
    """Highest active version, else highest deprecated one, else None."""
    for lifecycle in ("active", "deprecated"):
        candidates = [row for row in ordered if row["lifecycle"] == lifecycle]
        if candidates:
            return candidates[-1]
    return None


def _tool_row(ordered: list[Row], at: str) -> Row:
    current = current_version(ordered)
    shown = current or ordered[-1]
    tags = _tags(shown["manifest"])
    words = [shown["tool_id"], shown["tool_type"], shown["description"], *tags]
    fields = field_texts(shown["tool_id"], shown["manifest"], tags)
    return {"tool_id": shown["tool_id"], "tool_type": shown["tool_type"],
            "description": shown["description"],
            "current_version": current["version"] if current else None,
            "latest_version": ordered[-1]["version"], "lifecycle": shown["lifecycle"],
            "tags": tags, "search_text": " ".join(w for w in words if w).lower(),
            "versions_count": len(ordered), "updated_at": at,
            "search_name": fields["name"], "search_tags": fields["tags"],
            "search_parameters": fields["parameters"],
            "search_hash": content_hash({**fields, "description": shown["description"]})}


def _tags(manifest: dict[str, Any]) -> list[str]:
    tags = manifest.get("tags")
    return sorted({str(t) for t in tags}) if isinstance(tags, list) else []


def _tool_of(envelope: Envelope) -> str | None:
    data = envelope.data
    return data.tool_id if isinstance(data, ToolPublished | ToolLifecycleChanged) else None


def registry_model() -> AggregateModel:
    """The registry read model, ready for a runner."""
    return AggregateModel(name=NAME, topics=(topics.REGISTRY,),
                          tables=(registry_tools, registry_versions), key_column="tool_id",
                          aggregate_of=_tool_of, fold=fold_registry)
