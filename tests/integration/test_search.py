"""Ranked tool search on SQLite (FTS5) and PostgreSQL (tsvector), folded by the
registry read model: ranking, typos, partial words, filters, paging, updates."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts.envelope import Envelope
from projections.queries import search_tools, search_tools_page
from projections.registry_table import registry_model
from projections.store import Record, apply
from tests.projection_db import *  # noqa: F403 - fixtures
from tests.projection_events import at, lifecycle, published

pytestmark = pytest.mark.integration


def _tools() -> list[Envelope]:
    return [
        published("word_count", "1.0.0", tags=["text", "statistics"],
                  description="Word frequency statistics for a text"),
        published("grep", "1.0.0", tags=["text", "search"],
                  description="Find lines matching a regular expression"),
        published("http_get", "1.0.0", tags=["web", "http"],
                  description="Fetch a URL over HTTP and return the body"),
        published("csv_to_json", "1.0.0", tags=["convert", "csv"],
                  description="Convert comma separated values to JSON records"),
        published("old_counter", "1.0.0", tags=["text"],
                  description="Count characters in a text (superseded)"),
    ]


async def _fold(engine: AsyncEngine, events: list[Envelope], first: int = 0) -> None:
    async with engine.begin() as conn:
        await apply(registry_model(), conn,
                    [Record("registry", 0, first + i, e) for i, e in enumerate(events)])


async def test_ranked_search_with_typos_partial_words_and_fields(engine: AsyncEngine) -> None:
    await _fold(engine, _tools())
    async with engine.connect() as conn:
        words = await search_tools_page(conn, "word statistics")
        typo = await search_tools_page(conn, "regulr expresion")
        partial = await search_tools_page(conn, "conv json")
        nothing = await search_tools_page(conn, "xylophone")
    assert words.mode == "lexical" and words.rows[0]["tool_id"] == "word_count"
    assert words.rows[0]["matched"] == ["name", "tags", "description"]
    assert [r["score"] for r in words.rows] == sorted((r["score"] for r in words.rows),
                                                      reverse=True)
    assert typo.rows[0]["tool_id"] == "grep"
    assert [t["how"] for t in typo.describe_terms()] == ["typo", "typo"]
    assert partial.rows[0]["tool_id"] == "csv_to_json"
    assert (nothing.rows, nothing.total) == ([], 0)


async def test_filters_and_paging(engine: AsyncEngine) -> None:
    await _fold(engine, _tools())
    async with engine.connect() as conn:
        text_tools = await search_tools_page(conn, "text")
        tagged = await search_tools(conn, "text", tag="statistics")
        typed = await search_tools(conn, "", tool_type="runtime")
        pages = [await search_tools(conn, "text", limit=1, offset=i) for i in range(3)]
        past_end = await search_tools_page(conn, "text", limit=1, offset=10)
    assert text_tools.total == 3 and len(text_tools.rows) == 3
    assert [r["tool_id"] for r in tagged] == ["word_count"]
    assert typed == []
    assert [p[0]["tool_id"] for p in pages] == [r["tool_id"] for r in text_tools.rows]
    assert (past_end.rows, past_end.total) == ([], 3)


async def test_lifecycle_changes_and_new_versions_reach_the_index(engine: AsyncEngine) -> None:
    await _fold(engine, _tools())
    await _fold(engine, [lifecycle("old_counter", "removed", when=at(1)),
                         published("grep", "2.0.0", tags=["text"], when=at(2),
                                   description="Search files for lines that match a pattern")],
                first=10)
    async with engine.connect() as conn:
        hidden = await search_tools(conn, "characters")
        removed = await search_tools(conn, "characters", lifecycle="removed")
        old_words = await search_tools(conn, "regular expression")
        new_words = await search_tools(conn, "pattern files")
        listing = await search_tools_page(conn, "")
    assert hidden == [] and [r["tool_id"] for r in removed] == ["old_counter"]
    assert old_words == []
    assert [r["tool_id"] for r in new_words] == ["grep"]
    assert listing.mode == "list" and [r["tool_id"] for r in listing.rows] == [
        "csv_to_json", "grep", "http_get", "word_count"]
