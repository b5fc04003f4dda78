"""Ranked tool search over the registry read model (SQLite FTS5 BM25, PostgreSQL
ts_rank), fused with vector similarity (reciprocal rank fusion) where embeddings exist.

The query's words are expanded against the index's vocabulary (`domain.search`); the
vocabulary is read once per process and read again only when the registry changed
(its row count, newest update and number of versions; checked at most once a second).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from domain.search import (
    EMPTY_VOCABULARY,
    Term,
    Vocabulary,
    expand_query,
    matched_fields,
    search_words,
)
from projections.tables import registry_tools

FIELD_WEIGHTS = (10.0, 5.0, 2.0, 1.0)
"""BM25 weight of name, tags, description, parameters (SQLite); PostgreSQL's ts_rank
gets the same ratios as weights A..D."""
INTERNAL_COLUMNS = ("search_name", "search_tags", "search_parameters", "search_hash")
MIGRATION_MANAGED = ("registry_search", "registry_embeddings", "search_vector")
"""Objects of migration 0006 that the SQLAlchemy tables do not describe."""
MAX_SEARCH_OFFSET = 1_000_000
"""The largest paging offset the front ends accept (SQLite's integers have a bound)."""
FUSION_DEPTH = 100
"""How many results of each ranking reciprocal rank fusion looks at (at least)."""


def migration_managed(name: str | None) -> bool:
    """Whether `name` is a search-index object only the migrations know (FTS5 table
    and its shadow tables and triggers, tsvector column and index, embeddings)."""
    return bool(name) and any(str(name).startswith(prefix) for prefix in MIGRATION_MANAGED)


@dataclass(frozen=True)
class Filters:
    """What a result must be, besides matching the query."""

    tool_type: str | None = None
    tag: str | None = None
    lifecycle: str | None = None
    include_removed: bool = False


@dataclass(frozen=True)
class SearchResult:
    """One page of a search: rows (each with `score` and `matched`), the `mode` that
    ranked them (``list``: no query, by tool id; ``lexical``; ``hybrid``), the total
    number of matches and how each query word was read."""

    rows: list[dict[str, Any]]
    mode: str
    total: int
    terms: list[Term] = field(default_factory=list)
    warning: str | None = None
    """Why the ranking is not what was asked (the embeddings endpoint failed: E3106)."""

    def describe_terms(self) -> list[dict[str, Any]]:
        """The query words as JSON: word, how it was read, the words searched for it."""
        return [{"word": t.word, "how": t.how, "searched": list(t.alternatives)}
                for t in self.terms]


VOCABULARY_CHECK_S = 1.0
"""How long a cached vocabulary is used before the registry's change marker is read
again: a tool published a moment ago may miss typo expansion for that long."""


@dataclass
class _CachedVocabulary:
    marker: tuple[Any, ...]
    vocabulary: Vocabulary
    checked: float


_vocabularies: dict[str, _CachedVocabulary] = {}


async def vocabulary(conn: AsyncConnection) -> Vocabulary:
    """The words of the search index, cached per database until the registry changes
    (its change marker is read at most once a second)."""
    key = conn.engine.url.render_as_string(hide_password=True)
    cached = _vocabularies.get(key)
    now = time.monotonic()
    if cached is not None and now - cached.checked < VOCABULARY_CHECK_S:
        return cached.vocabulary
    marker = tuple((await conn.execute(select(
        func.count(), func.max(registry_tools.c.updated_at),
        func.sum(registry_tools.c.versions_count)))).one())
    if cached is not None and cached.marker == marker:
        cached.checked = now
        return cached.vocabulary
    built = EMPTY_VOCABULARY
    if marker[0]:
        result = await conn.execute(select(
            registry_tools.c.search_name, registry_tools.c.search_tags,
            registry_tools.c.description, registry_tools.c.search_parameters))
        built = Vocabulary.of(" ".join(row) for row in result)
    _vocabularies[key] = _CachedVocabulary(marker, built, now)
    return built


async def search(conn: AsyncConnection, query: str, *, limit: int = 50, offset: int = 0,
                 filters: Filters = Filters(), embedder: Any = None) -> SearchResult:
    """One page of the tools matching `query`, best first.

    An empty query lists every tool (filters applied) by id. `embedder` (an
    `EmbeddingPort`) adds vector ranking on PostgreSQL when the tools have embeddings
    of its model; without one, or without any such embedding, the ranking is full-text
    alone and `mode` says so."""
    if not query.strip():
        return await _listing(conn, limit, offset, filters)
    terms = expand_query(query, await vocabulary(conn))
    wanted = search_words(terms)
    if not wanted:
        return SearchResult([], "lexical", 0, terms)
    if embedder is not None and conn.dialect.name == "postgresql":
        from projections.search_vectors import hybrid_page

        page = await hybrid_page(conn, query, wanted, terms, limit=limit, offset=offset,
                                 filters=filters, embedder=embedder)
        if page is not None:
            return page
    rows, total = await lexical_ranking(conn, wanted, limit=limit, offset=offset,
                                        filters=filters)
    return SearchResult([shown_row(row, terms) for row in rows], "lexical", total, terms)


async def lexical_ranking(conn: AsyncConnection, wanted: list[str], *, limit: int,
                          offset: int, filters: Filters) -> tuple[list[dict[str, Any]], int]:
    """(rows with `score`, higher better, and `total`) of the tools holding any of
    `wanted` (words or their stems), ranked by BM25 / ts_rank with field weights."""
    conditions, params = filter_sql(conn, filters)
    params.update(limit=limit, offset=offset)
    columns = ", ".join(f't."{c.name}"' for c in registry_tools.columns)
    if conn.dialect.name == "postgresql":
        params["q"] = " | ".join(wanted)
        weights = "{" + ",".join(str(w / FIELD_WEIGHTS[0]) for w in reversed(FIELD_WEIGHTS)) + "}"
        statement = (
            f"SELECT {columns}, ts_rank('{weights}', t.search_vector, q) AS score, "
            "count(*) OVER () AS total "
            "FROM registry_tools t, to_tsquery('english', :q) q "
            f"WHERE t.search_vector @@ q{conditions} "
            "ORDER BY score DESC, t.tool_id LIMIT :limit OFFSET :offset")
    else:
        params["q"] = " OR ".join(f'"{word}"' for word in wanted)
        weights = ", ".join(str(w) for w in FIELD_WEIGHTS)
        statement = (  # bm25() is not allowed beside a window function: a CTE first
            "WITH hits AS MATERIALIZED (SELECT rowid AS id, "
            f"bm25(registry_search, {weights}) AS rank FROM registry_search "
            "WHERE registry_search MATCH :q) "
            f"SELECT {columns}, -hits.rank AS score, count(*) OVER () AS total "
            "FROM hits JOIN registry_tools t ON t.rowid = hits.id "
            f"WHERE 1 = 1{conditions} "
            "ORDER BY score DESC, t.tool_id LIMIT :limit OFFSET :offset")
    result = await conn.execute(_typed(text(statement)), params)
    rows = [dict(row) for row in result.mappings()]
    total = int(rows[0]["total"]) if rows else 0
    if not rows and offset:
        total = await _count_matches(conn, statement, params)
    for row in rows:
        del row["total"]
    return rows, total


async def _count_matches(conn: AsyncConnection, statement: str, params: dict[str, Any]) -> int:
    """The number of matches when the page asked for lies past the last one."""
    result = await conn.execute(_typed(text(statement)), {**params, "offset": 0, "limit": 1})
    first = result.mappings().first()
    return int(first["total"]) if first else 0


def _typed(statement: Any) -> Any:
    return statement.columns(*registry_tools.columns)


def filter_sql(conn: AsyncConnection, filters: Filters) -> tuple[str, dict[str, Any]]:
    parts, params = [], {}
    if filters.tool_type is not None:
        parts.append("t.tool_type = :tool_type")
        params["tool_type"] = filters.tool_type
    if filters.lifecycle is not None:
        parts.append("t.lifecycle = :lifecycle")
        params["lifecycle"] = filters.lifecycle
    elif not filters.include_removed:
        parts.append("t.lifecycle <> 'removed'")
    if filters.tag is not None:
        parts.append("t.tags::jsonb @> jsonb_build_array(CAST(:tag AS text))"
                     if conn.dialect.name == "postgresql"
                     else ":tag IN (SELECT value FROM json_each(t.tags))")
        params["tag"] = filters.tag
    return "".join(f" AND {part}" for part in parts), params


async def _listing(conn: AsyncConnection, limit: int, offset: int,
                   filters: Filters) -> SearchResult:
    conditions, params = filter_sql(conn, filters)
    params.update(limit=limit, offset=offset)
    columns = ", ".join(f't."{c.name}"' for c in registry_tools.columns)
    statement = (f"SELECT {columns}, count(*) OVER () AS total FROM registry_tools t "
                 f"WHERE 1 = 1{conditions} ORDER BY t.tool_id LIMIT :limit OFFSET :offset")
    rows = [dict(row) for row in (await conn.execute(_typed(text(statement)), params)).mappings()]
    total = int(rows[0]["total"]) if rows else 0
    if not rows and offset:
        total = await _count_matches(conn, statement, params)
    shown = []
    for row in rows:
        del row["total"]
        shown.append({**_public(row), "score": None, "matched": []})
    return SearchResult(shown, "list", total)


def _public(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in INTERNAL_COLUMNS}


def shown_row(row: dict[str, Any], terms: list[Term]) -> dict[str, Any]:
    fields = {"name": row["search_name"], "tags": row["search_tags"],
              "description": row["description"], "parameters": row["search_parameters"]}
    score = row.pop("score")
    return {**_public(row), "score": round(float(score), 6),
            "matched": matched_fields(fields, terms)}
