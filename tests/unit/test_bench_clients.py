from __future__ import annotations

import httpx

from toolexec.bench.clients import ShardedClients


async def test_requests_go_to_the_least_busy_client_and_connections_add_up() -> None:
    sizes: list[int] = []

    def factory(connections: int) -> httpx.AsyncClient:
        sizes.append(connections)
        return httpx.AsyncClient()

    shards = ShardedClients(factory, max_connections=100, shards=10)
    assert sizes == [10] * 10
    with shards.lease() as first, shards.lease() as second:
        assert first is not second
        with shards.lease() as third:
            assert third not in (first, second)
    with shards.lease() as again:
        assert again is shards.clients[0]  # every client idle again: the first one
    await shards.aclose()


async def test_fewer_connections_than_shards_gives_one_client_per_connection() -> None:
    shards = ShardedClients(lambda n: httpx.AsyncClient(), max_connections=3)
    assert len(shards.clients) == 3
    await shards.aclose()
