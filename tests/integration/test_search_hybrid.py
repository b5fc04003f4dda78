"""Semantic tool search on a real PostgreSQL with pgvector, vectors from a local
OpenAI-compatible embeddings server the test starts; SQLite stays full-text."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from projections.database import make_engine, migrate
from projections.queries import search_tools_page
from projections.rebuild import reset
from projections.registry_table import registry_model
from projections.search_vectors import embed_missing
from tests.embedding_server import EmbeddingServer
from tests.projection_db import *  # noqa: F403 - fixtures
from tests.projection_db import _fresh_postgres
from toolexec.bench.search import publish, relevance_set
from toolexec.embeddings import EmbeddingError, OpenAIEmbeddings

pytestmark = pytest.mark.integration


@pytest.fixture
def embeddings() -> Iterator[EmbeddingServer]:
    with EmbeddingServer() as server:
        yield server


@pytest.fixture
async def postgres(postgres_server_url: str) -> AsyncEngine:
    engine = make_engine(_fresh_postgres(postgres_server_url))
    await migrate(engine)
    yield engine
    await engine.dispose()


async def test_hybrid_ranking_from_stored_vectors(postgres: AsyncEngine,
                                                  embeddings: EmbeddingServer) -> None:
    tools, _ = relevance_set()
    await publish(postgres, tools)
    embedder = OpenAIEmbeddings(embeddings.url, "hashing-test", dimensions=64)
    async with postgres.connect() as conn:
        before = await search_tools_page(conn, "translate", embedder=embedder)
    seen: list[tuple[int, int]] = []
    embedded = await embed_missing(postgres, embedder, batch=16,
                                   progress=lambda done, total: seen.append((done, total)))
    async with postgres.connect() as conn:
        after = await search_tools_page(conn, "tranlsate text", embedder=embedder)
        stored = (await conn.execute(text(
            "SELECT count(*), min(vector_dims(embedding)) FROM registry_embeddings"))).one()
    assert before.mode == "lexical"  # no vectors yet: full text alone, and said so
    assert embedded == len(tools) and seen[-1] == (len(tools), len(tools))
    assert len(seen) == -(-len(tools) // 16)  # batches of 16
    assert tuple(stored) == (len(tools), 64)
    assert after.mode == "hybrid" and after.rows[0]["tool_id"] == "text_translate"
    assert [r["score"] for r in after.rows] == sorted((r["score"] for r in after.rows),
                                                      reverse=True)


async def test_a_rebuilt_registry_reuses_stored_vectors(postgres: AsyncEngine,
                                                        embeddings: EmbeddingServer) -> None:
    tools, _ = relevance_set()
    embedder = OpenAIEmbeddings(embeddings.url, "hashing-test")
    await publish(postgres, tools[:10])
    assert await embed_missing(postgres, embedder) == 10
    await reset(postgres, registry_model())
    await publish(postgres, tools[:12])
    requests_before = len(embeddings.requests)
    assert await embed_missing(postgres, embedder) == 2  # only the two new texts
    assert sum(len(r["input"]) for r in embeddings.requests[requests_before:]) == 2


async def test_an_endpoint_failure_falls_back_to_full_text_saying_why(
        postgres: AsyncEngine, embeddings: EmbeddingServer) -> None:
    tools, _ = relevance_set()
    await publish(postgres, tools[:10])
    await embed_missing(postgres, OpenAIEmbeddings(embeddings.url, "hashing-test"))
    broken = OpenAIEmbeddings(embeddings.url + "/nowhere", "hashing-test")
    async with postgres.connect() as conn:
        page = await search_tools_page(conn, "words", embedder=broken)
    assert page.mode == "lexical" and page.rows[0]["tool_id"] == "word_count"
    assert page.warning is not None and page.warning.startswith("E3106")
    with pytest.raises(EmbeddingError):
        await broken.embed(["x"])


async def test_sqlite_stays_full_text_with_an_embedder(tmp_path, embeddings) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'p.db'}")
    await migrate(engine)
    tools, _ = relevance_set()
    await publish(engine, tools[:10])
    embedder = OpenAIEmbeddings(embeddings.url, "hashing-test")
    assert await embed_missing(engine, embedder) == 0
    async with engine.connect() as conn:
        page = await search_tools_page(conn, "words", embedder=embedder)
    await engine.dispose()
    assert page.mode == "lexical" and page.rows[0]["tool_id"] == "word_count"
    assert embeddings.requests == []  # nothing asked of the endpoint on SQLite


async def test_the_follower_embeds_what_is_published_while_it_runs(
        postgres: AsyncEngine, embeddings: EmbeddingServer) -> None:
    import asyncio

    from projections.search_vectors import EmbeddingFollower

    tools, _ = relevance_set()
    follower = EmbeddingFollower(postgres, OpenAIEmbeddings(embeddings.url, "hashing-test"),
                                 interval=0.1)
    follower.start()
    try:
        await publish(postgres, tools[:5])
        counts = []
        for _ in range(600):  # two minutes at least: a bound only a hang reaches
            async with postgres.connect() as conn:
                counts.append((await conn.execute(text(
                    "SELECT count(*) FROM registry_embeddings"))).scalar_one())
            if counts[-1] == 5:
                break
            await asyncio.sleep(0.2)
    finally:
        await follower.stop()
    assert counts[-1] == 5
