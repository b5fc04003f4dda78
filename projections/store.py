"""What a read model is to the runner, and the generic store of aggregate read models.

A read model handles a batch of decoded records in two steps: `prepare` reads what it
needs and computes every row change (no writes), then the returned `Changes.write`
writes them inside the runner's transaction. The split keeps the CPU work of a batch
outside the database's write lock, so several rebuild workers can share one SQLite
file without queueing behind each other's folding.

Most read models are folds over one aggregate (a tool, an invocation, a service):
`AggregateModel` loads the rows of the aggregates a batch touches, runs the model's
pure fold over each event in log order, and writes the rows back with the driver's
bulk path — a handful of statements per batch, whatever its size.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol

from sqlalchemy import Table, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from contracts.envelope import Envelope
from projections.bulk_rows import insert_tuples, row_tuples

Row = dict[str, Any]
Rows = dict[str, list[Row]]
"""The rows of one aggregate: table name -> rows (empty lists for none)."""

CHUNK = 500  # bound on bound parameters per IN (...) list
REBUILD_CACHE_AGGREGATES = 20_000
"""Aggregates a rebuilding model keeps in memory (most recently touched first): an
invocation's events sit close together in the log, so almost every load is a hit."""


class Record(NamedTuple):
    """One decoded log record and where it was read (a tuple: one is made per record
    consumed, several times cheaper than a frozen dataclass)."""

    topic: str
    partition: int
    offset: int
    envelope: Envelope
    signature: str | None = None
    """The pipeline signature's verdict (`contracts.fact_signature.Verdict`) on a record
    of a signed topic; None where no signature is checked."""

    @property
    def trusted(self) -> bool:
        """Whether the record may become state: unchecked, or validly signed."""
        return self.signature is None or self.signature == "valid"


async def _nothing(_conn: AsyncConnection) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Changes:
    """The row changes a model computed for a batch, written by `write` in the
    runner's transaction; `duplicates` counts records the model skipped as repeats of
    events it already holds."""

    write: Callable[[AsyncConnection], Awaitable[None]] = _nothing
    duplicates: int = 0


class ReadModel(Protocol):
    """A projection the runner feeds: its name, topics, own tables and batch step.

    `deduplicates` says whether the model drops a repeated event (same id, another log
    position) by itself; for the others the runner keeps their applied event ids."""

    name: str
    topics: tuple[str, ...]
    tables: tuple[Table, ...]
    deduplicates: bool

    async def prepare(self, conn: AsyncConnection, records: Sequence[Record]) -> Changes:
        """Compute the changes of `records` (log order per partition, past the model's
        stored position) from the rows in `conn`; write nothing."""
        ...


async def apply(model: ReadModel, conn: AsyncConnection, records: Sequence[Record]) -> int:
    """Prepare and write `records` in `conn`'s transaction; returns the duplicates skipped."""
    changes = await model.prepare(conn, records)
    await changes.write(conn)
    return changes.duplicates


Fold = Callable[[Rows, Envelope], Rows]


@dataclass
class AggregateCache:
    """A rebuilding model's memory of the aggregates it wrote (it is their only writer
    until the rebuild ends): recent ones whole, the ids of all of them."""

    states: dict[str, Rows] = field(default_factory=dict)
    written: set[str] = field(default_factory=set)
    limit: int = REBUILD_CACHE_AGGREGATES

    def keep(self, states: dict[str, Rows]) -> None:
        for key, rows in states.items():
            self.states.pop(key, None)
            self.states[key] = rows
            self.written.add(key)
        while len(self.states) > self.limit:
            del self.states[next(iter(self.states))]


class MisalignedPartitions(Exception):
    """A parallel rebuild found an aggregate written by another worker: the log does
    not keep each aggregate's events in one partition index across its topics."""


