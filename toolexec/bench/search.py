"""`toolexec bench --scenario search`: relevance and latency of tool search.

Relevance: the labelled set under tests/search_relevance (60 tools, 118 queries of four
kinds: exact words, typos, partial words, paraphrases), published through the registry
read model into a fresh SQLite file; per kind recall@1, recall@5 and MRR of the lexical
ranking, and of the hybrid one when an embeddings endpoint is configured
(`TOOLEXEC_EMBEDDINGS_URL`; hybrid needs PostgreSQL with pgvector: the database of
`TOOLEXEC_DATABASE_URL` when it is PostgreSQL, else a pgserver if installed).
Latency: the same queries over 10,000 tools (the labelled ones among synthetic
ones) on SQLite, timed around `search_tools_page` one query at a time; the relevance of
the labelled queries among those 10,000 is reported too.

recall@k of one query is |relevant in the first k| / min(k, |relevant|) (1 for a
perfect ranking even when more than k tools are relevant); MRR averages 1 / the rank of
the first relevant tool (0 past the first 10).
"""

from __future__ import annotations

import json
import random
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts.envelope import Envelope, new_envelope
from contracts.events import ToolPublished
from projections.database import async_url, make_engine, migrate
from projections.queries import search_tools_page
from projections.registry_table import registry_model
from projections.store import Record, apply
from toolexec.bench.report import Figure, ScenarioResult, latency_figures, percentile
from toolexec.local_postgres import pgserver_installed, start_pgserver

RELEVANCE_DIR = Path(__file__).resolve().parents[2] / "tests" / "search_relevance"
KINDS = ("exact", "typo", "partial", "paraphrase")
LATENCY_TOOLS = 10_000
P99_TARGET_MS = 20.0
RECALL_TARGET = 0.9
DEPTH = 10
T0 = datetime(2026, 11, 25, tzinfo=UTC)


@dataclass(frozen=True)
class LabelledQuery:
    kind: str
    query: str
    relevant: frozenset[str]


def relevance_set(directory: Path = RELEVANCE_DIR) -> tuple[list[dict[str, Any]],
                                                              list[LabelledQuery]]:
    """The labelled tools and queries (a source checkout's tests/search_relevance)."""
    if not (directory / "tools.json").is_file():
        raise FileNotFoundError(f"the labelled search set is not at {directory} "
                                "(it ships with a source checkout, under tests/)")
    tools = json.loads((directory / "tools.json").read_text())
    queries = [LabelledQuery(q["kind"], q["query"], frozenset(q["relevant"]))
               for q in json.loads((directory / "queries.json").read_text())]
    return tools, queries


def tool_event(spec: dict[str, Any], index: int) -> Envelope:
    """A `tool.published` event of a labelled (or synthetic) tool."""
    parameters = {"type": "object", "properties": {
        name: {"type": "string", "description": text}
        for name, text in spec.get("parameters", {}).items()}}
    manifest = {"tool_id": spec["tool_id"], "version": "1.0.0", "tool_type": "script",
                "executor": "python_runtime", "description": spec["description"],
                "tags": spec.get("tags", []), "parameters": parameters}
    data = ToolPublished(tool_id=spec["tool_id"], version="1.0.0", tool_type="script",
                         executor="python_runtime", manifest=manifest, files=[],
                         integrity="sha256:" + f"{index:064x}", published_by="bench")
    return new_envelope(data, source="urn:bench", partitionkey=spec["tool_id"],
                        correlationid=spec["tool_id"], time=T0 + timedelta(seconds=index),
                        id=f"bench-{spec['tool_id']}")


async def publish(engine: AsyncEngine, specs: Sequence[dict[str, Any]],
                  batch: int = 1000) -> None:
    """Fold the publications of `specs` into the registry read model of `engine`."""
    model = registry_model()
    events = [tool_event(spec, i) for i, spec in enumerate(specs)]
    for start in range(0, len(events), batch):
        async with engine.begin() as conn:
            await apply(model, conn, [Record("bench.registry", 0, start + i, e)
                                      for i, e in enumerate(events[start:start + batch])])


