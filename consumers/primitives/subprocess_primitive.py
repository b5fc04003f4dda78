"""The subprocess primitive: runs one tool process and reports what it observed.

Each run gets a directory of its own holding the tool's files (run_directory: under
bubblewrap a tmpfs inside the sandbox, elsewhere a fresh host folder under
`work_root`, removed afterwards), enters its sandbox (sandboxes, sandbox_launch) and is spawned and
watched by the process core (tool_process); how it ended is classified by
exit_status. The plan's limits and timeout are first brought under the operator's
ceilings (domain.sandbox_policy; each value cut down is logged as
`sandbox.limits_narrowed`). A sandbox that cannot be set up (bwrap missing, a kernel
without Landlock, or the wrapper failing before the tool starts) fails the run
closed with E3405; falling back is the operator's explicit choice ("auto" via
`resolve_sandbox`). Long-lived processes (stdio MCP servers) are service_process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from consumers.primitives import bubblewrap, egress_relay, launcher_program
from consumers.primitives.exit_status import (
    check_landlock_setup,
    check_setup,
    error_for,
    unwrap_bwrap_status,
    unwrap_init_status,
)
from consumers.primitives.file_store import ContentStore, relative_parts
from consumers.primitives.namespace_process import spawn_namespaced
from consumers.primitives.report_file import (
    ReportChannel,
    follow,
    open_channel,
    shared_folder,
    tool_environment,
)
from consumers.primitives.run_directory import (
    FRESH_ROOT_SANDBOXES,
    RunDirectory,
    environment,
    in_sandbox,
    on_host,
)
from consumers.primitives.sandbox_cache import shared_cache
from consumers.primitives.sandbox_launch import Launch, prepare_launch
from consumers.primitives.sandboxes import (
    NO_SANDBOX,
    SANDBOXES,
    check_sandbox,
    resolve_sandbox,
    rlimits_for,
    through_launcher,
)
from consumers.primitives.tool_process import ToolProcess, spawn
from domain.errors import ExecutionError, ToolexecError, ValidationFailed
from domain.model import PrimitiveOutcome, SubprocessPlan
from domain.sandbox_policy import SandboxPolicy, narrow_subprocess
from domain.system_strings import check_process

if TYPE_CHECKING:
    from consumers.ports import ToolSession

__all__ = ["DEFAULT_POLICY", "NO_SANDBOX", "SANDBOXES", "narrowed", "resolve_sandbox",
           "run_subprocess"]

log = structlog.get_logger(__name__)

DEFAULT_POLICY = SandboxPolicy()


async def run_subprocess(plan: SubprocessPlan, params: Mapping[str, Any], *,
                         store: ContentStore, work_root: Path,
                         sandbox: str = "rlimits",
                         policy: SandboxPolicy = DEFAULT_POLICY,
                         session: ToolSession | None = None) -> PrimitiveOutcome:
    """Run `plan` once with `params` on stdin and return what was observed; with a
    `session`, the tool's reports are read while it runs and handed to it
    (consumers.primitives.report_file), and a refusal of the session ends the run.

    Never raises for tool or plan problems: they come back as an outcome with
    `error = {code, message, details}` (E3301 parameters not JSON, E3105 tampered or
    missing file, E3401 failure / unsafe path / executable not found / an argument or
    variable the OS refuses (NUL, `=` in a name, unencodable text), E3402 timeout,
    E3403 out of memory, E3404 killed by a signal, E3405 sandbox, E3407 resource
    limit). `duration_ms` covers the whole run, its run directory included.
    """
    started = time.perf_counter()
    plan = narrowed(plan, policy)
    sandbox = through_launcher(sandbox, network_allowed=bubblewrap.network_allowed(plan.network))
    try:
        check_process(plan.argv, plan.env)  # under every sandbox, before any is set up
        stdin = _encode_params(params)
        check_sandbox(sandbox)
        cwd_parts = relative_parts(plan.cwd, allow_root=True)
    except ToolexecError as error:
        return _failed(error, started, sandbox)
    run_dir: RunDirectory | None = None
    launch: Launch | None = None
    channel: ReportChannel | None = None
    try:
        run_dir = _run_directory(sandbox, store, plan, work_root, cwd_parts)
        env = environment(plan, run_dir.path)
        if session is not None:
            channel = open_channel(run_dir, sandbox, _reports_folder(), session.resume_state)
            env = tool_environment(env, channel)
        launch = prepare_launch(sandbox, plan, run_dir, env["PATH"], policy,
                                binds=channel.binds if channel is not None else ())
        env.update(launch.env)
        rlimits = rlimits_for(plan.limits, sandbox, launch)
        process = (await spawn_namespaced(plan.argv, env, run_dir, rlimits, launch, plan.limits)
                   if launch.request is not None
                   else ToolProcess(spawn(plan.argv, env, run_dir, rlimits, launch), plan.limits))
        return await _supervise(process, stdin, plan, started, sandbox, channel, session)
    except ToolexecError as error:
        return _failed(error, started, sandbox)
    except OSError as error:  # the run directory could not be prepared (disk full...)
        return _failed(ExecutionError(f"could not prepare the run directory: {error}",
                                      code="E3405"), started, sandbox)
    finally:
        if launch is not None:
            await launch.close()
        if channel is not None:
            channel.close()
        if run_dir is not None:
            run_dir.close()


def _run_directory(sandbox: str, store: ContentStore, plan: SubprocessPlan, work_root: Path,
                   cwd_parts: tuple[str, ...]) -> RunDirectory:
    """Under bubblewrap and the namespace launcher the run directory exists only in
    the sandbox; elsewhere the
    tool writes into a fresh host folder (see run_directory)."""
    if sandbox in FRESH_ROOT_SANDBOXES:
        trees = shared_cache(bubblewrap.SYSTEM_ETC_ENTRIES).trees
        return in_sandbox(store, plan.files, work_root, cwd_parts, trees)
    return on_host(store, plan.files, work_root, cwd_parts)


def _reports_folder() -> Path:
    """Where fresh-root runs' report files are made (report_file.shared_folder)."""
    return shared_folder(shared_cache(bubblewrap.SYSTEM_ETC_ENTRIES).root)


