"""Start the SQL read models of a running system: migrate, then one runner feeding them all.

`Stack(read_models_factory=start_read_models)` calls this once its consumers run.

One runner feeds every read model, on an event loop and a thread of its own
(`read_model_thread`): each record is fetched and decoded once, and each batch is one
transaction for all of them. With a runner per model on the pipeline's loop, the
models' writers queued behind each other's SQLite write lock and every statement
waited for a turn of a loop kept busy by the pipeline: under the bench's API load
their lag reached 2 s. Every model still keeps its own stored offsets (a rebuild of
one resets only it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from consumers.runtime.fetch_pacing import FetchPacer
from contracts import topics
from contracts.fact_signature import FactVerifier
from projections.catalog import read_models
from projections.database import make_engine, migrate
from projections.rebuild import restore_indexes
from projections.runner import ProjectionRunner
from projections.search_vectors import EmbeddingFollower
from toolexec import keys
from toolexec.archive_source import EmbeddedArchive
from toolexec.embeddings import embedder_from_settings
from toolexec.read_model_thread import ThreadedRunner
from toolexec.settings import Settings, fetch_waits, kafka_client_options
from toolexec.state_files import ensure_state_dir

log = structlog.get_logger(__name__)

PROJECTION_BUSY_WAIT_MS = 100
PROJECTION_IDLE_WAIT_MS = 250
"""The projection runner's fetch waits while records flow and while idle. Read models
are eventually consistent and nobody waits hop by hop on them; on a broker that holds
every fetch for the full wait (Tansu), a short wait would make the runner poll
hundreds of times a second. While records flow the runner folds at most every
`PROJECTION_FOLD_SECONDS` unless it is behind or a reader waits, so its busy wait
matches that interval (20 ms made 3-4 fetches per sequential invocation, most of
them answered empty while the runner paused between folds). A read-your-writes wait
(`wait_caught_up`) moves the runner to its busy wait and ends a pause between folds
at once. An idle runner's loop also turns only this often (records that arrive end
its wait at once)."""

PROJECTION_FOLD_SECONDS = 0.1
"""While nobody waits to read their writes, the runner folds a batch at most this
often. Each batch costs a transaction over every model with their offsets; folding
each burst of a few facts alone made the read models the largest CPU cost of a
sequential invocation on a busy machine. A runner behind the log does
not pause, and a read-your-writes wait ends a pause at once; so this adds at most
this much to the read models' lag."""


@dataclass
class ReadModels:
    """The running read models: the engine readers use, the runner of each model (one
    runner feeds them all) and each model's topics."""

    engine: AsyncEngine
    runners: dict[str, ThreadedRunner] = field(default_factory=dict)
    topics: dict[str, tuple[str, ...]] = field(default_factory=dict)
    embeddings: EmbeddingFollower | None = None
    """Embeds new tool texts for semantic search (PostgreSQL with an embeddings URL)."""

    def _distinct(self) -> list[ThreadedRunner]:
        return list({id(runner): runner for runner in self.runners.values()}.values())

    def states(self) -> dict[str, str]:
        """Read model -> "running", or why it is not following its log."""
        return {name: runner.state for name, runner in self.runners.items()}

    async def wait_caught_up(self, timeout: float = 10.0) -> bool:
        """True when every read model holds every record in the log as of now."""
        results = [await runner.wait_caught_up(timeout) for runner in self._distinct()]
        return all(results)

    async def stop(self) -> None:
        """Stop the runners (batches in flight roll back) and close the engine."""
        if self.embeddings is not None:
            await self.embeddings.stop()
        for runner in self._distinct():
            await runner.stop()
        self.runners.clear()
        await self.engine.dispose()


async def start_read_models(settings: Settings, bootstrap: str) -> ReadModels:
    """Migrate the store to head (and put back secondary indexes an interrupted rebuild
    left out), then start the runner of every read model."""
    ensure_state_dir(settings.state_dir)
    engine = make_engine(settings.effective_database_url)
    handle = ReadModels(engine)
    try:
        await migrate(engine)
        await restore_indexes(engine)
        models = read_models()
        verifier = fact_verifier(settings)

        def runner_of(runner_engine: AsyncEngine) -> ProjectionRunner:
            return ProjectionRunner(runner_engine, list(models.values()), bootstrap,
                                    consumer_options=_runner_options(settings),
                                    pacer=_runner_pacer(settings),
                                    poll_ms=PROJECTION_IDLE_WAIT_MS,
                                    on_divergence=settings.projections_on_divergence,
                                    verify_seconds=settings.projections_verify_seconds,
                                    client_options=kafka_client_options(settings),
                                    archive=embedded_archive(settings),
                                    verifier=verifier, signed_topics=SIGNED_TOPICS,
                                    fold_interval=PROJECTION_FOLD_SECONDS)

        runner = ThreadedRunner(settings.effective_database_url, runner_of,
                                name="+".join(models))
        handle.runners = dict.fromkeys(models, runner)
        await runner.start()
        handle.topics = {name: tuple(model.topics) for name, model in models.items()}
        embedder = embedder_from_settings(settings)
        if embedder is not None and engine.dialect.name == "postgresql":
            handle.embeddings = EmbeddingFollower(engine, embedder)
            handle.embeddings.start()
    except BaseException:
        await handle.stop()
        raise
    log.info("read_models.started", models=sorted(handle.runners))
    for name, runner in handle.runners.items():
        if runner.state != "running":  # refused or rebuilding: say so where `up` runs
            log.error("read_models.not_following", model=name, state=runner.state)
    return handle


SIGNED_TOPICS = (topics.INVOCATIONS, topics.CIRCUITS)
"""Topics whose records the pipeline signs (facts, breaker transitions)."""


def fact_verifier(settings: Settings) -> FactVerifier | None:
    """The pipeline's trusted fact keys as a verifier (the embedded key is made now if
    this is the first start); None, with a warning, when no key is configured at all
    (a reader without `TOOLEXEC_FACT_PUBLIC_KEYS`: facts then go unchecked)."""
    if settings.embedded:
        keys.fact_signing_key(settings)
    trusted = keys.fact_verify_keys(settings)
    if not trusted:
        log.warning("read_models.facts_unverified",
                    hint="set TOOLEXEC_FACT_PUBLIC_KEYS to the pipeline's public key(s)")
        return None
    return FactVerifier(trusted)


def embedded_archive(settings: Settings) -> EmbeddedArchive | None:
    """The embedded log's archive (records retention left out of the broker), None in
    the production profile (Kafka's retention is Kafka's)."""
    return EmbeddedArchive(settings.state_dir) if settings.embedded else None


def _runner_options(settings: Settings) -> dict[str, int]:
    return {"fetch_max_wait_ms": _runner_pacer(settings).long_ms}


def _runner_pacer(settings: Settings) -> FetchPacer:
    busy, idle = fetch_waits(settings)
    return FetchPacer(max(busy, PROJECTION_BUSY_WAIT_MS), min(idle, PROJECTION_IDLE_WAIT_MS))