def synthetic_tools(count: int, labelled: Sequence[dict[str, Any]],
                    seed: int = 22) -> list[dict[str, Any]]:
    """`count` tools whose text mixes the labelled set's words with made-up ones
    (a skewed draw, as in real text), so that real words have many distractors."""
    rng = random.Random(seed)
    real = sorted({w for t in labelled for w in t["description"].lower().split()
                   if w.isalpha()})
    syllables = ["ka", "lo", "mi", "ren", "tas", "vo", "qui", "dor", "sen", "pa", "tri", "gel"]
    made_up = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(2, 4)))
                      for _ in range(4000)})
    pool = real + made_up
    weights = [1.0 / (rank + 1) ** 0.8 for rank in range(len(pool))]
    rng.shuffle(pool)
    tools = []
    for i in range(count):
        description = " ".join(rng.choices(pool, weights, k=rng.randint(6, 16)))
        tags = rng.sample(pool[:200], k=2)
        params = {f"{rng.choice(made_up)}_{j}": " ".join(rng.choices(pool, weights, k=4))
                  for j in range(rng.randint(1, 3))}
        tools.append({"tool_id": f"synthetic_{i:05d}_{rng.choice(made_up)}",
                      "description": description, "tags": tags, "parameters": params})
    return tools


async def evaluate(engine: AsyncEngine, queries: Sequence[LabelledQuery],
                   embedder: Any = None, baseline: list[float] | None = None,
                   ) -> tuple[dict[str, dict[str, float]], list[float], set[str]]:
    """(per kind and overall: recall@1, recall@5, MRR; each query's seconds; modes seen).
    With `baseline`, a `SELECT 1` on the same connection is timed after each query
    into it: the same-run floor of a statement's round trip, and of the machine's noise."""
    by_kind: dict[str, list[tuple[float, float, float]]] = {kind: [] for kind in KINDS}
    seconds: list[float] = []
    modes: set[str] = set()
    async with engine.connect() as conn:
        for labelled in queries:
            started = time.perf_counter()
            page = await search_tools_page(conn, labelled.query, limit=DEPTH, embedder=embedder)
            seconds.append(time.perf_counter() - started)
            if baseline is not None:
                started = time.perf_counter()
                await conn.execute(text("SELECT 1"))
                baseline.append(time.perf_counter() - started)
            modes.add(page.mode)
            ranked = [row["tool_id"] for row in page.rows]
            by_kind[labelled.kind].append(_scores(ranked, labelled.relevant))
    figures = {kind: _mean(rows) for kind, rows in by_kind.items() if rows}
    figures["all"] = _mean([row for rows in by_kind.values() for row in rows])
    return figures, seconds, modes


def _scores(ranked: list[str], relevant: frozenset[str]) -> tuple[float, float, float]:
    def recall(k: int) -> float:
        return len(relevant.intersection(ranked[:k])) / min(k, len(relevant))

    first = next((i for i, tool in enumerate(ranked, 1) if tool in relevant), None)
    return recall(1), recall(5), 0.0 if first is None else 1.0 / first


def _mean(rows: list[tuple[float, float, float]]) -> dict[str, float]:
    n = max(1, len(rows))
    return {"recall@1": round(sum(r[0] for r in rows) / n, 3),
            "recall@5": round(sum(r[1] for r in rows) / n, 3),
            "mrr": round(sum(r[2] for r in rows) / n, 3), "queries": len(rows)}


def _flatten(prefix: str, figures: dict[str, dict[str, float]]) -> dict[str, Figure]:
    return {f"{prefix} {kind} {name}": value for kind, values in figures.items()
            for name, value in values.items() if name != "queries"}


