"""Every SQL read model by name (the names `toolexec projections rebuild` takes)."""

from __future__ import annotations

from projections.audit import AuditModel
from projections.circuits import circuits_model
from projections.invocations import invocations_model
from projections.registry_table import registry_model
from projections.store import ReadModel


def read_models() -> dict[str, ReadModel]:
    """Fresh instances of every read model, by name, in start order."""
    models: list[ReadModel] = [registry_model(), invocations_model(), circuits_model(),
                               AuditModel()]
    return {model.name: model for model in models}
