"""Read-your-writes for readers outside `toolexec up`: `toolexec mcp`, the CLI.

`toolexec up` folds the read models; a process of its own that reads them (an MCP
`execute` `status` right after its `start`, `toolexec status` right after a `run`)
may ask before `up` has folded what was just written. Inside `up` the gateway waits
for its runner (`wait_caught_up_to`); outside, `caught_up` does the same through the
store: it takes the log's ends at the moment it is asked (the partitions the read
model folds), then waits, bounded, until the read model's stored positions
(`projection_offsets`) reach them. When the bound passes (`up` stopped, or far
behind) the caller reads what the read model has: never an error, never a hang. A
read model that follows another log (another cluster id) is not waited for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog
from aiokafka.errors import KafkaError
from sqlalchemy.ext.asyncio import AsyncEngine

from projections.catalog import read_models
from projections.log_identity import stored_cluster
from projections.runner import stored_offsets
from projections.store import ReadModel
from toolexec.log_ends import LogEnds, log_ends
from toolexec.runtime_file import running_bootstrap
from toolexec.settings import Settings, kafka_client_options

log = structlog.get_logger(__name__)

POLL_SECONDS = 0.05

Positions = Mapping[tuple[str, int], int]


def reached(stored: Positions, ends: Positions) -> bool:
    """True when every partition's stored position is at or past its end."""
    return all(stored.get(place, 0) >= end for place, end in ends.items())


def on_another_log(stored: str | None, log_cluster: str | None) -> bool:
    """True when the read model's stored cluster is known and not the log's."""
    return stored is not None and log_cluster is not None and stored != log_cluster


async def wait_for_positions(positions: Callable[[], Awaitable[Positions]], ends: Positions,
                             timeout: float, *, poll: float = POLL_SECONDS) -> bool:
    """Poll `positions()` until they reach `ends`; False once `timeout` has passed."""
    deadline = time.monotonic() + timeout
    while True:
        if reached(await positions(), ends):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(poll, left))


async def caught_up(engine: AsyncEngine, model: ReadModel, bootstrap: str | None,
                    timeout: float, *, client_options: Mapping[str, Any] | None = None
                    ) -> bool:
    """Wait (bounded by `timeout`) until `model` in `engine` has folded its topics up
    to the ends the log at `bootstrap` has now; False when it has not (the bound
    passed, no broker to ask, the broker unreachable, the model on another log)."""
    if bootstrap is None or timeout <= 0:
        return False
    began = time.monotonic()
    try:
        async with asyncio.timeout(timeout):  # asking the broker counts in the bound
            ends: LogEnds = await log_ends(bootstrap, model.topics,
                                           client_options=client_options)
    except (KafkaError, OSError, TimeoutError) as error:
        log.debug("read_your_writes.no_log_ends", model=model.name, error=str(error))
        return False
    if on_another_log(await stored_cluster(engine, model.name), ends.cluster):
        log.warning("read_your_writes.another_log", model=model.name, cluster=ends.cluster)
        return False
    left = timeout - (time.monotonic() - began)
    folded = await wait_for_positions(lambda: stored_offsets(engine, model.name), ends.ends,
                                      left)
    if not folded:
        log.debug("read_your_writes.bound_passed", model=model.name, seconds=timeout)
    return folded


async def read_after_writes(settings: Settings, engine: AsyncEngine, *models: str) -> bool:
    """`caught_up` for a front end outside `up`, with the settings' broker and bound
    (`read_your_writes_seconds`); call it right before reading `models` (waited for
    together, within the one bound)."""
    bootstrap, options = running_bootstrap(settings), kafka_client_options(settings)
    folded = await asyncio.gather(*(
        caught_up(engine, read_models()[model], bootstrap, settings.read_your_writes_seconds,
                  client_options=options) for model in models))
    return all(folded)
