"""What a read model is to the runner, and the generic store of aggregate read models.

A read model applies a batch of decoded records inside the runner's transaction
(`ReadModel.apply`). Most read models are folds over one aggregate (a tool, an
invocation, a service): `AggregateModel` loads the rows of the aggregates a batch
touches, runs the model's pure fold over each event in log order, and writes the
rows back — a handful of statements per batch, whatever its size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Table, delete, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from contracts.envelope import Envelope

Row = dict[str, Any]
Rows = dict[str, list[Row]]
"""The rows of one aggregate: table name -> rows (empty lists for none)."""

CHUNK = 500  # bound on bound parameters per IN (...) list


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded log record and where it was read."""

    topic: str
    partition: int
    offset: int
    envelope: Envelope


class ReadModel(Protocol):
    """A projection the runner feeds: its name, topics, own tables and batch apply."""

    name: str
    topics: tuple[str, ...]
    tables: tuple[Table, ...]

    async def apply(self, conn: AsyncConnection, records: Sequence[Record]) -> None:
        """Apply `records` (log order per partition, never seen before) within `conn`'s
        transaction."""
        ...


Fold = Callable[[Rows, Envelope], Rows]


@dataclass(frozen=True)
class AggregateModel:
    """A read model whose tables all carry the aggregate id in `key_column`."""

    name: str
    topics: tuple[str, ...]
    tables: tuple[Table, ...]
    key_column: str
    aggregate_of: Callable[[Envelope], str | None]
    fold: Fold

    async def apply(self, conn: AsyncConnection, records: Sequence[Record]) -> None:
        keyed = [(key, r.envelope) for r in records
                 if (key := self.aggregate_of(r.envelope)) is not None]
        if not keyed:
            return
        states = await self.load(conn, {key for key, _ in keyed})
        for key, envelope in keyed:
            states[key] = self.fold(states[key], envelope)
        await self._save(conn, states)

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

    async def _save(self, conn: AsyncConnection, states: dict[str, Rows]) -> None:
        keys = sorted(states)
        for table in self.tables:
            column = table.c[self.key_column]
            for chunk in chunks(keys):
                await conn.execute(delete(table).where(column.in_(chunk)))
            rows = [row for key in keys for row in states[key][table.name]]
            if rows:
                await conn.execute(insert(table), rows)


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
