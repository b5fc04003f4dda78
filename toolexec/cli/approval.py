"""`toolexec approve`, `toolexec deny`, `toolexec approvals`: decide the calls waiting
for an approver, and list them."""

from __future__ import annotations

from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from toolexec.cli.gateway_call import gateway_call, no_running_system
from toolexec.cli.output import USAGE, bad_usage, fail

err = Console(stderr=True)
out = Console()

FRONT_END = "urn:toolexec:cli"

Reason = Annotated[str | None, typer.Option("--reason", help="why, kept in the event")]
Hash = Annotated[str | None, typer.Option(
    "--hash", help="the call hash approved (sha256:<hex>); default: the hash of the call "
    "waiting (required without a running gateway)")]
Token = Annotated[str | None, typer.Option("--token", help="capability token (JWT) with the "
                                           "approve scope for the tool")]
Json = Annotated[bool, typer.Option("--json", help="machine-readable output")]
InvocationId = Annotated[str, typer.Argument(help="id of the invocation waiting for approval")]


def register(app: typer.Typer) -> None:
    app.command("approve")(approve)
    app.command("deny")(deny)
    app.command("approvals")(approvals)


def approve(invocation_id: InvocationId, reason: Reason = None, approved_hash: Hash = None,
            token: Token = None, as_json: Json = False) -> None:
    """Approve the call an invocation waits with (tool.approval.decided): it runs if the
    approved hash is the hash of that very call (else it fails with E3210)."""
    _decide(invocation_id, "approve", reason, approved_hash, token, as_json)


def deny(invocation_id: InvocationId, reason: Reason = None, approved_hash: Hash = None,
         token: Token = None, as_json: Json = False) -> None:
    """Deny the call an invocation waits with: it fails with E3208."""
    _decide(invocation_id, "deny", reason, approved_hash, token, as_json)


def approvals(token: Token = None, as_json: Json = False) -> None:
    """The calls waiting for an approver (oldest first), from the running gateway."""
    from toolexec.runtime_file import read_runtime
    from toolexec.settings import Settings

    settings = Settings()
    url = (read_runtime(settings) or {}).get("gateway_url")
    status, body = (gateway_call(url, "GET", "/v1/approvals", token=token or settings.token)
                    if url else no_running_system())
    if status != 200:
        _fail(body, as_json)
    if as_json:
        out.print_json(data=body)
    else:
        for row in body["approvals"]:
            out.print(f"{escape(row['invocation_id'])}  {escape(str(row['tool_id']))}@"
                      f"{escape(str(row['version']))}  agent={escape(str(row['subject']))}  "
                      f"expires {escape(str(row['expires_at']))}  {escape(str(row['call_hash']))}",
                      highlight=False, soft_wrap=True)
        err.print(f"{body['count']} call(s) waiting for approval")


def _decide(invocation_id: str, verdict: str, reason: str | None, approved_hash: str | None,
            token: str | None, as_json: bool) -> None:
    import asyncio

    from toolexec.runtime_file import read_runtime
    from toolexec.settings import Settings, kafka_client_options

    if not invocation_id.strip():
        bad_usage("the invocation id is empty", as_json)
    settings = Settings()
    runtime = read_runtime(settings) or {}
    token = token or settings.token
    if runtime.get("gateway_url"):
        status, body = gateway_call(
            runtime["gateway_url"], "POST", f"/v1/invocations/{invocation_id}/approval",
            token=token, body={"decision": verdict, "reason": reason,
                               "approved_hash": approved_hash})
    elif bootstrap := settings.kafka_bootstrap or runtime.get("kafka_bootstrap"):
        if approved_hash is None:
            bad_usage("without a running gateway, give the approved call's --hash", as_json)
        status, body = asyncio.run(_through_broker(
            bootstrap, invocation_id, verdict, reason, approved_hash, token,
            kafka_client_options(settings)))
    else:
        status, body = no_running_system()
    if status in (200, 202):
        if as_json:
            out.print_json(data=body)
        else:
            err.print(_said(body), highlight=False)
        raise typer.Exit(0)
    _fail(body, as_json)


async def _through_broker(bootstrap: str, invocation_id: str, verdict: Any, reason: str | None,
                          approved_hash: str, token: str | None, client_options: dict[str, Any]
                          ) -> tuple[int, dict[str, Any]]:
    """The decision written to the log directly (no read model at hand: the hash is
    given). With authorization on the pipeline counts it only if `token` grants the
    approve scope for the tool."""
    from domain.errors import ToolexecError
    from toolexec import keys, rights
    from toolexec.client import InvocationClient
    from toolexec.settings import Settings
    from toolexec.usecases.approval import decide_approval

    try:
        settings = Settings()
        async with InvocationClient(bootstrap, client_options=client_options,
                                    seal_to=keys.token_seal_public_key(settings)) as client:
            capability = rights.caller(settings, token)
            outcome = await decide_approval(client, invocation_id, None, verdict=verdict,
                                            capability=capability, token=token,
                                            front_end=FRONT_END, reason=reason,
                                            approved_hash=approved_hash)
    except ToolexecError as error:
        return 503 if error.code == "E3001" else 400, {"error": error.to_dict()}
    return 202, outcome.to_dict()


def _said(body: dict[str, Any]) -> str:
    invocation = escape(body["invocation_id"])
    if body["status"] == "decided":
        return f"{body['decision']} sent for {invocation} ({escape(str(body['approved_hash']))})"
    return f"{invocation} had already ended ({escape(str(body.get('ended_as')))}): nothing sent"


def _fail(body: dict[str, Any], as_json: bool) -> NoReturn:
    """Report the error answer (exit 2 for a malformed request, E3004; else 1)."""
    error = body.get("error") or {}
    code = str(error.get("code", "E3000"))
    fail(code, str(error.get("message")), as_json, error.get("details") or {},
         exit_code=2 if code == USAGE else 1)
