"""The labelled relevance set: its size, lexical recall on typos and partial words in
both stores, and `toolexec bench --scenario search` with an embeddings endpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.embedding_server import EmbeddingServer
from tests.projection_db import *  # noqa: F403 - fixtures
from toolexec.bench.search import KINDS, evaluate, publish, relevance_set

pytestmark = pytest.mark.integration


def test_the_labelled_set_is_large_enough_and_consistent() -> None:
    tools, queries = relevance_set()
    ids = {t["tool_id"] for t in tools}
    kinds = Counter(q.kind for q in queries)
    assert len(ids) == len(tools) >= 50 and len(queries) >= 100
    assert set(kinds) == set(KINDS) and min(kinds.values()) >= 15
    assert all(q.relevant and q.relevant <= ids for q in queries)


async def test_lexical_recall_on_typos_and_partial_words(engine: AsyncEngine) -> None:
    tools, queries = relevance_set()
    await publish(engine, tools)
    figures, _, modes = await evaluate(engine, queries)
    assert modes == {"lexical"}
    assert figures["typo"]["recall@5"] >= 0.9
    assert figures["partial"]["recall@5"] >= 0.9
    assert figures["exact"]["recall@1"] >= 0.9


def test_bench_reports_hybrid_figures_with_an_embeddings_endpoint(tmp_path) -> None:
    with EmbeddingServer() as server:
        env = {**os.environ, "TOOLEXEC_EMBEDDINGS_URL": server.url,
               "TOOLEXEC_EMBEDDINGS_MODEL": "hashing-test",
               "TOOLEXEC_STATE_DIR": str(tmp_path / "state")}
        env.pop("TOOLEXEC_DATABASE_URL", None)
        done = subprocess.run([sys.executable, "-m", "toolexec.cli", "bench", "--quick",
                               "--scenario", "search", "--json"], capture_output=True,
                              text=True, timeout=280, env=env, check=False)
        embedded = sum(len(r["input"]) for r in server.requests)
    assert done.returncode == 0, done.stderr[-3000:]
    [scenario] = json.loads(done.stdout)["scenarios"]
    figures = scenario["figures"]
    assert "error" not in figures
    for kind in (*KINDS, "all"):
        for name in ("recall@1", "recall@5", "mrr"):
            assert 0 <= figures[f"lexical {kind} {name}"] <= 1
            assert 0 <= figures[f"hybrid {kind} {name}"] <= 1
    assert figures["query (2000 tools, SQLite) p99 ms"] > 0
    assert embedded >= len(relevance_set()[0])  # every labelled tool's text, and queries
