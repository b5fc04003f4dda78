"""Several steps share one consumer group: each record reaches every handler of its
type, in order, and a handler that keeps failing is dead-lettered on its own."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import MessageSizeTooLargeError

import consumers.authorize
from consumers.deadletter import DeadLetters
from consumers.pipeline import Group, Handler, by_type, current_position, process_record
from consumers.ports import LogPosition
from contracts import topics
from contracts.envelope import Envelope, new_envelope
from contracts.events import EventData, ExecutionFinished, InvokeRequested
from contracts.kafka_binding import encode
from tests.handlers.conftest import FIXED_NOW, Harness

INVOCATION = "inv-shared"


def record_of(data: EventData, offset: int = 7) -> SimpleNamespace:
    envelope: Envelope = new_envelope(
        data, source="urn:test", partitionkey=INVOCATION, correlationid=INVOCATION,
        id=str(uuid.uuid4()), time=FIXED_NOW)
    record = encode(envelope)
    return SimpleNamespace(topic=topics.INVOCATIONS, partition=2, offset=offset,
                           key=record.key, value=record.value, headers=list(record.headers))


def request() -> SimpleNamespace:
    return record_of(InvokeRequested(invocation_id=INVOCATION, tool_id="py_echo",
                                     version_range="*", parameters={}))


def finished() -> SimpleNamespace:
    return record_of(ExecutionFinished(invocation_id=INVOCATION, attempt=1, tool_id="py_echo",
                                       version="1.0.0", outcome="success", duration_ms=1.0))


class Log:
    """What the handlers did and what the group published, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.published: list[Envelope] = []

    async def publish(self, envelope: Envelope) -> None:
        self.published.append(envelope)

    def of_type(self, event_type: str) -> list[Any]:
        return [e.data for e in self.published if e.type == event_type]

    def succeeds(self, step: str) -> Any:
        async def react(event: Envelope) -> None:
            self.calls.append(f"{step}:{event.type}")
        return react

    def crashes(self, step: str) -> Any:
        async def react(event: Envelope) -> None:
            self.calls.append(f"{step}:{event.type}")
            raise RuntimeError(f"{step} bug")
        return react


def deps_for(log: Log, dead_letters: Any = None) -> Any:
    return SimpleNamespace(dead_letters=dead_letters or DeadLetters(log.publish, lambda: FIXED_NOW),
                           resolve=SimpleNamespace(publish=log.publish), clock=lambda: FIXED_NOW)


def group_of(*handlers: Handler) -> Group:
    return Group("t.pipeline", by_type(handlers), dead_letter_undecodable=True)


async def test_every_handler_of_the_type_runs_in_the_order_registered() -> None:
    log = Log()
    group = group_of(Handler("tool.invoke.requested", "authorize", log.succeeds("authorize")),
                     Handler("tool.execution.finished", "finalize", log.succeeds("finalize")),
                     Handler("tool.invoke.requested", "resolve", log.succeeds("resolve")))
    await process_record(request(), group, deps_for(log))
    assert log.calls == ["authorize:tool.invoke.requested", "resolve:tool.invoke.requested"]
    assert log.published == []


async def test_a_poisoned_step_ends_the_invocation_and_the_later_steps_skip_it() -> None:
    log = Log()
    group = group_of(Handler("tool.invoke.requested", "authorize", log.crashes("authorize")),
                     Handler("tool.invoke.requested", "resolve", log.succeeds("resolve")))
    await process_record(request(), group, deps_for(log))
    assert log.calls == ["authorize:tool.invoke.requested"] * 3
    [letter] = log.of_type("deadletter.recorded")
    assert (letter.consumer, letter.attempts, letter.offset) == ("t.pipeline/authorize", 3, 7)
    assert "authorize bug" in letter.error.details["traceback"]
    [failed] = log.of_type("tool.invoke.failed")
    assert (failed.stage, failed.error.code, failed.error.details["step"]) == (
        "authorize", "E3000", "authorize")


async def test_a_side_step_failing_leaves_the_invocation_to_the_others() -> None:
    log = Log()
    group = group_of(Handler("tool.execution.finished", "finalize", log.succeeds("finalize")),
                     Handler("tool.execution.finished", "circuits", log.crashes("circuits"),
                             fails_invocation=False))
    await process_record(finished(), group, deps_for(log))
    assert [letter.consumer for letter in log.of_type("deadletter.recorded")] == [
        "t.pipeline/circuits"]
    assert log.of_type("tool.invoke.failed") == []