async def search_bench(root: Path, *, latency_tools: int = LATENCY_TOOLS,
                       embedder: Any = None, hybrid_url: str | None = None) -> ScenarioResult:
    """The search scenario: relevance (lexical, and hybrid with `embedder` on the
    PostgreSQL database `hybrid_url`) and latency over `latency_tools` tools on SQLite."""
    tools, queries = relevance_set()
    notes = [f"{len(tools)} labelled tools, {len(queries)} queries: "
             + ", ".join(f"{sum(q.kind == k for q in queries)} {k}" for k in KINDS)]
    figures: dict[str, Figure] = {}
    small = make_engine(f"sqlite+aiosqlite:///{root / 'relevance.db'}")
    try:
        await migrate(small)
        await publish(small, tools)
        lexical, _, _ = await evaluate(small, queries)
    finally:
        await small.dispose()
    figures.update(_flatten("lexical", lexical))
    if embedder is not None and hybrid_url:
        hybrid, modes = await _hybrid(hybrid_url, tools, queries, embedder)
        figures.update(_flatten("hybrid", hybrid))
        notes.append(f"hybrid on PostgreSQL, model {embedder.model}; answers' modes: "
                     f"{', '.join(sorted(modes))}")
    else:
        notes.append("hybrid: not measured (set TOOLEXEC_EMBEDDINGS_URL, and PostgreSQL "
                     "with pgvector: TOOLEXEC_DATABASE_URL or pgserver)")
    large = make_engine(f"sqlite+aiosqlite:///{root / 'latency.db'}")
    try:
        await migrate(large)
        await publish(large, [*tools, *synthetic_tools(latency_tools - len(tools), tools)])
        await evaluate(large, queries[:10])  # warm: vocabulary, page cache
        floor: list[float] = []
        at_scale, seconds, _ = await evaluate(large, queries, baseline=floor)
        await evaluate(large, queries)
        _, again, _ = await evaluate(large, queries, baseline=floor)
    finally:
        await large.dispose()
    timings = seconds + again
    figures.update(latency_figures(f"query ({latency_tools} tools, SQLite)", timings))
    figures.update(latency_figures("baseline: SELECT 1", floor))
    figures.update({f"lexical among {latency_tools} {k}": v["recall@5"]
                    for k, v in at_scale.items()})
    p99 = percentile(timings, 99) * 1000
    typo_partial = min(lexical["typo"]["recall@5"], lexical["partial"]["recall@5"])
    notes.append(f"latency: {len(timings)} queries, one at a time, in-process "
                 "(vocabulary cached, as a running gateway has it); the baseline is a "
                 "SELECT 1 timed after each query on the same connection")
    return ScenarioResult(
        "search", "search relevance and latency", figures,
        f"lexical recall@5 >= {RECALL_TARGET} on typos and partial words; "
        f"p99 <= {P99_TARGET_MS:g} ms over {latency_tools} tools",
        typo_partial >= RECALL_TARGET and p99 <= P99_TARGET_MS, notes)


async def _hybrid(url: str, tools: list[dict[str, Any]], queries: list[LabelledQuery],
                  embedder: Any) -> tuple[dict[str, dict[str, float]], set[str]]:
    from projections.search_vectors import embed_missing

    engine = make_engine(url)
    try:
        await migrate(engine)
        await publish(engine, tools)
        await embed_missing(engine, embedder)
        figures, _, modes = await evaluate(engine, queries, embedder)
    finally:
        await engine.dispose()
    return figures, modes


async def run(quick: bool) -> ScenarioResult:
    """The scenario as `toolexec bench` runs it (settings from the environment)."""
    from toolexec.embeddings import embedder_from_settings
    from toolexec.settings import Settings

    settings = Settings()
    tools = 2_000 if quick else LATENCY_TOOLS
    embedder = embedder_from_settings(settings)
    with tempfile.TemporaryDirectory(prefix="toolexec-bench-search-") as root:
        if embedder is None:
            return await search_bench(Path(root), latency_tools=tools)
        async with scratch_postgres(settings.database_url, Path(root)) as url:
            return await search_bench(Path(root), latency_tools=tools, embedder=embedder,
                                      hybrid_url=url)


@asynccontextmanager
async def scratch_postgres(database_url: str | None, root: Path) -> AsyncIterator[str | None]:
    """A fresh PostgreSQL database for the hybrid figures, dropped afterwards: on the
    server of `database_url` when it is PostgreSQL, else on a pgserver under `root`
    (when installed); None when neither is at hand."""
    import psycopg
    from sqlalchemy import make_url

    server = None
    if database_url and database_url.startswith(("postgres", "postgresql")):
        base = make_url(async_url(database_url))
    else:
        if not pgserver_installed():
            yield None
            return
        server = start_pgserver(root / "pg")
        base = make_url(server.get_uri())
    name = f"toolexec_bench_search_{uuid.uuid4().hex[:8]}"
    admin = base.set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            yield base.set(drivername="postgresql+psycopg", database=name).render_as_string(
                hide_password=False)
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
    finally:
        if server is not None:
            server.cleanup()
