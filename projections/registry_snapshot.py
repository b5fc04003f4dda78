"""The registry read model (SQL) as the domain's `RegistryView`, for publishers.

A publisher (the CLI, the HTTP gateway) pins each new version's executor and checks
that a version is not published twice with other bytes against what the registry
holds. Those decisions need manifests, integrities, lifecycles and pins, never file
contents: the versions loaded here carry file hashes only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from domain.model import ExecutorPin, PublisherSignature, ToolFile, ToolVersion
from domain.registry import InMemoryRegistry
from projections.tables import registry_versions


async def registry_snapshot(conn: AsyncConnection, tool_ids: Iterable[str]) -> InMemoryRegistry:
    """Every version of `tool_ids` in the registry read model (files without content)."""
    wanted = sorted(set(tool_ids))
    registry = InMemoryRegistry()
    if not wanted:
        return registry
    rows = (await conn.execute(select(registry_versions).where(
        registry_versions.c.tool_id.in_(wanted)))).mappings()
    for row in rows:
        registry.add(version_from_row(row))
    return registry


def version_from_row(row: Mapping[str, Any]) -> ToolVersion:
    """A `registry_versions` row as a ToolVersion (file hashes, no contents)."""
    pin = row["executor_pin"]
    signature = row.get("publisher_signature")
    return ToolVersion(
        tool_id=row["tool_id"], version=row["version"], manifest=row["manifest"],
        files=tuple(ToolFile(path=f["path"], sha256=f["sha256"],
                             is_executable=bool(f["is_executable"])) for f in row["files"]),
        integrity=row["integrity"], lifecycle=row["lifecycle"],
        lifecycle_reason=row["lifecycle_reason"],
        replacement_tool_id=row["replacement_tool_id"],
        executor_pin=None if pin is None else ExecutorPin(
            pin["tool_id"], pin["version"], pin["integrity"]),
        publisher_signature=None if signature is None else PublisherSignature(
            signature["key_id"], signature["signature"]))
