"""What a read model is to the runner, and the generic store of aggregate read models.

A read model handles a batch of decoded records in two steps: `prepare` reads what it
needs and computes every row change (no writes), then the returned `Changes.write`
writes them inside the runner's transaction. The split keeps the CPU work of a batch
outside the database's write lock, so several rebuild workers can share one SQLite
file without queueing behind each other's folding.

Most read models are folds over one aggregate (a tool, an invocation, a service):
`AggregateModel` loads the rows of the aggregates a batch touches, runs the model's
pure fold over each event in log order, and writes the rows back with the driver's
bulk path — a handful of statements per batch, whatever its size. Live, it writes
only the rows a batch changed, as one upsert per table, and remembers the rows of
the aggregates it committed (`AggregateMemory`), so the next batch of an invocation
reads nothing: the runner keeps that memory only while no other writer can have
changed the rows (see `projections.runner`). Two more reads are spared live: a model
with `open_rows` (approvals) keeps the set of its open aggregates and skips the events
that change only those (a terminal event of an invocation no approver saw); one that
`guesses_new` (invocations) folds a few aggregates it neither remembers nor has read
as new and inserts each row only where the store has none, reading and folding again
only those whose row was there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, NamedTuple, Protocol

from sqlalchemy import Select, Table, bindparam, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from contracts.envelope import Envelope
from projections.bulk_rows import columns_of, insert_tuples, row_tuples

Row = dict[str, Any]
Rows = dict[str, list[Row]]
"""The rows of one aggregate: table name -> rows (empty lists for none)."""

CHUNK = 500  # bound on bound parameters per IN (...) list
REBUILD_CACHE_AGGREGATES = 20_000
"""Aggregates a rebuilding model keeps in memory (most recently touched first): an
invocation's events sit close together in the log, so almost every load is a hit."""
GUESSED_AGGREGATES = 4
"""Most aggregates a live batch folds as new without reading them (`guesses_new`): each
is one INSERT of its own, so a batch of many reads them in one SELECT instead."""
LIVE_MEMORY_AGGREGATES = 2_000
"""Aggregates a live model remembers (most recently committed first): an invocation's
facts follow its request within seconds, so a few thousand cover the ones in flight."""


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


async def _nothing(_conn: AsyncConnection) -> int | None:
    return None


@dataclass(frozen=True, slots=True)
class Changes:
    """The row changes a model computed for a batch, written by `write` in the
    runner's transaction; `duplicates` counts records the model skipped as repeats of
    events it already holds."""

    write: Callable[[AsyncConnection], Awaitable[int | None]] = _nothing
    """Writes the changes; returns how many more records it found to be repeats (a
    model that guessed an aggregate new and found its rows while writing), if any."""
    duplicates: int = 0
    committed: Callable[[], None] | None = None
    """What the model keeps once the runner's transaction committed (its memory of the
    rows written), when the runner lets it remember."""


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
    return changes.duplicates + (await changes.write(conn) or 0)


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


@dataclass
class AggregateMemory:
    """A live model's rows of the aggregates it committed last (most recent last):
    what the store holds for them, as long as no other writer changed them since.
    Only the runner fills it (after a commit) and empties it (whenever it re-reads
    its stored positions)."""

    states: dict[str, Rows] = field(default_factory=dict)
    limit: int = LIVE_MEMORY_AGGREGATES
    open_keys: set[str] | None = None
    """The aggregates whose rows are open (`OpenRows`), every one of them; None when
    not known."""

    def recall(self, keys: Iterable[str]) -> dict[str, Rows]:
        """The remembered rows of those of `keys` this memory holds."""
        states = self.states
        return {key: states[key] for key in keys if key in states}

    def keep(self, states: dict[str, Rows]) -> None:
        for key, rows in states.items():
            self.states.pop(key, None)
            self.states[key] = rows
        while len(self.states) > self.limit:
            del self.states[next(iter(self.states))]

    def forget(self) -> None:
        self.states.clear()
        self.open_keys = None


