"""The `checkpoints` scenario of `toolexec bench`: what checkpointing costs a
long-running tool, and how well its state is stored.

One Python tool takes `steps` steps (a pause a little longer than the executor's
checkpoint coalescing interval, so none is merged away), growing a realistic state —
a crawl's cursor, counters and one record per item seen — and runs twice per round,
interleaved: with a checkpoint after each step, and without (the same tool, only the
`checkpoint` call skipped). Both run through the subprocess primitive under the
default sandbox with the executor's real report reading, checkpoint encoding and
store (fsynced files); the events are built and encoded as for the log, but not sent
to a broker. Figures: the tool's wall time per step with and without checkpoints
(paired), the executor's time per checkpoint, and what the store keeps: size over
stored size (gzip and deltas), the share of deltas.
"""

from __future__ import annotations

import hashlib
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from consumers.adapters.checkpoint_store import FileCheckpointStore
from consumers.primitives.file_store import ContentStore
from consumers.primitives.subprocess_primitive import resolve_sandbox, run_subprocess
from consumers.steps.tool_reports import CHECKPOINT_INTERVAL, AttemptReports, ReportTrail
from contracts.envelope import Envelope, new_envelope
from contracts.events import ExecutionCheckpointed, InvokeRequested
from contracts.kafka_binding import encode
from domain.model import SubprocessPlan, ToolFile
from domain.secret_scrub import Scrubber
from toolexec.bench.report import Figure, ScenarioResult, percentile

STEP_PAUSE = CHECKPOINT_INTERVAL * 1.5
TOOL = """
import json, sys, time
import toolexec_tool
params = json.load(sys.stdin)
state = toolexec_tool.last_checkpoint() or {"cursor": None, "counters": {}, "seen": {}}
for step in range(params["steps"]):
    for item in range(25):
        key = f"https://example.org/catalogue/{step:04d}/{item:03d}"
        state["seen"][key] = {"status": 200, "bytes": 1000 + 37 * item,
                              "etag": f"W/\\"{step:04x}{item:04x}\\"", "links": item % 7}
    state["cursor"] = key
    state["counters"] = {"pages": len(state["seen"]), "steps": step + 1}
    if params["checkpoint"]:
        toolexec_tool.checkpoint(state)
    time.sleep(params["pause"])
print(json.dumps({"pages": len(state["seen"])}))
"""


class _Measured(AttemptReports):
    """The executor's session, timing each checkpoint it stores and announces."""

    seconds: list[float]

    async def _checkpoint(self, report: object) -> None:  # type: ignore[override]
        began = time.perf_counter()
        await super()._checkpoint(report)  # type: ignore[arg-type]
        self.seconds.append(time.perf_counter() - began)


def _plan() -> SubprocessPlan:
    content = TOOL.encode()
    tool = ToolFile("main.py", hashlib.sha256(content).hexdigest(), False, content)
    return SubprocessPlan(argv=(sys.executable, "-u", "main.py"), files=(tool,),
                          timeout_seconds=600)


def _cause() -> Envelope:
    """The event the reports' events derive from (a request here: no pipeline runs)."""
    data = InvokeRequested(invocation_id="bench-checkpoints", tool_id="bench_crawl",
                           version_range="*", parameters={})
    return new_envelope(data, source="urn:toolexec:bench", partitionkey="bench-checkpoints",
                        correlationid="bench-checkpoints", id=str(uuid.uuid4()), time=_now())


async def checkpoints_scenario(root: Path, *, steps: int, rounds: int) -> ScenarioResult:
    """Run the scenario (see the module docstring)."""
    sandbox = resolve_sandbox("auto")
    store = FileCheckpointStore(root / "checkpoints")
    content = ContentStore(root / "cas")
    announced: list[ExecutionCheckpointed] = []

    async def publish(event: Envelope) -> None:
        encode(event)  # as for the log
        if isinstance(event.data, ExecutionCheckpointed):
            announced.append(event.data)

    walls: dict[bool, list[float]] = {True: [], False: []}
    executor: list[float] = []
    errors = 0
    for _ in range(rounds):
        for checkpointing in (True, False):
            session = _Measured(_cause(), 1, ReportTrail(), publish, _now, store,
                                Scrubber(()))
            session.seconds = executor
            params = {"steps": steps, "checkpoint": checkpointing, "pause": STEP_PAUSE}
            began = time.perf_counter()
            outcome = await run_subprocess(_plan(), params, store=content,
                                           work_root=root / "work", sandbox=sandbox,
                                           session=session)
            await session.finish()
            walls[checkpointing].append((time.perf_counter() - began) / steps)
            errors += not outcome.ok
    return _result(walls, executor, announced, steps, rounds, errors, sandbox)


def _now() -> datetime:
    return datetime.now(UTC)


def _result(walls: dict[bool, list[float]], executor: list[float],
            announced: list[ExecutionCheckpointed], steps: int, rounds: int, errors: int,
            sandbox: str) -> ScenarioResult:
    with_p50, without_p50 = percentile(walls[True], 50), percentile(walls[False], 50)
    size = sum(c.size for c in announced)
    stored = sum(c.stored_size for c in announced)
    ratio = round(size / stored, 2) if stored else 0.0
    figures: dict[str, Figure] = {
        "with checkpoints ms/step p50": round(with_p50 * 1000, 3),
        "without ms/step p50": round(without_p50 * 1000, 3),
        "overhead ms/step p50": round((with_p50 - without_p50) * 1000, 3),
        "executor ms/checkpoint p50": round(percentile(executor, 50) * 1000, 3),
        "executor ms/checkpoint p95": round(percentile(executor, 95) * 1000, 3),
        "state bytes (last)": announced[-1].size if announced else 0,
        "compression ratio": ratio,
        "stored smaller %": round(100 * (1 - stored / size), 1) if size else 0.0,
        "deltas %": round(100 * sum(c.delta_of is not None for c in announced)
                          / len(announced), 1) if announced else 0.0,
        "gzip %": round(100 * sum(c.compression == "gzip" for c in announced)
                        / len(announced), 1) if announced else 0.0,
        "checkpoints": len(announced),
        "steps (each run)": steps,
        "rounds": rounds,
        "sandbox": sandbox,
        "errors": errors,
    }
    return ScenarioResult(
        "checkpoints", "10. checkpoints of a long-running tool (paired with/without)",
        figures, "stored >= 60 % smaller than the state (size/stored >= 2.5)",
        None if not stored else size / stored >= 2.5,
        ["a round runs the same tool with and without a checkpoint per step, "
         "interleaved; ms/step = the caller's wall time around the run / steps "
         f"(each step pauses {STEP_PAUSE * 1000:g} ms, so the figures show the "
         "difference, not the work)",
         "executor ms/checkpoint = encoding (canonical JSON, delta, gzip), the fsynced "
         "store and the event's encoding; the broker round trip is not included",
         "compression ratio = sum of state sizes / sum of stored sizes (deltas and gzip)"])
