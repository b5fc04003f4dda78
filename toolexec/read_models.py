"""Start the SQL read models of a running system: migrate, then one runner per model.

`Stack(read_models_factory=start_read_models)` calls this once its consumers run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from consumers.fetch_pacing import FetchPacer
from projections.catalog import read_models
from projections.database import make_engine, migrate
from projections.runner import ProjectionRunner
from toolexec.archive_source import EmbeddedArchive
from toolexec.settings import Settings, fetch_waits, kafka_client_options
from toolexec.state_files import ensure_state_dir

log = structlog.get_logger(__name__)

PROJECTION_BUSY_WAIT_MS = 20
PROJECTION_IDLE_WAIT_MS = 250
"""The projection runners' fetch waits while records flow and while idle. Read models
are eventually consistent and nobody waits hop by hop on them; on a broker that holds
every fetch for the full wait (Tansu), a short wait would make four more consumers
poll hundreds of times a second. A read-your-writes wait (`wait_caught_up`) moves a
runner to its busy wait at once."""


@dataclass
class ReadModels:
    """The running read models: the engine and one runner per model."""

    engine: AsyncEngine
    runners: dict[str, ProjectionRunner] = field(default_factory=dict)

    def states(self) -> dict[str, str]:
        """Read model -> "running", or why it is not following its log."""
        return {name: runner.state for name, runner in self.runners.items()}

    async def wait_caught_up(self, timeout: float = 10.0) -> bool:
        """True when every read model holds every record in the log as of now."""
        results = [await runner.wait_caught_up(timeout) for runner in self.runners.values()]
        return all(results)

    async def stop(self) -> None:
        """Stop every runner (batches in flight roll back) and close the engine."""
        for runner in self.runners.values():
            await runner.stop()
        self.runners.clear()
        await self.engine.dispose()


async def start_read_models(settings: Settings, bootstrap: str) -> ReadModels:
    """Migrate the store to head, then start one projection runner per read model."""
    ensure_state_dir(settings.state_dir)
    engine = make_engine(settings.effective_database_url)
    handle = ReadModels(engine)
    try:
        await migrate(engine)
        for name, model in read_models().items():
            runner = ProjectionRunner(engine, model, bootstrap,
                                      consumer_options=_runner_options(settings),
                                      pacer=_runner_pacer(settings),
                                      on_divergence=settings.projections_on_divergence,
                                      verify_seconds=settings.projections_verify_seconds,
                                      client_options=kafka_client_options(settings),
                                      archive=embedded_archive(settings))
            await runner.start()
            handle.runners[name] = runner
    except BaseException:
        await handle.stop()
        raise
    log.info("read_models.started", models=sorted(handle.runners))
    for name, runner in handle.runners.items():
        if runner.state != "running":  # refused or rebuilding: say so where `up` runs
            log.error("read_models.not_following", model=name, state=runner.state)
    return handle


def embedded_archive(settings: Settings) -> EmbeddedArchive | None:
    """The embedded log's archive (records retention left out of the broker), None in
    the production profile (Kafka's retention is Kafka's)."""
    return EmbeddedArchive(settings.state_dir) if settings.embedded else None


def _runner_options(settings: Settings) -> dict[str, int]:
    return {"fetch_max_wait_ms": _runner_pacer(settings).long_ms}


def _runner_pacer(settings: Settings) -> FetchPacer:
    busy, idle = fetch_waits(settings)
    return FetchPacer(max(busy, PROJECTION_BUSY_WAIT_MS), min(idle, PROJECTION_IDLE_WAIT_MS))
