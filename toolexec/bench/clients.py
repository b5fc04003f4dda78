"""Several httpx clients side by side, each holding a few connections: the direct
httpx baseline of `toolexec bench` (the executor's http_client uses aiohttp).

httpx's connection pool re-examines every one of its connections on each request,
under a lock, so a single client serving many concurrent requests spends its time in
the pool (httpx issue #3215). Measured on these machines, 50 concurrent GETs to a
local server: one client ~100/s; 10 clients of 5 connections ~730/s. Each request
goes to the client with the fewest requests in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx

SHARDS = 10


class ShardedClients:
    """`shards` clients from `factory(connections_per_shard)`, leased least-busy first."""

    def __init__(self, factory: Callable[[int], httpx.AsyncClient], *, max_connections: int,
                 shards: int = SHARDS) -> None:
        count = max(1, min(shards, max_connections))
        per_shard = max(1, -(-max_connections // count))  # ceiling: never fewer in all
        self.clients = [factory(per_shard) for _ in range(count)]
        self._in_flight = [0] * count

    @contextmanager
    def lease(self) -> Iterator[httpx.AsyncClient]:
        """The least busy client, counted as busy until the block ends."""
        index = min(range(len(self.clients)), key=self._in_flight.__getitem__)
        self._in_flight[index] += 1
        try:
            yield self.clients[index]
        finally:
            self._in_flight[index] -= 1

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()
