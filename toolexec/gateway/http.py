"""The HTTP gateway (FastAPI): invoke, register, and read the projections.

It holds no state of its own: requests become events on the log (through
`InvocationClient`), answers come from terminal events or the SQL read models
(`projections.queries`, `projections.audit`). Errors follow `toolexec.gateway.errors`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Protocol

from aiokafka.errors import KafkaError
from fastapi import FastAPI, Header, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts.envelope import Envelope
from contracts.events import TERMINAL_STATUSES
from domain.capability import Capability
from domain.errors import ToolexecError
from domain.lifecycle import LifecycleChange
from domain.manifest import normalise_manifest
from domain.model import PublisherSignature, ToolFile, ToolSource
from domain.paths import canonical_relative
from domain.plan import DEFAULT_TIMEOUT_SECONDS, manifest_timeout
from domain.retry import RetryPolicy, longest_run_seconds
from domain.semver import select_highest
from projections.audit import AuditQuery
from projections.queries import (
    invocation_status,
    list_circuits,
    list_invocations,
    search_tools,
    show_tool,
)
from projections.registry_snapshot import registry_snapshot
from projections.search import MAX_SEARCH_OFFSET
from toolexec import metrics, rights
from toolexec.client import InvocationClient, InvocationNotDelivered, InvocationUnresolved
from toolexec.gateway import status_page
from toolexec.gateway.access import (
    bearer,
    caller,
    check_visible,
    read_token,
    session_routes,
    sign_in_page,
    subject_filter,
)
from toolexec.gateway.body import RequestBodyGuard, body_limits
from toolexec.gateway.errors import (
    ApiError,
    check_invoke_payload,
    documented,
    error_response,
    install_error_handlers,
)
from toolexec.gateway.models import (
    ApprovalDecisionAnswer,
    ApprovalDecisionRequest,
    ApprovalList,
    AuditPage,
    CancelAccepted,
    CancelRequest,
    CircuitList,
    DefinitionApproval,
    DefinitionApproved,
    DefinitionList,
    Health,
    InvocationError,
    InvocationList,
    InvocationView,
    InvokeAccepted,
    InvokeRequest,
    InvokeResult,
    LifecycleRequest,
    LifecycleResult,
    PendingApproval,
    RegisterRequest,
    RegisterResult,
    ToolDetail,
    ToolList,
)
from toolexec.publishing import Publication, plan_publications, planned_tool_ids, signed
from toolexec.settings import Settings
from toolexec.sources import bash_syntax_check
from toolexec.usecases.approval import (
    PENDING_LIMIT,
    decide_approval,
    list_pending,
    waiting_call,
)
from toolexec.usecases.audit import audit_page, utc
from toolexec.usecases.callbacks import checked_callback_url
from toolexec.usecases.cancel import cancel_invocation, shown_status
from toolexec.usecases.definitions import approve_with, list_pins
from toolexec.usecases.lifecycle import checked_reading_your_writes, lifecycle_event
from toolexec.usecases.registry import search_page, with_publishers
from toolexec.usecases.status import status_snapshot
from toolexec.usecases.timeline import checkpoint_totals, latest_progress

REQUESTED_BY = "urn:toolexec:gateway"
WAIT_SLACK_SECONDS = 10.0
HEALTH_TIMEOUT = 3.0
CATCH_UP_SECONDS = 10.0  # right after start the read models fold a backlog
TIMELINE_LIMIT = 1000
SNAPSHOT_MODELS = ("invocations", "approvals", "circuits")
"""The read models `status_snapshot` reads (the status page and its JSON)."""
STATUS_SCRIPT = (Path(__file__).parent / "static" / "status.js").read_bytes()


class LogProbe(Protocol):
    """What the gateway asks the broker besides producing: is it up, how far behind."""

    async def ping(self) -> None: ...

    async def lag(self) -> Mapping[str, int]: ...


@dataclass
class GatewayContext:
    """The running parts the gateway reads and writes through (wired by `toolexec.gateway.server`)."""

    settings: Settings
    engine: AsyncEngine
    client: InvocationClient
    probe: LogProbe
    consumers: Callable[[], Mapping[str, str]]
    """Consumer name -> "running" or why not."""
    catch_up: Callable[[str, float], Awaitable[bool]]
    """Wait (bounded) until the named read model holds every record in the log now."""
    asyncapi: Callable[[], dict[str, Any]] = dict
    manifest_of: Callable[[str], Mapping[str, Any] | None] | None = None
    """The manifest a request for the tool would resolve to now (the in-memory
    registry view), for the sync wait bound; None = read the registry read model."""


def current_manifest(registry: Any, tool_id: str) -> Mapping[str, Any] | None:
    """The manifest of `tool_id`'s highest active version in a registry view."""
    active = {v.version: v for v in registry.versions(tool_id) if v.lifecycle == "active"}
    best = select_highest(active, "*")
    return None if best is None else active[best].manifest


