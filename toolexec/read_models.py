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

from projections.catalog import read_models
from projections.database import make_engine, migrate
from projections.rebuild import restore_indexes
from toolexec.read_model_thread import ThreadedRunner
from toolexec.settings import Settings, consumer_kwargs

log = structlog.get_logger(__name__)

PROJECTION_FETCH_WAIT_MS = 100
"""Floor of the projection runner's fetch wait. Read models are eventually consistent
and nobody waits hop by hop on them; on a broker that holds every fetch for the full
wait (Tansu), the pipeline's 5 ms would make the runner poll 200 times a second while
idle."""


@dataclass
class ReadModels:
    """The running read models: the engine readers use, the runner of each model (one
    runner feeds them all) and each model's topics."""

    engine: AsyncEngine
    runners: dict[str, ThreadedRunner] = field(default_factory=dict)
    topics: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def _distinct(self) -> list[ThreadedRunner]:
        return list({id(runner): runner for runner in self.runners.values()}.values())

    async def wait_caught_up(self, timeout: float = 10.0) -> bool:
        """True when every read model holds every record in the log as of now."""
        results = [await runner.wait_caught_up(timeout) for runner in self._distinct()]
        return all(results)

    async def stop(self) -> None:
        """Stop the runners (batches in flight roll back) and close the engine."""
        for runner in self._distinct():
            await runner.stop()
        self.runners.clear()
        await self.engine.dispose()


async def start_read_models(settings: Settings, bootstrap: str) -> ReadModels:
    """Migrate the store to head (and put back secondary indexes an interrupted rebuild
    left out), then start the runner of every read model."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.effective_database_url)
    handle = ReadModels(engine)
    try:
        await migrate(engine)
        await restore_indexes(engine)
        models = read_models()
        runner = ThreadedRunner(settings.effective_database_url, list(models.values()),
                                bootstrap, consumer_options=_runner_options(settings))
        handle.runners = dict.fromkeys(models, runner)
        await runner.start()
        handle.topics = {name: tuple(model.topics) for name, model in models.items()}
    except BaseException:
        await handle.stop()
        raise
    log.info("read_models.started", models=sorted(handle.runners))
    return handle


def _runner_options(settings: Settings) -> dict[str, int]:
    wait = consumer_kwargs(settings)["fetch_max_wait_ms"]
    return {"fetch_max_wait_ms": max(wait, PROJECTION_FETCH_WAIT_MS)}