@dataclass(frozen=True)
class OpenRows:
    """A model whose events, but for a few, change only aggregates in an open state
    (the approvals: a terminal event changes only a pending approval's row). Live,
    the model keeps the set of open aggregates and folds the other events of an
    aggregate neither open nor opened in the batch not at all: they would change
    nothing, and its rows need not be read.

    `opening(event)`: the events that may change any aggregate (always folded);
    `is_open(rows)`: whether an aggregate's rows are open; `keys`: the SELECT of the
    keys of the open aggregates, the same condition in SQL."""

    opening: Callable[[Envelope], bool]
    is_open: Callable[[Rows], bool]
    keys: Select[Any]


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
    memory: AggregateMemory | None = field(default_factory=AggregateMemory, compare=False)
    open_rows: OpenRows | None = None
    guesses_new: bool = False
    """Live, a batch of few aggregates neither remembered nor read folds them as new
    and inserts each row only if the store has none (one row per aggregate, one table);
    only an aggregate whose row was there is read and folded again. The SELECT that
    would find nothing for a new invocation is not made."""

    @property
    def deduplicates(self) -> bool:
        return self.event_ids is not None

    def rebuilding(self) -> AggregateModel:
        """A copy for one rebuild worker (fresh cache, no live memory)."""
        return replace(self, cache=AggregateCache(), memory=None)

    def forget(self) -> None:
        """Drop the live memory: the rows in the store may have changed under it."""
        if self.memory is not None:
            self.memory.forget()

    async def prepare(self, conn: AsyncConnection, records: Sequence[Record]) -> Changes:
        keyed = [(key, r.envelope) for r in records  # a fact we did not sign is no state
                 if r.trusted and (key := self.aggregate_of(r.envelope)) is not None]
        if not keyed:
            return Changes()
        if self.cache is not None:
            states, existing = await self._current(conn, {key for key, _ in keyed})
            duplicates = self.fold_all(states, keyed)

            async def rewrite(target: AsyncConnection) -> None:
                await self._save(target, states, existing)

            return Changes(rewrite, duplicates)
        open_keys = None
        if self.open_rows is not None:
            open_keys = await self._open_keys(conn)
            keyed = self.relevant(keyed, open_keys)
        keys = {key for key, _ in keyed}
        before = self.memory.recall(keys) if self.memory is not None else {}
        guessed = self._guessable(keys - before.keys())
        for key in guessed:
            before[key] = self.empty_rows()
        if len(before) < len(keys):
            before.update(await self.load(conn, keys - before.keys()))
        after = dict(before)
        duplicates = self.fold_all(after, keyed)
        table = self.tables[0].name
        unsure = {key for key in guessed if len(after[key][table]) != 1}
        if unsure:  # no row to insert tells nothing: read them after all
            guessed -= unsure
            duplicates += await self._refold(conn, unsure, keyed, before, after)

        async def write(target: AsyncConnection) -> int | None:
            more = None
            if guessed:
                found = await self._insert_new(target, guessed, after)
                for key in guessed - found:
                    before[key] = after[key]  # written as it is
                if found:
                    more = await self._refold(target, found, keyed, before, after)
            await self._write_changed(target, before, after)
            return more

        memory = self.memory
        if memory is None:
            return Changes(write, duplicates)

        def committed() -> None:
            memory.keep(after)
            if open_keys is not None:
                memory.open_keys = self.still_open(open_keys, after)

        return Changes(write, duplicates, committed)

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

    def empty_rows(self) -> Rows:
        """The rows of an aggregate the store has nothing of."""
        return {table.name: [] for table in self.tables}

    def _guessable(self, unknown: set[str]) -> set[str]:
        """The aggregates of `unknown` this batch folds as new instead of reading them."""
        if not self.guesses_new or not unknown or len(unknown) > GUESSED_AGGREGATES \
                or len(self.tables) != 1 or self.memory is None:
            return set()
        return set(unknown)

    async def _insert_new(self, conn: AsyncConnection, guessed: set[str],
                          after: dict[str, Rows]) -> set[str]:
        """Insert the row of each aggregate of `guessed` where the store has none;
        returns the aggregates whose row was there (nothing written for them)."""
        table = self.tables[0]
        statement = _insert_new_sql(table, conn.dialect.paramstyle)
        found = set()
        for key in sorted(guessed):
            values = row_tuples(table, after[key][table.name])[0]
            if (await conn.exec_driver_sql(statement, values)).rowcount != 1:
                found.add(key)
        return found

    async def _refold(self, conn: AsyncConnection, keys: set[str],
                      keyed: list[tuple[str, Envelope]], before: dict[str, Rows],
                      after: dict[str, Rows]) -> int:
        """Fold the events of `keys` again from the rows the store holds (they were
        folded as new); returns how many more of them that finds repeated."""
        events = [(key, envelope) for key, envelope in keyed if key in keys]
        guessed = {key: self.empty_rows() for key in keys}
        loaded = await self.load(conn, keys)
        before.update(loaded)
        after.update(loaded)
        return self.fold_all(after, events) - self.fold_all(guessed, events)

    async def _open_keys(self, conn: AsyncConnection) -> set[str]:
        """The keys of the open aggregates: remembered, else read."""
        assert self.open_rows is not None
        if self.memory is not None and self.memory.open_keys is not None:
            return self.memory.open_keys
        return set((await conn.execute(self.open_rows.keys)).scalars())

    def relevant(self, keyed: list[tuple[str, Envelope]],
                  open_keys: set[str]) -> list[tuple[str, Envelope]]:
        """The events of `keyed` that may change something: every event of an
        aggregate that is open, or that an event of the batch may open."""
        assert self.open_rows is not None
        opening = self.open_rows.opening
        opened = {key for key, envelope in keyed if opening(envelope)}
        return [(key, envelope) for key, envelope in keyed
                if key in open_keys or key in opened]

    def still_open(self, open_keys: set[str], after: dict[str, Rows]) -> set[str]:
        """`open_keys` (changed in place) once the aggregates of `after` have the rows
        they have there."""
        assert self.open_rows is not None
        is_open = self.open_rows.is_open
        for key, rows in after.items():  # in place: called only once committed
            if is_open(rows):
                open_keys.add(key)
            else:
                open_keys.discard(key)
        return open_keys

    async def load(self, conn: AsyncConnection, keys: Iterable[str]) -> dict[str, Rows]:
        """Current rows of each aggregate in `keys` (empty lists for new ones)."""
        wanted = sorted(set(keys))
        states: dict[str, Rows] = {k: self.empty_rows() for k in wanted}
        for table in self.tables:
            statement = _select_by_keys(table, self.key_column)
            for chunk in chunks(wanted):
                result = await conn.execute(statement, {"keys": list(chunk)})
                for row in result.mappings():
                    states[row[self.key_column]][table.name].append(dict(row))
        return states

    async def _write_changed(self, conn: AsyncConnection, before: dict[str, Rows],
                             after: dict[str, Rows]) -> None:
        """Write the rows that differ between `before` and `after`: one upsert per
        table for the new and changed ones, a delete for the ones a fold removed.
        (Folds are pure: `before` still holds the rows as the store has them.)"""
        for table in self.tables:
            name = table.name
            key_of = _primary_key_of(table)
            changed: list[Row] = []
            removed: list[tuple[Any, ...]] = []
            for key, rows in after.items():
                old = before[key][name]
                new = rows[name]
                if old == new:
                    continue
                if len(old) == 1 and len(new) == 1:  # the usual case: one row per aggregate
                    changed.append(new[0])
                    continue
                kept = {key_of(row): row for row in old}
                for row in new:
                    if kept.pop(key_of(row), None) != row:
                        changed.append(row)
                removed.extend(kept)
            if removed:
                await conn.exec_driver_sql(_delete_sql(table, conn.dialect.paramstyle),
                                           removed)
            if changed:
                await conn.exec_driver_sql(upsert_sql(table, conn.dialect.paramstyle),
                                           row_tuples(table, changed))

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