_bearer = bearer


def _status_url(invocation_id: str) -> str:
    return f"/v1/invocations/{invocation_id}"


def wait_bound(manifest: Mapping[str, Any] | None, registry_wait: float) -> float:
    """How long a sync call waits: the longest the tool's attempts take by the rules
    the executor applies (domain.plan timeout, domain.retry policy and backoff), plus
    the resolver's registry wait and some slack for the other steps."""
    manifest = manifest or {}
    try:
        timeout = manifest_timeout(manifest) or DEFAULT_TIMEOUT_SECONDS
        policy = RetryPolicy.from_manifest(manifest)
    except (ToolexecError, TypeError, ValueError):  # the pipeline will refuse it at once
        timeout, policy = DEFAULT_TIMEOUT_SECONDS, RetryPolicy()
    return longest_run_seconds(timeout, policy) + registry_wait + WAIT_SLACK_SECONDS


def invocation_view(row: Mapping[str, Any]) -> InvocationView:
    """The API view of an invocations row ("cancelled" is a failure with E3703)."""
    status = shown_status(row)
    result = None
    if row["status"] == "completed" and row["result_summary"] is not None:
        with contextlib.suppress(ValueError):
            result = json.loads(row["result_summary"])
    error = None if row["error_code"] is None else InvocationError(
        code=row["error_code"], message=row["error_message"] or "", stage=row["failed_stage"])
    keep = ("invocation_id", "tool_id", "version_range", "version", "subject", "requested_by",
            "attempts", "duration_ms", "requested_at", "updated_at", "finished_at",
            "cancel_requested", "result_summary", "timeline")
    return InvocationView(status=status, result=result, error=error,
                          progress=latest_progress(row), checkpoints=checkpoint_totals(row),
                          **{name: row[name] for name in keep})


def create_app(ctx: GatewayContext) -> FastAPI:
    """The gateway's FastAPI application over `ctx`."""
    app = FastAPI(title="toolexec gateway", version="0.1.0",
                  description="Invoke tools through the event pipeline and read the projections. "
                  "Errors are `{\"error\": {\"code\", \"message\", \"details\"}}`.")
    install_error_handlers(app)
    app.add_middleware(RequestBodyGuard, limit_for=body_limits(
        ctx.settings.gateway_max_body_bytes, ctx.settings.gateway_max_register_bytes))

    @app.exception_handler(SQLAlchemyError)
    async def store_down(request: Request, exc: SQLAlchemyError) -> JSONResponse:
        return error_response(503, "E3001", "projection store unavailable",
                              {"type": type(exc).__name__})

    @app.exception_handler(KafkaError)
    async def broker_down(request: Request, exc: KafkaError) -> JSONResponse:
        return error_response(503, "E3801", "Kafka unavailable", {"type": type(exc).__name__})

    _invocation_routes(app, ctx)
    _registry_routes(app, ctx)
    _definition_routes(app, ctx)
    _read_routes(app, ctx)
    _operations_routes(app, ctx)
    return app


