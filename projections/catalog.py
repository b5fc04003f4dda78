"""Every SQL read model by name (the names `toolexec projections rebuild` takes)."""

from __future__ import annotations

import dataclasses

from projections.approvals import approvals_model
from projections.audit import AuditModel
from projections.circuit_table import circuits_model
from projections.definitions import definitions_model
from projections.invocations import invocations_model
from projections.registry_table import registry_model
from projections.store import AggregateModel, ReadModel


def read_models() -> dict[str, ReadModel]:
    """Fresh instances of every read model, by name, in start order."""
    models: list[ReadModel] = [registry_model(), invocations_model(), circuits_model(),
                               approvals_model(), definitions_model(), AuditModel()]
    return {model.name: model for model in models}


def model_named(name: str, topics: tuple[str, ...] | None = None) -> ReadModel:
    """A fresh read model by name, reading `topics` instead of its own when given (a
    rebuild worker rebuilds a model from its name and topics)."""
    model = read_models()[name]
    if topics is None:
        return model
    if isinstance(model, AuditModel):
        return AuditModel(topics)
    if isinstance(model, AggregateModel):
        return dataclasses.replace(model, topics=topics)
    raise TypeError(f"read model {name!r} cannot read other topics")


def co_partitioned_topics(model: ReadModel) -> tuple[str, ...]:
    """The topics whose partitions of one index `model` must read together: those of
    an aggregate model fed by several topics (its aggregates' events share an index)."""
    if isinstance(model, AggregateModel) and len(model.topics) > 1:
        return model.topics
    return ()


def rebuilding(model: ReadModel) -> ReadModel:
    """The copy of `model` a rebuild feeds: one that keeps what it owns in memory, when
    the model has such a copy."""
    if isinstance(model, AggregateModel | AuditModel):
        return model.rebuilding()
    return model
