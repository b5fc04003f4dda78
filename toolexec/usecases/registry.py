"""Reading the registry: search, one tool's versions (read model), and the files of a
published version as the log holds them (the registry topic carries every file)."""

from __future__ import annotations

from typing import Any

from aiokafka.errors import KafkaError
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.errors import InvalidRequest, ToolexecError, ToolNotFound, VersionNotFound
from domain.publication_limits import packed_content
from projections.queries import search_tools_page, show_tool
from projections.search import SearchResult
from toolexec.embeddings import embedder_from_settings
from toolexec.settings import Settings, kafka_client_options

MAX_INLINE_FILE_BYTES = 256 * 1024
MAX_SEARCH_LIMIT = 1000


async def search_page(engine: AsyncEngine, settings: Settings, query: str, *, limit: int,
                      offset: int = 0, tool_type: str | None = None, tag: str | None = None,
                      lifecycle: str | None = None) -> SearchResult:
    """The page of tools best matching `query` (all by id without one), ranked with the
    embeddings endpoint `settings` names, if any; what every front end's search reads."""
    if not 1 <= limit <= MAX_SEARCH_LIMIT:
        raise InvalidRequest(f"limit must be between 1 and {MAX_SEARCH_LIMIT}",
                             details={"limit": limit})
    async with engine.connect() as conn:
        return await search_tools_page(conn, query, limit=limit, offset=offset,
                                       tool_type=tool_type, tag=tag, lifecycle=lifecycle,
                                       embedder=embedder_from_settings(settings))


async def search(engine: AsyncEngine, settings: Settings, query: str,
                 limit: int) -> dict[str, Any]:
    """The tools best matching `query`, best first: `results` (each with `score` and
    the `matched` fields), `total`, `mode` (list, lexical, hybrid) and, when the
    embeddings endpoint failed, `warning`."""
    page = await search_page(engine, settings, query, limit=limit)
    results = [{"tool_id": r["tool_id"], "tool_type": r["tool_type"],
                "description": r["description"],
                "version": r["current_version"] or r["latest_version"],
                "lifecycle": r["lifecycle"], "tags": r["tags"], "score": r["score"],
                "matched": r["matched"]} for r in page.rows]
    found = {"results": results, "total": page.total, "mode": page.mode}
    return found if page.warning is None else {**found, "warning": page.warning}


async def tool_version(engine: AsyncEngine, tool_id: str,
                       version: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the tool's read-model row, the row of `version`, default its current one).
    Raises ToolNotFound (E3101), VersionNotFound (E3102)."""
    async with engine.connect() as conn:
        tool = await show_tool(conn, tool_id)
    if tool is None:
        raise ToolNotFound(f"tool {tool_id!r} not found", details={"tool_id": tool_id})
    wanted = version or tool["current_version"] or tool["latest_version"]
    found = next((v for v in tool["versions"] if v["version"] == wanted), None)
    if found is None:
        raise VersionNotFound(f"{tool_id}@{wanted} not found",
                              details={"tool_id": tool_id, "version": wanted,
                                       "available": [v["version"] for v in tool["versions"]]})
    return tool, found


async def file_texts(settings: Settings, bootstrap: str | None, tool_id: str,
                     version: str) -> dict[str, str]:
    """path -> text of the files of `tool_id@version` (UTF-8 files up to
    MAX_INLINE_FILE_BYTES) as the registry topic of the broker at `bootstrap` holds
    them; empty when no broker is known or it cannot be read."""
    from toolexec.registry_reads import published_versions

    if not bootstrap:
        return {}
    try:
        view = await published_versions(bootstrap, settings.publication_limits,
                                        client_options=kafka_client_options(settings))
    except (OSError, TimeoutError, KafkaError, ToolexecError):  # the load still answers
        return {}
    published = view.get(tool_id, version)
    texts: dict[str, str] = {}
    for file in published.files if published is not None else ():
        if file.packed is None or (file.size or 0) > MAX_INLINE_FILE_BYTES:
            continue
        try:
            texts[file.path] = packed_content(file.packed, sha256=file.sha256, size=file.size,
                                              path=file.path).decode("utf-8")
        except (ToolexecError, UnicodeDecodeError):
            continue
    return texts


def with_publishers(versions: list[dict[str, Any]],
                    settings: Settings) -> list[dict[str, Any]]:
    """Registry version rows, each with `publisher`: the key id that signed it (None
    when unsigned) and the verdict of this process's trust store on it."""
    from domain.model import PublisherSignature
    from toolexec.keys import trust_store

    trust = trust_store(settings)
    shown = []
    for row in versions:
        raw = row.get("publisher_signature")
        signature = None if raw is None else PublisherSignature(raw["key_id"], raw["signature"])
        verdict = trust.verdict(row["tool_id"], row["integrity"], signature)
        shown.append({**row, "publisher": {"key_id": None if raw is None else raw["key_id"],
                                           "verdict": verdict.value}})
    return shown
