"""Runs handed over by a local producer are counted apart from runs read from the log:
only the latter keep the pipeline's consumer on its short fetch wait."""

from __future__ import annotations

import asyncio

from consumers.runtime.delivery import DeliveringFactLog
from consumers.runtime.invocation_facts import InvocationFacts
from consumers.runtime.runs import RecordRef
from contracts import topics
from contracts.kafka_binding import encode
from tests.handlers.conftest import ScriptedRunner, build_harness
from tests.waiting import WAIT, eventually


async def test_a_handed_over_run_is_active_but_not_from_the_log() -> None:
    harness = build_harness(runner=ScriptedRunner(blocking=True))
    started = []
    for handed_over in (True, False):
        request = harness.request_event("py_echo", {"text": "x"})
        harness.events.append(request)
        record = encode(request)
        started.append(harness.runs.start(
            request, DeliveringFactLog(harness), InvocationFacts(),
            RecordRef(topics.REQUESTS, 0, len(harness.events), record.key, record.value,
                      record.headers), lambda: None, handed_over=handed_over))
        await eventually(lambda: harness.runner.plans, "the tool runs")
        harness.runner.plans.clear()
        assert harness.runs.active == len(started)
        assert harness.runs.active_from_log == (0 if handed_over else 1)

    for run in started:
        harness.runs.cancel(run.invocation_id, "done")
    await asyncio.wait_for(asyncio.gather(*(run.done for run in started)), WAIT)
    assert harness.runs.active == harness.runs.active_from_log == 0