@dataclass(frozen=True)
class AggregateModel:
    """A read model whose tables all carry the aggregate id in `key_column`.

    With `event_ids` (the ids an aggregate's rows already hold) the model skips a
    repeated event itself. `rebuilding()` gives the copy a rebuild worker uses: rows
    kept in memory between batches, and no read of aggregates it never wrote."""

    name: str
    topics: tuple[str, ...]
    tables: tuple[Table, ...]
    key_column: str
    aggregate_of: Callable[[Envelope], str | None]
    fold: Fold
    event_ids: Callable[[Rows], Collection[str]] | None = None
    cache: AggregateCache | None = None

    @property
    def deduplicates(self) -> bool:
        return self.event_ids is not None

    def rebuilding(self) -> AggregateModel:
        """A copy for one rebuild worker (fresh cache)."""
        return replace(self, cache=AggregateCache())

    async def prepare(self, conn: AsyncConnection, records: Sequence[Record]) -> Changes:
        keyed = [(key, r.envelope) for r in records  # a fact we did not sign is no state
                 if r.trusted and (key := self.aggregate_of(r.envelope)) is not None]
        if not keyed:
            return Changes()
        states, existing = await self._current(conn, {key for key, _ in keyed})
        duplicates = self.fold_all(states, keyed)

        async def write(target: AsyncConnection) -> None:
            await self._save(target, states, existing)

        return Changes(write, duplicates)

    def fold_all(self, states: dict[str, Rows],
                 keyed: Iterable[tuple[str, Envelope]]) -> int:
        """Fold `keyed` (aggregate id, event), in order, into `states` (pure apart from
        updating `states`); returns how many were skipped as repeated events."""
        duplicates = 0
        for key, envelope in keyed:
            if self.event_ids is not None and envelope.id in self.event_ids(states[key]):
                duplicates += 1
                continue
            states[key] = self.fold(states[key], envelope)
        return duplicates

    async def load(self, conn: AsyncConnection, keys: Iterable[str]) -> dict[str, Rows]:
        """Current rows of each aggregate in `keys` (empty lists for new ones)."""
        wanted = sorted(set(keys))
        states: dict[str, Rows] = {k: {t.name: [] for t in self.tables} for k in wanted}
        for table in self.tables:
            column = table.c[self.key_column]
            for chunk in chunks(wanted):
                result = await conn.execute(select(table).where(column.in_(chunk)))
                for row in result.mappings():
                    states[row[self.key_column]][table.name].append(dict(row))
        return states

    async def _current(self, conn: AsyncConnection,
                       keys: set[str]) -> tuple[dict[str, Rows], set[str]]:
        """(rows of `keys`, the keys that have rows in the store)."""
        cache = self.cache
        if cache is None:
            states = await self.load(conn, keys)
            return states, {k for k, rows in states.items() if any(rows.values())}
        states = {k: cache.states[k] for k in keys if k in cache.states}
        missing = [k for k in keys if k not in states and k in cache.written]
        if missing:
            states.update(await self.load(conn, missing))
        for key in keys - states.keys():
            states[key] = {t.name: [] for t in self.tables}
        return states, keys & cache.written

    async def _save(self, conn: AsyncConnection, states: dict[str, Rows],
                    existing: set[str]) -> None:
        keys = sorted(states)
        stale = sorted(existing)
        for table in self.tables:
            column = table.c[self.key_column]
            for chunk in chunks(stale):
                await conn.execute(delete(table).where(column.in_(chunk)))
            rows = row_tuples(table, (row for key in keys for row in states[key][table.name]))
            try:
                await insert_tuples(conn, table, rows)
            except IntegrityError as error:
                if self.cache is not None:
                    raise MisalignedPartitions(
                        f"{self.name}: an aggregate of this worker's partitions was "
                        "written by another worker") from error
                raise
        if self.cache is not None:
            self.cache.keep(states)


def single_row(table: Table, evolve: Callable[[Row | None, Envelope], Row | None]) -> Fold:
    """A `Fold` for read models of one row per aggregate, from `evolve(row, event)`."""

    def fold(rows: Rows, envelope: Envelope) -> Rows:
        current = rows[table.name][0] if rows[table.name] else None
        new = evolve(current, envelope)
        return {**rows, table.name: [] if new is None else [new]}

    return fold


def field_of(data: Any, name: str) -> Any:
    """`data.<name>` when the contract model has that field, else None: a plain lookup
    (pydantic's `getattr` of a missing name raises and catches, measurably slower)."""
    return data.__dict__.get(name)


def chunks(items: Sequence[Any], size: int = CHUNK) -> Iterable[Sequence[Any]]:
    """`items` in slices of at most `size`."""
    for start in range(0, len(items), size):
        yield items[start:start + size]
