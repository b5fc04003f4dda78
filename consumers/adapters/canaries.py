"""Half-open canary slots shared by every executor replica.

The circuit view counts the canaries of this process; with several replicas each
would admit `half_open_max_calls`. A `RedisCanaries` counter (INCR with a TTL, undone
when over the limit, in one Lua script) caps them across all replicas. `LocalCanaries`
is the embedded profile's: the view's own count is the whole truth there.
"""

from __future__ import annotations

from typing import Any

from consumers.ports import CanarySlots

__all__ = ["CanarySlots", "LocalCanaries", "RedisCanaries"]

SLOT_TTL_SECONDS = 300
"""A crashed executor's slot frees itself after this long at most."""

_ACQUIRE = """
local n = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
if n > tonumber(ARGV[1]) then
  redis.call('DECR', KEYS[1])
  return 0
end
return 1
"""
_RELEASE = """
local n = redis.call('DECR', KEYS[1])
if n <= 0 then redis.call('DEL', KEYS[1]) end
return n
"""


class LocalCanaries:
    """No shared state: the circuit view's per-process count decides alone."""

    async def acquire(self, service_id: str, limit: int) -> bool:
        return True

    async def release(self, service_id: str) -> None:
        return None


class RedisCanaries:
    """Canary slots in Redis at `cb:{service_id}:half_open_in_flight`."""

    def __init__(self, client: Any, *, prefix: str = "toolexec:cb:",
                 ttl_seconds: int = SLOT_TTL_SECONDS) -> None:
        self._redis = client
        self._prefix = prefix
        self._ttl = ttl_seconds

    def _key(self, service_id: str) -> str:
        return f"{self._prefix}{service_id}:half_open_in_flight"

    async def acquire(self, service_id: str, limit: int) -> bool:
        taken = await self._redis.eval(_ACQUIRE, 1, self._key(service_id), limit, self._ttl)
        return int(taken) == 1

    async def release(self, service_id: str) -> None:
        await self._redis.eval(_RELEASE, 1, self._key(service_id))