def _invocation_routes(app: FastAPI, ctx: GatewayContext) -> None:
    @app.post("/v1/tools/invoke", response_model=InvokeResult, tags=["invocations"],
              responses={202: {"model": InvokeAccepted},
                         **documented(400, 401, 403, 404, 409, 410, 413, 422, 429, 500, 503,
                                      504)})
    async def invoke(body: InvokeRequest,
                     authorization: Annotated[str | None, Header()] = None) -> Any:
        """Run a tool through the pipeline. The bearer token travels as the request's
        `captoken`. sync: answers with the result (or the failure's status and code);
        async: answers 202 with the invocation id at once."""
        check_invoke_payload(body.parameters, body.lockfile, ctx.settings.max_parameter_bytes)
        callback_url = checked_callback_url(body.callback_url, ctx.settings)
        token = _bearer(authorization)
        if body.execution_mode == "async":
            try:
                request = await ctx.client.submit(
                    body.tool_id, body.parameters, version_range=body.tool_version,
                    lockfile=body.lockfile, token=token, requested_by=REQUESTED_BY,
                    callback_url=callback_url)
            except InvocationNotDelivered as error:
                raise ApiError(error.code, error.message, error.details) from None
            iid = request.data.invocation_id
            accepted = InvokeAccepted(invocation_id=iid, status_url=_status_url(iid))
            return JSONResponse(accepted.model_dump(), status_code=202,
                                headers={"Location": accepted.status_url})
        bound = body.timeout_seconds or await _tool_wait_bound(ctx, body.tool_id)
        started = time.monotonic()
        request_id = ctx.client.new_invocation_id()
        try:
            terminal = await ctx.client.invoke(
                body.tool_id, body.parameters, version_range=body.tool_version,
                lockfile=body.lockfile, token=token, timeout=bound, invocation_id=request_id,
                requested_by=REQUESTED_BY, callback_url=callback_url)
        except InvocationUnresolved:
            raise ApiError("E3002", f"no terminal event within {bound:.0f} s; the invocation "
                           "goes on: poll status_url",
                           {"invocation_id": request_id,
                            "status_url": _status_url(request_id)}) from None
        except InvocationNotDelivered as error:
            raise ApiError(error.code, error.message, error.details) from None
        return _terminal_answer(terminal, started)

    @app.get("/v1/invocations", response_model=InvocationList, tags=["invocations"],
             responses=documented(401, 403, 422, 503))
    async def invocations(request: Request,
                          tool: Annotated[str | None, Query(max_length=200)] = None,
                          status: Annotated[str | None, Query(max_length=20)] = None,
                          limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> InvocationList:
        """Most recently updated invocations first, by tool and status, as of every event
        in the log when asked. With authorization on, the caller's own (its token's
        subject) unless the token has the audit scope."""
        capability = caller(ctx.settings, read_token(request))
        await ctx.catch_up("invocations", CATCH_UP_SECONDS)
        async with ctx.engine.connect() as conn:
            rows = await list_invocations(conn, tool_id=tool, status=status, limit=limit,
                                          subject=subject_filter(capability))
        views = [invocation_view(row) for row in rows]
        return InvocationList(invocations=views, count=len(views), limit=limit)

    @app.get("/v1/invocations/{invocation_id}", response_model=InvocationView,
             tags=["invocations"], responses=documented(401, 403, 404, 503))
    async def invocation(invocation_id: str, request: Request) -> InvocationView:
        """Status (requested, resolved, authorized, running, completed, failed, cancelled),
        timeline, and result or error of one invocation, from the invocations read model.
        With authorization on, only its subject (or a token with the audit scope) reads it."""
        capability = caller(ctx.settings, read_token(request))
        row = await _known_invocation(ctx, invocation_id)
        check_visible(capability, row)
        return invocation_view(row)

    @app.post("/v1/invocations/{invocation_id}/approval", response_model=ApprovalDecisionAnswer,
              status_code=202, tags=["approvals"],
              responses={200: {"model": ApprovalDecisionAnswer},
                         **documented(401, 403, 404, 422, 503)})
    async def approval(invocation_id: str, body: ApprovalDecisionRequest,
                       request: Request) -> JSONResponse:
        """Approve or deny the call of an invocation waiting for an approver
        (`tool.approval.decided`): 202 when sent; 200 when nothing was sent (the
        invocation has ended); 404 (E3702) when no call of that id waits for approval. With authorization on, the token needs the `approve`
        scope for the tool (403 E3206) and its subject is who decided."""
        token = read_token(request)
        capability = caller(ctx.settings, token)
        await ctx.catch_up("approvals", CATCH_UP_SECONDS)
        row = await waiting_call(ctx.engine, invocation_id)
        try:
            outcome = await decide_approval(
                ctx.client, invocation_id, row, verdict=body.decision, capability=capability,
                token=token, front_end=REQUESTED_BY, reason=body.reason,
                approved_hash=body.approved_hash)
        except InvocationNotDelivered as error:
            raise ApiError(error.code, error.message, error.details) from None
        answer = ApprovalDecisionAnswer(**outcome.to_dict(),
                                        status_url=_status_url(invocation_id))
        return JSONResponse(answer.model_dump(),
                            status_code=202 if outcome.status == "decided" else 200)

    @app.get("/v1/approvals", response_model=ApprovalList, tags=["approvals"],
             responses=documented(401, 503))
    async def approvals(request: Request,
                        limit: Annotated[int, Query(ge=1, le=PENDING_LIMIT)] = PENDING_LIMIT,
                        ) -> ApprovalList:
        """Calls waiting for an approver, the oldest first, as of every event in the log
        when asked. With authorization on, those the token may approve (`approve` scope
        for the tool) or made as its subject."""
        capability = caller(ctx.settings, read_token(request))
        await ctx.catch_up("approvals", CATCH_UP_SECONDS)
        rows = await list_pending(ctx.engine, capability, limit=limit)
        return ApprovalList(approvals=[PendingApproval(**row) for row in rows], count=len(rows))

    @app.post("/v1/invocations/{invocation_id}/cancel", response_model=CancelAccepted,
              status_code=202, tags=["invocations"],
              responses={200: {"model": CancelAccepted}, **documented(401, 403, 404, 422, 503)})
    async def cancel(invocation_id: str, body: CancelRequest | None = None,
                     authorization: Annotated[str | None, Header()] = None) -> JSONResponse:
        """Ask for an invocation to stop (`tool.invoke.cancel.requested`): 202 when asked;
        it then ends as cancelled (E3703) unless it ends first. A no-op answered 200
        (`already_ended`, nothing written) when it has already ended; 404 (E3702) for an
        unknown invocation. With authorization on, the bearer token's subject must be
        the invocation's."""
        row = await _known_invocation(ctx, invocation_id)
        subject = _canceller(ctx, _bearer(authorization), row)
        try:
            outcome = await cancel_invocation(ctx.client, invocation_id, row,
                                              body.reason if body else None,
                                              requested_by=subject or REQUESTED_BY)
        except InvocationNotDelivered as error:
            raise ApiError(error.code, error.message, error.details) from None
        answer = CancelAccepted(**outcome.to_dict(), status_url=_status_url(invocation_id))
        if outcome.status == "already_ended":
            return JSONResponse(answer.model_dump(), status_code=200)
        return JSONResponse(answer.model_dump(), status_code=202,
                            headers={"Location": answer.status_url})


async def _invocation_row(ctx: GatewayContext, invocation_id: str) -> dict[str, Any] | None:
    async with ctx.engine.connect() as conn:
        return await invocation_status(conn, invocation_id)


async def _known_invocation(ctx: GatewayContext, invocation_id: str) -> dict[str, Any]:
    """The invocation's read-model row as of every event in the log now; 404 E3702."""
    row = await _invocation_row(ctx, invocation_id)
    if row is None or row["status"] not in TERMINAL_STATUSES:
        # Read-your-writes: a sync call's terminal event, an async 202's request.
        await ctx.catch_up("invocations", CATCH_UP_SECONDS)
        row = await _invocation_row(ctx, invocation_id)
    if row is None:
        raise ApiError("E3702", f"invocation {invocation_id!r} not found",
                       {"invocation_id": invocation_id})
    return row


async def _tool_wait_bound(ctx: GatewayContext, tool_id: str) -> float:
    if ctx.manifest_of is not None:
        return wait_bound(ctx.manifest_of(tool_id), ctx.settings.registry_wait_seconds)
    async with ctx.engine.connect() as conn:
        tool = await show_tool(conn, tool_id)
    manifest = None
    if tool is not None:
        wanted = tool["current_version"] or tool["latest_version"]
        manifest = next((v["manifest"] for v in tool["versions"] if v["version"] == wanted), None)
    return wait_bound(manifest, ctx.settings.registry_wait_seconds)


def _terminal_answer(terminal: Envelope, started: float) -> InvokeResult:
    data: Any = terminal.data
    if terminal.type == "tool.invoke.failed":
        raise ApiError.from_info(data.error, invocation_id=data.invocation_id, stage=data.stage)
    return InvokeResult(invocation_id=data.invocation_id, tool_id=data.tool_id,
                        version=data.version, result=data.result, duration_ms=data.duration_ms,
                        attempts=data.attempts,
                        execution_time_ms=round((time.monotonic() - started) * 1000, 3))


def _registry_routes(app: FastAPI, ctx: GatewayContext) -> None:
    @app.post("/v1/tools/register", response_model=RegisterResult, status_code=201,
              tags=["registry"], responses={200: {"model": RegisterResult},
                                            **documented(401, 403, 409, 413, 422, 503)})
    async def register(body: RegisterRequest,
                       authorization: Annotated[str | None, Header()] = None) -> Any:
        """Validate (layers 1-2) and publish a tool, as `toolexec publish` does: the
        event is `tool.published` (201; the version is pinned to its executor version
        active now), or `tool.publish.rejected` answered 422 (E3105) or 409 (E3103: this
        version is published with other contents). The same contents again answer 200
        and change nothing. With authorization on, the token needs the publish scope on
        the tool (admin for runtimes, primitives and MCP servers)."""
        capability = caller(ctx.settings, _bearer(authorization))
        source = ToolSource(normalise_manifest(body.manifest), _files(body),
                            origin=f"{REQUESTED_BY}/register", layout="directory")
        publication = await _planned(ctx, source, capability)
        caller_needs = () if publication.event is None else (publication.need,)
        try:
            rights.demand(capability, caller_needs)
            if body.publisher_signature is not None:
                publication = signed(publication, PublisherSignature(
                    body.publisher_signature.key_id, body.publisher_signature.signature))
        except ToolexecError as error:
            raise ApiError(error.code, error.message, error.details) from None
        if publication.event is None:  # already published with these contents
            return JSONResponse(_register_result(publication, await _event_id_of(
                ctx, publication)).model_dump(), status_code=200)
        await ctx.client.send(publication.event)
        data: Any = publication.event.data
        if publication.status == "rejected":
            raise ApiError.from_info(data.error, event_id=publication.event.id)
        await ctx.catch_up("registry", 5.0)  # GET /v1/tools/{id} sees it next
        return _register_result(publication, publication.event.id)

    @app.post("/v1/tools/{tool_id}/lifecycle", response_model=LifecycleResult,
              tags=["registry"], responses=documented(400, 401, 404, 422, 503))
    async def lifecycle(tool_id: str, body: LifecycleRequest,
                        authorization: Annotated[str | None, Header()] = None) -> LifecycleResult:
        """Deprecate, remove or restore a tool version (or every version) as
        `toolexec deprecate|remove|restore` do: the event is `tool.lifecycle.changed`.
        With authorization on, the token needs the lifecycle scope on the tool (admin
        for runtimes, primitives and MCP servers)."""
        capability = caller(ctx.settings, _bearer(authorization))
        change = LifecycleChange(tool_id, body.version, body.state, reason=body.reason,
                                 replacement_tool_id=body.replacement)
        now = datetime.now(UTC)
        events = [lifecycle_event(checked, now=now)
                  for checked in await _checked_change(ctx, change, capability)]
        for event in events:
            await ctx.client.send(event)
        await ctx.catch_up("registry", 5.0)  # GET /v1/tools/{id} sees it next
        return LifecycleResult(tool_id=tool_id, version=body.version, state=body.state,
                               reason=body.reason, replacement=body.replacement,
                               event_ids=[e.id for e in events])


def _definition_routes(app: FastAPI, ctx: GatewayContext) -> None:
    """Pinned MCP tool definitions: list them, approve a drifted one."""

    @app.get("/v1/definitions", response_model=DefinitionList, tags=["registry"])
    async def definitions(server: Annotated[str | None, Query(max_length=200)] = None
                          ) -> DefinitionList:
        """Pinned MCP tool definitions (all, or one server's), as `toolexec definitions
        list` shows them, as of every event in the log when asked."""
        await ctx.catch_up("definitions", CATCH_UP_SECONDS)
        return DefinitionList(definitions=await list_pins(ctx.engine, server))

    @app.post("/v1/definitions/{target}/approve", response_model=DefinitionApproved,
              tags=["registry"], responses=documented(400, 401, 403, 404, 422))
    async def approve_definition(target: str, body: DefinitionApproval,
                                 authorization: Annotated[str | None, Header()] = None
                                 ) -> DefinitionApproved:
        """Approve a drifted MCP tool definition of `target` (the server's tool id, or
        an mcp_tool's), as `toolexec definitions approve` does: the event is
        `tool.definition.approved`. With authorization on, the token needs the approve
        scope on the server's tool id (or admin)."""
        capability = caller(ctx.settings, _bearer(authorization))
        answer = await approve_with(
            ctx.engine, ctx.client.send, lambda: ctx.catch_up("definitions", CATCH_UP_SECONDS),
            target, body.definition_hash, capability, body.reason)
        return DefinitionApproved(**answer)


def _canceller(ctx: GatewayContext, token: str | None, row: Mapping[str, Any]) -> str | None:
    """Who cancels: with authorization on, a verified token of the invocation's subject."""
    capability = caller(ctx.settings, token)
    if capability is None:
        return None
    if row["subject"] not in (None, capability.subject):
        raise ApiError("E3206", "only the invocation's subject may cancel it",
                       {"invocation_id": row["invocation_id"]})
    return capability.subject


async def _checked_change(ctx: GatewayContext, change: LifecycleChange,
                          capability: Capability | None) -> tuple[LifecycleChange, ...]:
    """The change checked against the registry read model (read-your-writes) and the
    caller's lifecycle rights."""
    try:
        return await checked_reading_your_writes(
            ctx.engine, change, lambda: ctx.catch_up("registry", CATCH_UP_SECONDS),
            capability)
    except ToolexecError as error:
        raise ApiError(error.code, error.message, error.details) from None


async def _planned(ctx: GatewayContext, source: ToolSource,
                   capability: Capability | None) -> Publication:
    """What publishing `source` does, planned against the registry read model once it
    holds every registry record in the log now (pins, conflicts, rights needed)."""
    await ctx.catch_up("registry", CATCH_UP_SECONDS)
    async with ctx.engine.connect() as conn:
        known = {t["tool_id"]: t["tool_type"]
                 for t in await search_tools(conn, "", limit=100_000)}
        registry = await registry_snapshot(conn, planned_tool_ids([source]))
    publications = await asyncio.to_thread(
        plan_publications, [source], registry, now=datetime.now(UTC),
        published_by=capability.subject if capability else None,
        bash_syntax=bash_syntax_check, known_tools=known,
        limits=ctx.settings.publication_limits, max_record_bytes=ctx.settings.max_message_bytes)
    return publications[0]


async def _event_id_of(ctx: GatewayContext, publication: Publication) -> str:
    """The id of the event that first published `publication`'s version."""
    async with ctx.engine.connect() as conn:
        tool = await show_tool(conn, publication.tool_id or "")
    versions = (tool or {}).get("versions", [])
    return next((v["event_id"] for v in versions if v["version"] == publication.version), "")


def _register_result(publication: Publication, event_id: str) -> RegisterResult:
    pin = publication.executor_pin
    return RegisterResult(tool_id=publication.tool_id or "", version=publication.version or "",
                          integrity=publication.integrity or "", event_id=event_id,
                          status="unchanged" if publication.event is None else "published",
                          executor_pin=None if pin is None else str(pin))


def _files(body: RegisterRequest) -> tuple[ToolFile, ...]:
    files = []
    for item in body.files:
        path = item.path
        if not canonical_relative(path):
            raise ApiError("E3105", f"file path {path!r} is not a relative POSIX path",
                           {"path": path})
        if (item.content is None) == (item.content_base64 is None):
            raise ApiError("E3105", f"{path}: give exactly one of content, content_base64",
                           {"path": path})
        try:
            content = (item.content.encode("utf-8") if item.content is not None
                       else base64.b64decode(item.content_base64 or "", validate=True))
        except (binascii.Error, ValueError) as error:  # UnicodeEncodeError is a ValueError
            raise ApiError("E3105", f"{path}: content is not valid: {error}",
                           {"path": path}) from None
        files.append(ToolFile(path=path, sha256=hashlib.sha256(content).hexdigest(),
                              is_executable=item.is_executable, content=content))
    if len({f.path for f in files}) != len(files):
        raise ApiError("E3105", "file paths repeat")
    return tuple(sorted(files, key=lambda f: f.path))


def _read_routes(app: FastAPI, ctx: GatewayContext) -> None:
    @app.get("/v1/tools", response_model=ToolList, tags=["registry"],
             responses=documented(422, 503))
    async def tools(q: Annotated[str, Query(max_length=200)] = "",
                    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                    offset: Annotated[int, Query(ge=0, le=MAX_SEARCH_OFFSET)] = 0,
                    tool_type: Annotated[str | None, Query(max_length=40)] = None,
                    tag: Annotated[str | None, Query(max_length=200)] = None,
                    lifecycle: Annotated[str | None, Query(max_length=20)] = None) -> ToolList:
        """Published tools best matching `q` (name, tags, description, parameters; typos
        and partial words too), each with `score` and `matched` fields; all by id
        without `q`. As of every event in the log when asked."""
        await ctx.catch_up("registry", CATCH_UP_SECONDS)
        page = await search_page(ctx.engine, ctx.settings, q, limit=limit,
                                 offset=offset, tool_type=tool_type, tag=tag,
                                 lifecycle=lifecycle)
        return ToolList(tools=page.rows, mode=page.mode, total=page.total,
                        warning=page.warning)

    @app.get("/v1/tools/{tool_id}", response_model=ToolDetail, tags=["registry"],
             responses=documented(404, 503))
    async def tool(tool_id: str) -> ToolDetail:
        """One tool with every version (manifest, file hashes, integrity, lifecycle,
        publisher signature and the trust store's verdict on it), as of every event in
        the log when asked."""
        await ctx.catch_up("registry", CATCH_UP_SECONDS)
        async with ctx.engine.connect() as conn:
            found = await show_tool(conn, tool_id)
        if found is None:
            raise ApiError("E3101", f"tool {tool_id!r} not found", {"tool_id": tool_id})
        try:
            versions = with_publishers(found["versions"], ctx.settings)
        except ToolexecError as error:  # an unreadable trust store entry
            raise ApiError(error.code, error.message, error.details) from None
        return ToolDetail(tool={**found, "versions": versions})

    @app.get("/v1/audit", response_model=AuditPage, tags=["audit"],
             responses=documented(401, 403, 422, 503))
    async def audit(request: Request,
                    since: datetime | None = None, until: datetime | None = None,
                    type: Annotated[str | None, Query(max_length=100)] = None,  # noqa: A002
                    invocation: Annotated[str | None, Query(max_length=200)] = None,
                    tool: Annotated[str | None, Query(max_length=200)] = None,
                    limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> AuditPage:
        """Audit records (redacted CloudEvents, hash-chained) in time order, filtered
        like `toolexec audit replay`; times are ISO 8601 with an offset. The answer
        holds every event in the log when asked (a sync call's events included). With
        authorization on, a token is needed: with the audit scope it reads every record,
        without it only the records of its own invocations."""
        capability = caller(ctx.settings, read_token(request))
        query = AuditQuery(since=utc(since, "since"), until=utc(until, "until"),
                           type=type, invocation_id=invocation, tool_id=tool,
                           subject=subject_filter(capability))
        await ctx.catch_up("audit", CATCH_UP_SECONDS)  # every event in the log when asked
        records = await audit_page(ctx.engine, query, limit)
        return AuditPage(records=records, count=len(records), limit=limit)

    @app.get("/v1/circuits", response_model=CircuitList, tags=["circuits"],
             responses=documented(503))
    async def circuits(open_only: bool = False) -> CircuitList:
        """Circuit-breaker state of every external service, as of every event in the log
        when asked."""
        await ctx.catch_up("circuits", CATCH_UP_SECONDS)
        async with ctx.engine.connect() as conn:
            return CircuitList(circuits=await list_circuits(conn, open_only=open_only))


def _operations_routes(app: FastAPI, ctx: GatewayContext) -> None:
    @app.get("/health", response_model=Health, tags=["operations"],
             responses={503: {"model": Health}})
    async def health() -> JSONResponse:
        """Broker, projection store and consumers; 503 when any of them is not ok."""
        checks = {"broker": await _check(ctx.probe.ping()),
                  "database": await _check(_select_one(ctx.engine)),
                  "consumers": _consumers_check(ctx.consumers())}
        ok = all(check["ok"] for check in checks.values())
        body = Health(status="ok" if ok else "degraded", checks=checks)
        return JSONResponse(body.model_dump(), status_code=200 if ok else 503)

    @app.get("/metrics", tags=["operations"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    async def prometheus() -> Response:
        """Prometheus text format: invocations by tool and outcome, step latencies,
        consumer lag, breaker states (and every other metric of this process)."""
        async with ctx.engine.connect() as conn:
            rows = await list_circuits(conn)
        with contextlib.suppress(KafkaError, SQLAlchemyError, TimeoutError):
            await asyncio.wait_for(metrics.refresh_gauges(rows, ctx.probe.lag), HEALTH_TIMEOUT)
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @app.get("/asyncapi.json", tags=["operations"])
    async def asyncapi() -> dict[str, Any]:
        """AsyncAPI 3.0 document of the event contracts (generated by FastStream)."""
        return ctx.asyncapi()

    session_routes(app, ctx.settings)

    _status_routes(app, ctx)


def _status_routes(app: FastAPI, ctx: GatewayContext) -> None:
    """The status page, its JSON and script, and the invocation pages: read like
    `GET /v1/invocations` and `GET /v1/audit` (same token, same subject filter)."""

    def viewer(capability: Capability | None) -> status_page.Viewer | None:
        return None if capability is None else status_page.Viewer(
            capability.subject, sees_everything=subject_filter(capability) is None)

    def html(body: str, status_code: int = 200) -> HTMLResponse:
        return HTMLResponse(body, status_code=status_code, headers={
            "Content-Security-Policy": status_page.CONTENT_SECURITY_POLICY})

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page(request: Request, audit_tool: str = "", audit_type: str = "",
                   audit_invocation: str = "", audit_limit: int = 50) -> HTMLResponse:
        try:
            capability = caller(ctx.settings, read_token(request))
        except ApiError as error:
            return sign_in_page(f"{error.code}: {error.message}",
                                status=401 if error.status == 401 else error.status)
        subject = subject_filter(capability)
        filters = status_page.AuditFilters(tool=audit_tool.strip(), type=audit_type.strip(),
                                           invocation=audit_invocation.strip(),
                                           limit=max(1, min(audit_limit, 500)))
        await _catch_up_all(ctx, (*SNAPSHOT_MODELS, "registry",
                                  *(("audit",) if filters.active else ())))
        snapshot = await status_snapshot(ctx.engine, subject=subject)
        async with ctx.engine.connect() as conn:
            tools = await search_tools(conn, "", limit=500)
        audit_rows = None
        if filters.active:
            audit_rows = await audit_page(ctx.engine, AuditQuery(
                type=filters.type or None, invocation_id=filters.invocation or None,
                tool_id=filters.tool or None, subject=subject), filters.limit)
        return html(status_page.render(snapshot=snapshot, tools=tools, filters=filters,
                                       audit_rows=audit_rows, viewer=viewer(capability)))

    @app.get("/status.json", include_in_schema=False)
    async def status_json(request: Request) -> JSONResponse:
        """What the status page refreshes: recent and pending invocations, breakers,
        the last hour's traffic per tool."""
        capability = caller(ctx.settings, read_token(request))
        await _catch_up_all(ctx, SNAPSHOT_MODELS)
        snapshot = await status_snapshot(ctx.engine, subject=subject_filter(capability))
        return JSONResponse(snapshot, headers={"Cache-Control": "no-store"})

    @app.get(status_page.SCRIPT_PATH, include_in_schema=False)
    async def status_script() -> Response:
        return Response(STATUS_SCRIPT, media_type="text/javascript; charset=utf-8")

    @app.get("/invocations/{invocation_id}", response_class=HTMLResponse,
             include_in_schema=False)
    async def invocation_page(invocation_id: str, request: Request) -> HTMLResponse:
        try:
            capability = caller(ctx.settings, read_token(request))
        except ApiError as error:
            return sign_in_page(f"{error.code}: {error.message}",
                                status=401 if error.status == 401 else error.status)
        try:
            row = await _known_invocation(ctx, invocation_id)
            check_visible(capability, row)
        except ApiError as error:
            return html(status_page.problem_page(
                "invocation not shown", f"{error.code}: {error.message}"), error.status)
        await ctx.catch_up("audit", CATCH_UP_SECONDS)
        records = await audit_page(ctx.engine, AuditQuery(
            invocation_id=invocation_id, subject=subject_filter(capability)), TIMELINE_LIMIT)
        return html(status_page.invocation_page(invocation_view(row), records,
                                                viewer(capability)))


async def _catch_up_all(ctx: GatewayContext, names: Iterable[str]) -> None:
    """Read-your-writes for a page over several read models: each folds, bounded and
    at once, the log up to its end when asked (a `run` just ended is on the page)."""
    await asyncio.gather(*(ctx.catch_up(name, CATCH_UP_SECONDS) for name in names))


async def _check(probe: Awaitable[Any]) -> dict[str, Any]:
    started = time.monotonic()
    try:
        await asyncio.wait_for(probe, HEALTH_TIMEOUT)
    except Exception as error:  # noqa: BLE001 - boundary: any failure is "not ok"
        return {"ok": False, "error": f"{type(error).__name__}: {error}"[:300]}
    return {"ok": True, "latency_ms": round((time.monotonic() - started) * 1000, 2)}


async def _select_one(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


def _consumers_check(states: Mapping[str, str]) -> dict[str, Any]:
    return {"ok": bool(states) and all(state == "running" for state in states.values()),
            "consumers": dict(states)}