@lru_cache(maxsize=64)
def _select_by_keys(table: Table, key_column: str) -> Select[Any]:
    """The rows of `table` whose `key_column` is in the list bound as `keys` (built
    once, not per batch)."""
    return select(table).where(table.c[key_column].in_(bindparam("keys", expanding=True)))


def _primary_key_of(table: Table) -> Callable[[Row], tuple[Any, ...]]:
    names = [column.name for column in table.primary_key.columns]
    return lambda row: tuple(row[name] for name in names)


def _placeholder(paramstyle: str) -> str:
    return "?" if paramstyle == "qmark" else "%s"


@lru_cache(maxsize=64)
def upsert_sql(table: Table, paramstyle: str) -> str:
    """`INSERT ... ON CONFLICT (primary key) DO UPDATE` of every column of `table`, in
    `columns_of(table)` order (SQLite and PostgreSQL spell it alike)."""
    columns = columns_of(table)
    keys = [column.name for column in table.primary_key.columns]
    mark = _placeholder(paramstyle)
    updates = ", ".join(f'"{c}" = excluded."{c}"' for c in columns if c not in keys)
    action = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
    return (f'INSERT INTO "{table.name}" ({_quoted(columns)}) '
            f'VALUES ({", ".join(mark for _ in columns)}) '
            f"ON CONFLICT ({_quoted(keys)}) {action}")


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


@lru_cache(maxsize=64)
def _insert_new_sql(table: Table, paramstyle: str) -> str:
    """`INSERT ... ON CONFLICT (primary key) DO NOTHING` of every column of `table`."""
    columns = columns_of(table)
    keys = [column.name for column in table.primary_key.columns]
    mark = _placeholder(paramstyle)
    return (f'INSERT INTO "{table.name}" ({_quoted(columns)}) '
            f'VALUES ({", ".join(mark for _ in columns)}) '
            f"ON CONFLICT ({_quoted(keys)}) DO NOTHING")


@lru_cache(maxsize=64)
def _delete_sql(table: Table, paramstyle: str) -> str:
    mark = _placeholder(paramstyle)
    where = " AND ".join(f'"{column.name}" = {mark}' for column in table.primary_key.columns)
    return f'DELETE FROM "{table.name}" WHERE {where}'


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
