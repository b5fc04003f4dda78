"""Approving a drifted MCP tool definition (toolexec.usecases.definitions.approve_with)
on the real read-model stores: who may, what can be approved, what is written."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts import topics
from contracts.envelope import Envelope
from domain.capability import Capability
from domain.errors import ToolexecError
from domain.scopes import Scopes
from projections.definitions import definitions_model
from projections.store import Record, apply
from tests.projection_db import *  # noqa: F403 - fixtures
from tests.projection_events import definition_log
from toolexec.usecases.definitions import approve_with, list_pins

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

FIRST, SECOND, THIRD = (f"sha256:{c * 64}" for c in "abc")


def token(**scopes: object) -> Capability:
    return Capability(subject="did:example:ops", jti="j", expires_at=2**40, tools=(),
                      scopes=Scopes(**scopes))  # type: ignore[arg-type]


async def _fold(engine: AsyncEngine, events: list[Envelope]) -> None:
    records = [Record(topics.REGISTRY, 0, n, e) for n, e in enumerate(events)]
    async with engine.begin() as conn:
        await apply(definitions_model(), conn, records)


async def _approve(engine: AsyncEngine, sent: list[Envelope], digest: str,
                   capability: Capability | None, target: str = "files_mcp") -> dict:
    async def send(event: Envelope) -> None:
        sent.append(event)
        await _fold(engine, [event])  # the read model folds what is sent

    async def caught_up() -> None:
        return None

    return await approve_with(engine, send, caught_up, target, digest, capability, "ok")


async def test_an_approve_scope_on_the_server_approves_and_is_recorded(
        engine: AsyncEngine) -> None:
    await _fold(engine, definition_log("files_mcp")[:4])  # pinned, then drifted
    sent: list[Envelope] = []
    for refused in (token(), token(approve=("other_*",)), token(publish=("*",))):
        with pytest.raises(ToolexecError) as denied:
            await _approve(engine, sent, SECOND, refused)
        assert denied.value.code == "E3206"
    assert sent == []
    answer = await _approve(engine, sent, SECOND, token(approve=("files_*",)))
    assert answer["status"] == "approved" and answer["applied"]
    (event,) = sent
    assert event.type == "tool.definition.approved" and event.partitionkey == "files_mcp"
    assert (event.data.previous_hash, event.data.definition_hash) == (FIRST, SECOND)
    assert event.data.approved_by == "did:example:ops" and event.data.reason == "ok"
    (pin,) = await list_pins(engine, "files_mcp")
    assert pin["state"] == "pinned" and pin["definition_hash"] == SECOND
    again = await _approve(engine, sent, SECOND, token(admin=True))
    assert again["status"] == "already_approved" and len(sent) == 1


async def test_only_a_hash_that_drifted_can_be_approved(engine: AsyncEngine) -> None:
    await _fold(engine, definition_log("files_mcp")[:4])
    sent: list[Envelope] = []
    with pytest.raises(ToolexecError) as unknown:
        await _approve(engine, sent, THIRD, None)
    assert unknown.value.code == "E3004" and unknown.value.details["pending"] == [SECOND]
    with pytest.raises(ToolexecError) as nothing:
        await _approve(engine, sent, SECOND, None, target="git_mcp")
    assert nothing.value.code == "E3101"
    assert sent == []
    answer = await _approve(engine, sent, SECOND, None)  # authorization off: the operator
    assert answer["definition"]["approved_by"] is None