async def test_a_side_step_still_runs_after_a_step_on_the_path_gave_up() -> None:
    log = Log()
    group = group_of(Handler("tool.execution.finished", "finalize", log.crashes("finalize")),
                     Handler("tool.execution.finished", "circuits", log.succeeds("circuits"),
                             fails_invocation=False))
    await process_record(finished(), group, deps_for(log))
    assert log.calls == ["finalize:tool.execution.finished"] * 3 + [
        "circuits:tool.execution.finished"]
    assert [f.stage for f in log.of_type("tool.invoke.failed")] == ["finalize"]


async def test_each_poisoned_handler_leaves_its_own_dead_letter_and_failure() -> None:
    log = Log()
    group = group_of(Handler("tool.execution.finished", "finalize", log.crashes("finalize")),
                     Handler("tool.execution.finished", "circuits", log.crashes("circuits"),
                             fails_invocation=False))
    await process_record(finished(), group, deps_for(log))
    letters = [e for e in log.published if e.type == "deadletter.recorded"]
    assert [e.data.consumer for e in letters] == ["t.pipeline/finalize", "t.pipeline/circuits"]
    assert len({e.id for e in letters}) == 2  # not taken for one redelivered letter
    assert [f.stage for f in log.of_type("tool.invoke.failed")] == ["finalize"]


async def test_an_unpublishable_failure_is_raised_once_the_side_steps_ran() -> None:
    class Unpublishable:
        async def record(self, record: Any, error: Any, *, consumer: str, attempts: int) -> None:
            raise MessageSizeTooLargeError()

    log = Log()
    group = group_of(Handler("tool.execution.finished", "finalize", log.crashes("finalize")),
                     Handler("tool.execution.finished", "later", log.succeeds("later")),
                     Handler("tool.execution.finished", "circuits", log.succeeds("circuits"),
                             fails_invocation=False))
    with pytest.raises(MessageSizeTooLargeError):  # the group then holds the record
        await process_record(finished(), group, deps_for(log, Unpublishable()))
    assert log.calls == ["finalize:tool.execution.finished"] * 3 + [
        "circuits:tool.execution.finished"]


async def test_undecodable_record_is_dead_lettered_once_whatever_its_handlers() -> None:
    log = Log()
    group = group_of(Handler("tool.invoke.requested", "authorize", log.succeeds("authorize")),
                     Handler("tool.invoke.requested", "resolve", log.succeeds("resolve")))
    bad = SimpleNamespace(topic=topics.INVOCATIONS, partition=0, offset=3, key=b"k",
                          value=b"{not json", headers=[("ce_type", b"tool.invoke.requested")])
    await process_record(bad, group, deps_for(log))
    assert [letter.consumer for letter in log.of_type("deadletter.recorded")] == ["t.pipeline"]
    assert log.calls == []


async def test_every_handler_sees_the_records_position() -> None:
    seen: list[LogPosition | None] = []

    async def read_back(event: Envelope) -> None:
        seen.append(current_position())

    group = group_of(Handler("tool.invoke.requested", "authorize", read_back),
                     Handler("tool.invoke.requested", "resolve", read_back))
    await process_record(request(), group, deps_for(Log()))
    assert seen == [LogPosition(topics.INVOCATIONS, 2, 7)] * 2
    assert current_position() is None


async def test_authorize_crashing_on_a_request_ends_the_invocation_once(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    async def crash(event: Envelope, deps: Any) -> None:
        raise RuntimeError("authorize bug")

    monkeypatch.setattr(consumers.authorize, "on_invoke_requested", crash)
    invocation = await harness.request("py_echo", {"text": "x"})
    failed = harness.of(invocation, "tool.invoke.failed")[0].data
    assert (failed.stage, failed.error.code) == ("authorize", "E3000")
    assert [d["consumer"] for d in harness.deadletters] == ["test.pipeline/authorize"]
    assert harness.of(invocation, "tool.chain.resolved") == []
    assert harness.terminal(invocation).type == "tool.invoke.failed"  # exactly one
