"""Per-run uids: each sandboxed run, started as root, gets a uid no other run holds.

RLIMIT_NPROC counts the processes of a real uid. When every run shares one uid
(65534 before), one tool holding its limit of processes makes every other tool's
fork fail. Runs started by root therefore switch to a uid of their own, leased from
the operator's range `[base, base + count)` for the run's lifetime (a stdio MCP
server's: as long as its process lives), so a run's process limit is its own.

Measured on these machines (kernel 6.18, bubblewrap 0.8): two runs under
`prlimit --nproc=30`, one holding 29 processes; as the same uid the other cannot fork
once (EAGAIN), as distinct uids it forks freely. Uids are leased round-robin, so a
uid just released is the last to be handed out again.

Without root there are no uids to hand out: bubblewrap then gives each run its own
user namespace and the process limit is set inside it (see `bubblewrap`), which
isolates runs the same way; Landlock without root cannot, and says so at start.
The range must be free on the host (no real user in it) and, for several executors
on one host, distinct per executor process.
"""

from __future__ import annotations

from domain.errors import ExecutionError

DEFAULT_BASE = 200_000
DEFAULT_COUNT = 1024


class UidPool:
    """Leases distinct uids from `[base, base + count)`."""

    def __init__(self, base: int = DEFAULT_BASE, count: int = DEFAULT_COUNT) -> None:
        if base < 1000 or count < 1 or base + count > 2**31 - 2:
            raise ValueError(f"uid range {base}+{count} is not usable for sandboxed runs")
        self.base = base
        self.count = count
        self._leased: set[int] = set()
        self._next = 0

    def lease(self) -> int:
        """A uid no live run holds; E3405 when every uid of the range is leased."""
        for step in range(self.count):
            uid = self.base + (self._next + step) % self.count
            if uid not in self._leased:
                self._leased.add(uid)
                self._next = (uid - self.base + 1) % self.count
                return uid
        raise ExecutionError(
            f"all {self.count} sandbox uids from {self.base} are in use; raise "
            "TOOLEXEC_SANDBOX_UID_COUNT", code="E3405",
            details={"uid_base": self.base, "uid_count": self.count})

    def release(self, uid: int) -> None:
        self._leased.discard(uid)

    @property
    def in_use(self) -> int:
        return len(self._leased)


_POOLS: dict[tuple[int, int], UidPool] = {}


def shared_pool(base: int = DEFAULT_BASE, count: int = DEFAULT_COUNT) -> UidPool:
    """One pool per range in this process, shared by every primitive that uses it, so
    two executors of one process never hand out the same uid."""
    pool = _POOLS.get((base, count))
    if pool is None:
        pool = _POOLS[(base, count)] = UidPool(base, count)
    return pool