def narrowed(plan: SubprocessPlan, policy: SandboxPolicy) -> SubprocessPlan:
    """`plan` under the operator's ceilings; every value cut down is logged."""
    plan, cuts = narrow_subprocess(plan, policy)
    if cuts:
        log.info("sandbox.limits_narrowed", argv0=plan.argv[0] if plan.argv else None,
                 narrowed=[cut.to_dict() for cut in cuts])
    return plan


async def _supervise(process: ToolProcess, stdin: bytes, plan: SubprocessPlan,
                     started: float, sandbox: str, channel: ReportChannel | None = None,
                     session: ToolSession | None = None) -> PrimitiveOutcome:
    try:
        process.send_stdin(stdin)
        if channel is None or session is None:
            timed_out = not await process.wait(plan.timeout_seconds)
            refused = None
        else:
            timed_out, refused = await _wait_following(process, plan, channel, session)
        status, usage = process.exit_status()
        if sandbox == "bwrap":
            status = unwrap_bwrap_status(status, process.stderr)
        elif sandbox == "namespaces":
            status = unwrap_init_status(status)
            check_setup(status, process.stderr, launcher_program.MESSAGE_PREFIX, sandbox)
        elif sandbox == "landlock":
            check_landlock_setup(status, process.stderr)
        check_setup(status, process.stderr, egress_relay.MESSAGE_PREFIX, sandbox)
        error = refused.to_dict() if refused is not None else error_for(
            status, usage, timed_out, process.stderr, plan, inherited_rss=process.inherited_rss)
        return PrimitiveOutcome(
            ok=error is None,
            stdout=bytes(process.stdout.data), stderr=bytes(process.stderr.data),
            exit_code=None if status is None else os.waitstatus_to_exitcode(status),
            stdout_truncated=process.stdout.truncated,
            stderr_truncated=process.stderr.truncated,
            duration_ms=_elapsed_ms(started), error=error, sandbox=sandbox,
        )
    finally:
        process.release()


async def _wait_following(process: ToolProcess, plan: SubprocessPlan, channel: ReportChannel,
                          session: ToolSession) -> tuple[bool, ToolexecError | None]:
    """Wait for the tool while its reports are followed: (timed out, the session's
    refusal, which killed the tool). The reports it wrote last are read after it
    exits."""
    ended = asyncio.Event()
    following = asyncio.create_task(follow(channel.reader, session.receive, ended))
    waiting = asyncio.create_task(process.wait(plan.timeout_seconds))
    try:
        await asyncio.wait({following, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if following.done() and not following.cancelled() \
                and isinstance(following.exception(), ToolexecError):
            process.kill_group()
            await waiting
            error = following.exception()
            assert isinstance(error, ToolexecError)
            return False, error
        timed_out = not await waiting
        ended.set()
        try:
            await following
        except ToolexecError as refusal:  # a refused last report fails the attempt too
            return timed_out, refusal
        return timed_out, None
    finally:
        for task in (following, waiting):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def _encode_params(params: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(dict(params), ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode()
    except (TypeError, ValueError) as error:
        raise ValidationFailed(f"parameters are not JSON-serialisable: {error}",
                               code="E3301") from error



def _failed(error: ToolexecError, started: float, sandbox: str) -> PrimitiveOutcome:
    return PrimitiveOutcome(ok=False, error=error.to_dict(), duration_ms=_elapsed_ms(started),
                            sandbox=sandbox)


def _elapsed_ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
