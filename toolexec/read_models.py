"""Start the SQL read models of a running system: migrate, then one runner per model.

`Stack(read_models_factory=start_read_models)` calls this once its consumers run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from projections.catalog import read_models
from projections.database import make_engine, migrate
from projections.runner import ProjectionRunner
from toolexec.settings import Settings, consumer_kwargs

log = structlog.get_logger(__name__)


@dataclass
class ReadModels:
    """The running read models: the engine and one runner per model."""

    engine: AsyncEngine
    runners: dict[str, ProjectionRunner] = field(default_factory=dict)

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
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.effective_database_url)
    handle = ReadModels(engine)
    try:
        await migrate(engine)
        for name, model in read_models().items():
            runner = ProjectionRunner(engine, model, bootstrap,
                                      consumer_options=consumer_kwargs(settings))
            await runner.start()
            handle.runners[name] = runner
    except BaseException:
        await handle.stop()
        raise
    log.info("read_models.started", models=sorted(handle.runners))
    return handle
