"""Stopping aiokafka clients whose broker may be gone.

Here because the consumers, the projections and the composition root all stop Kafka
clients, and `contracts` is what all three import (the consumers and the projections
import neither each other nor the composition root).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)  # contracts import no logging library of their own


async def close_quietly(closing: Coroutine[Any, Any, Any]) -> None:
    """Await a Kafka client's stop/close whose broker may be gone: its errors are not
    ours, nor is the CancelledError aiokafka's fetcher lets out when it is stopped while
    a fetch waits to retry (aio-libs/aiokafka#647); a cancellation of the caller is
    still raised."""
    task = asyncio.current_task()
    try:
        await closing
    except asyncio.CancelledError:
        if task is not None and task.cancelling():
            raise
    except Exception as error:  # noqa: BLE001 - shutting down a client of a dead broker
        log.debug("kafka client close failed: %r", error)
