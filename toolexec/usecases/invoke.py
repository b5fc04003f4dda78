"""Invoking a tool through the pipeline: the request checked first (tool, parameters,
lockfile, tool directories), then run on the running `up` (found via
.toolexec/runtime.json) or on an embedded stack started for the call."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from domain.errors import InvalidRequest, ToolexecError
from domain.request_limits import (
    DEFAULT_MAX_PARAMETER_BYTES,
    PayloadRejected,
    check_request_payload,
    strict_json_loads,
)
from toolexec import rights
from toolexec.runtime_file import read_runtime
from toolexec.settings import Settings, fetch_waits, kafka_client_options
from toolexec.usecases.callbacks import checked_callback_url
from toolexec.usecases.publish import (
    find_sources,
    publish_to_running,
    publish_to_stack,
    require_existing,
)

if TYPE_CHECKING:
    from contracts.envelope import Envelope
    from toolexec.client import Progress
    from toolexec.publishing import Publication


@dataclass(frozen=True)
class ToolSpec:
    """`TOOL` or `TOOL@RANGE`."""

    tool_id: str
    version_range: str = "*"

    @classmethod
    def parse(cls, text: str) -> ToolSpec:
        tool_id, _, version_range = text.strip().partition("@")
        if not tool_id:
            raise InvalidRequest(f"expected TOOL or TOOL@RANGE, got {text!r}",
                                 details={"tool": text})
        return cls(tool_id, version_range or "*")


def check_parameters(parameters: Any, *, lockfile: Any = None,
                     max_bytes: int = DEFAULT_MAX_PARAMETER_BYTES) -> dict[str, Any]:
    """`parameters` when they are a JSON object of strict JSON within `max_bytes`
    (and `lockfile`, if any, an object too); InvalidRequest / PayloadRejected (E3004)
    otherwise."""
    if not isinstance(parameters, Mapping):
        raise InvalidRequest("the parameters must be a JSON object",
                             details={"type": type(parameters).__name__})
    if lockfile is not None and not isinstance(lockfile, Mapping):
        raise InvalidRequest("the lockfile must be a JSON object",
                             details={"type": type(lockfile).__name__})
    check_request_payload(dict(parameters), lockfile=lockfile, max_bytes=max_bytes)
    return dict(parameters)


def parse_parameters(pairs: list[str], params_json: str | None,
                     max_bytes: int = DEFAULT_MAX_PARAMETER_BYTES) -> dict[str, Any]:
    """`--params` (strict JSON: no NaN, Infinity or lone surrogates) merged with each
    `key=value` (the value read as strict JSON, else taken as text). Raises
    InvalidRequest (E3004) for parameters that are not a strict JSON object, a pair
    without `=`, or parameters past `max_bytes`."""
    params: dict[str, Any] = {}
    if params_json:
        loaded = strict_json_loads(params_json)
        if not isinstance(loaded, dict):
            raise InvalidRequest("--params must be a JSON object",
                                 details={"params": params_json[:200]})
        params.update(loaded)
    for pair in pairs:
        if "=" not in pair:
            raise InvalidRequest(f"-p expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            params[key] = strict_json_loads(value)
        except PayloadRejected:
            params[key] = value
    return check_parameters(params, max_bytes=max_bytes)


def read_lockfile(path: Path | None) -> dict[str, Any] | None:
    """The lockfile at `path` (InvalidRequest when it cannot be read as a JSON object)."""
    if path is None:
        return None
    try:
        loaded = strict_json_loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise InvalidRequest(f"cannot read the lockfile {path}: {error.strerror or error}",
                             details={"path": str(path)}) from None
    except PayloadRejected as error:
        raise InvalidRequest(f"the lockfile {path} is not JSON: {error.message}",
                             details={"path": str(path)}) from None
    if not isinstance(loaded, dict):
        raise InvalidRequest(f"the lockfile {path} is not a JSON object",
                             details={"path": str(path)})
    return loaded


async def invoke_tool(settings: Settings, tool: ToolSpec, parameters: dict[str, Any], *,
                      lockfile: dict[str, Any] | None = None, token: str | None = None,
                      tools: list[Path] | None = None, timeout: float = 120.0,
                      progress: Progress | None = None,
                      on_published: Callable[[list[Publication]], None] | None = None,
                      callback_url: str | None = None) -> Envelope:
    """Invoke a tool through the pipeline of the running `up`, or of an embedded stack
    started for this call when none runs; the tools under `tools` are published first
    (with authorization on, `token` must hold the publish scope for each new one;
    `on_published` sees what publishing them did). Returns the terminal event.
    Raises InvalidRequest for a missing tool directory, AuthorizationError when the
    token may not publish, InvocationNotDelivered / InvocationUnresolved (E3001 /
    E3002) when the pipeline cannot be reached or does not answer in `timeout`.
    `callback_url` (E3004 / E3406 unless the operator allows it) also receives the
    terminal result, from the callback deliverer of `toolexec up`."""
    from contracts.fact_signature import FactVerifier
    from toolexec import keys
    from toolexec.client import InvocationClient
    from toolexec.stack import Stack

    tools = tools or []
    require_existing(tools)
    callback_url = checked_callback_url(callback_url, settings)
    runtime = read_runtime(settings)
    if runtime is not None:
        async with InvocationClient(runtime["kafka_bootstrap"], fetch_waits=fetch_waits(settings),
                                    verifier=FactVerifier(keys.fact_verify_keys(settings)),
                                    client_options=kafka_client_options(settings),
                                    seal_to=keys.token_seal_public_key(settings)) as client:
            if tools:
                published = await publish_to_running(client, runtime,
                                                     find_sources(tools, settings),
                                                     settings, token)
                if on_published:
                    on_published(published)
            return await client.invoke(tool.tool_id, parameters,
                                       version_range=tool.version_range, lockfile=lockfile,
                                       token=token, timeout=timeout, progress=progress,
                                       callback_url=callback_url)
    async with Stack(settings) as stack:
        published = await publish_to_stack(stack, tools, settings, token,
                                           check_rights=rights.auth_required(settings))
        if on_published:
            on_published(published)
        async with InvocationClient(stack.bootstrap, pipeline=stack.pipeline,
                                    verifier=stack.verifier, fetch_waits=fetch_waits(settings),
                                    client_options=kafka_client_options(settings),
                                    seal_to=keys.token_seal_public_key(settings)) as client:
            return await stack.unless_state_gone(client.invoke(
                tool.tool_id, parameters, version_range=tool.version_range,
                lockfile=lockfile, token=token, timeout=timeout, progress=progress,
                callback_url=callback_url))


async def submit_tool(settings: Settings, tool: ToolSpec, parameters: dict[str, Any], *,
                      lockfile: dict[str, Any] | None = None, token: str | None = None,
                      callback_url: str | None = None) -> str:
    """Request an invocation from the running `up` without waiting (execution_mode
    async) and return its id; follow it with `usecases.timeline`, or by `callback_url`.
    Raises InvocationNotDelivered (E3001) when no `up` runs (an embedded stack started
    for the call would stop before the invocation ends) or the broker does not take it,
    InvalidRequest / NetworkPolicyViolation for a callback URL not allowed."""
    from contracts.fact_signature import FactVerifier
    from toolexec import keys
    from toolexec.client import InvocationClient, InvocationNotDelivered

    callback_url = checked_callback_url(callback_url, settings)
    runtime = read_runtime(settings)
    if runtime is None:
        raise InvocationNotDelivered("an asynchronous invocation needs a running "
                                     "`toolexec up`", details={"tool_id": tool.tool_id})
    async with InvocationClient(runtime["kafka_bootstrap"], fetch_waits=fetch_waits(settings),
                                verifier=FactVerifier(keys.fact_verify_keys(settings)),
                                client_options=kafka_client_options(settings),
                                seal_to=keys.token_seal_public_key(settings)) as client:
        request = await client.submit(tool.tool_id, parameters,
                                      version_range=tool.version_range, lockfile=lockfile,
                                      token=token, callback_url=callback_url)
    return str(request.correlationid)


def completed_result(terminal: Envelope) -> dict[str, Any]:
    """A completed invocation's answer; a failed one raises its ToolexecError (with the
    invocation id and stage in the details)."""
    data: Any = terminal.data
    if terminal.type != "tool.invoke.completed":
        raise ToolexecError(data.error.message, code=data.error.code,
                            details={**data.error.details, "invocation_id": data.invocation_id,
                                     "stage": data.stage})
    return {"status": "completed", "tool_id": data.tool_id, "version": data.version,
            "invocation_id": data.invocation_id, "result": data.result,
            "duration_ms": data.duration_ms, "attempts": data.attempts}
