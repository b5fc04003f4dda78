"""Semantic tool search on PostgreSQL with pgvector: stored embeddings and hybrid ranking.

Vectors live in `registry_embeddings`, one per (content hash, model): the hash is the
registry row's `search_hash`, the sha256 of everything indexed. The table is not part
of the registry read model — the read model stays a pure fold of the log, identical
after a rebuild — but a cache beside it: `embed_missing` embeds (in batches) the texts
no vector exists for, so a rebuilt registry reuses every stored vector and a new
version's text is embedded once (`toolexec up` runs `EmbeddingFollower`).
Hybrid ranking is reciprocal rank fusion of the full-text and the cosine rankings.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from domain.errors import ToolexecError
from domain.search import Term, reciprocal_rank_fusion
from projections.search import (
    FUSION_DEPTH,
    Filters,
    SearchResult,
    filter_sql,
    lexical_ranking,
    shown_row,
)
from projections.tables import registry_tools

log = structlog.get_logger(__name__)

BATCH = 64
"""Texts per request to the embeddings endpoint."""


class EmbeddingPort(Protocol):
    """Where vectors come from (`toolexec.embeddings.OpenAIEmbeddings`)."""

    model: str

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order; raises a ToolexecError (E3106) on failure."""
        ...


async def vectors_available(conn: AsyncConnection, model: str) -> bool:
    """Whether this store has pgvector's table and a vector of `model` in it."""
    if conn.dialect.name != "postgresql":
        return False
    exists = (await conn.execute(text("SELECT to_regclass('registry_embeddings')"))).scalar()
    if exists is None:
        return False
    return (await conn.execute(text(
        "SELECT 1 FROM registry_embeddings WHERE model = :model LIMIT 1"),
        {"model": model})).first() is not None


def _vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


async def embed_missing(engine: AsyncEngine, embedder: EmbeddingPort, *, batch: int = BATCH,
                        progress: Callable[[int, int], None] | None = None) -> int:
    """Embed every indexed text of the registry that has no vector of the embedder's
    model yet, `batch` texts per request; returns how many were embedded (0 where
    pgvector is not set up). `progress(done, total)` after each batch."""
    async with engine.connect() as conn:
        if conn.dialect.name != "postgresql" or (await conn.execute(
                text("SELECT to_regclass('registry_embeddings')"))).scalar() is None:
            return 0
        columns = ", ".join(f"t.{c}" for c in (
            "search_name", "search_tags", "description", "search_parameters"))
        missing = (await conn.execute(text(
            f"SELECT DISTINCT ON (t.search_hash) t.search_hash, {columns} "
            "FROM registry_tools t WHERE NOT EXISTS (SELECT 1 FROM registry_embeddings e "
            "WHERE e.content_hash = t.search_hash AND e.model = :model) "
            "ORDER BY t.search_hash"), {"model": embedder.model})).all()
    done = 0
    for start in range(0, len(missing), batch):
        chunk = missing[start:start + batch]
        vectors = await embedder.embed(["\n".join(row[1:]) for row in chunk])
        async with engine.begin() as conn:
            await conn.execute(text(
                "INSERT INTO registry_embeddings (content_hash, model, embedding) "
                "VALUES (:hash, :model, CAST(:vector AS vector)) ON CONFLICT DO NOTHING"),
                [{"hash": row[0], "model": embedder.model, "vector": _vector_literal(v)}
                 for row, v in zip(chunk, vectors, strict=True)])
        done += len(chunk)
        if progress is not None:
            progress(done, len(missing))
    return done


async def hybrid_page(conn: AsyncConnection, query: str, wanted: list[str],
                      terms: list[Term], *, limit: int, offset: int, filters: Filters,
                      embedder: EmbeddingPort) -> SearchResult | None:
    """The hybrid page, or None when no vector of the model is stored (full text
    alone then). An endpoint failure gives the full-text page with a `warning`."""
    if not await vectors_available(conn, embedder.model):
        return None
    depth = max(FUSION_DEPTH, offset + limit)
    lexical_rows, _ = await lexical_ranking(conn, wanted, limit=depth, offset=0,
                                            filters=filters)
    try:
        [vector] = await embedder.embed([query])
    except ToolexecError as error:
        log.warning("search.embeddings_failed", code=error.code, error=error.message)
        page = lexical_rows[offset:offset + limit]
        total = (await lexical_ranking(conn, wanted, limit=1, offset=0, filters=filters))[1]
        return SearchResult([shown_row(r, terms) for r in page], "lexical", total, terms,
                            warning=str(error))
    conditions, params = filter_sql(conn, filters)
    nearest = (await conn.execute(text(
        "SELECT t.tool_id FROM registry_tools t JOIN registry_embeddings e "
        "ON e.content_hash = t.search_hash AND e.model = :model "
        f"WHERE 1 = 1{conditions} "
        "ORDER BY e.embedding <=> CAST(:vector AS vector), t.tool_id LIMIT :depth"),
        {**params, "model": embedder.model, "vector": _vector_literal(vector),
         "depth": depth})).scalars().all()
    fused = reciprocal_rank_fusion([r["tool_id"] for r in lexical_rows], list(nearest))
    page = fused[offset:offset + limit]
    known = {r["tool_id"]: r for r in lexical_rows}
    needed = [key for key, _ in page if key not in known]
    if needed:
        columns = ", ".join(f'"{c.name}"' for c in registry_tools.columns)
        result = await conn.execute(text(
            f"SELECT {columns}, 0.0 AS score FROM registry_tools WHERE tool_id = ANY(:ids)"
        ).columns(*registry_tools.columns), {"ids": needed})
        known.update({row["tool_id"]: dict(row) for row in result.mappings()})
    rows = []
    for key, score in page:
        row = shown_row(dict(known[key]), terms)
        rows.append({**row, "score": round(score, 6)})
    return SearchResult(rows, "hybrid", len(fused), terms)


class EmbeddingFollower:
    """Keeps the stored vectors up with the registry while `toolexec up` runs: embeds
    what is missing whenever the registry changed (checked every `interval` s)."""

    def __init__(self, engine: AsyncEngine, embedder: EmbeddingPort,
                 interval: float = 2.0) -> None:
        self._engine, self._embedder, self._interval = engine, embedder, interval
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _follow(self) -> None:
        seen: Any = None
        while True:
            try:
                async with self._engine.connect() as conn:
                    marker = (await conn.execute(text(
                        "SELECT count(*), max(updated_at), sum(versions_count) "
                        "FROM registry_tools"))).one()
                if marker != seen:
                    embedded = await embed_missing(self._engine, self._embedder)
                    if embedded:
                        log.info("search.embedded", texts=embedded, model=self._embedder.model)
                    seen = marker
            except ToolexecError as error:  # endpoint down: try again next round
                log.warning("search.embeddings_failed", code=error.code, error=error.message)
            await asyncio.sleep(self._interval)


__all__ = ["EmbeddingFollower", "EmbeddingPort", "embed_missing", "hybrid_page",
           "vectors_available"]
