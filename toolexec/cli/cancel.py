"""`toolexec cancel`: ask a running system to stop an invocation."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from toolexec.cli.gateway_call import gateway_call, no_running_system
from toolexec.cli.output import bad_usage

err = Console(stderr=True)
out = Console()

REQUESTED_BY = "urn:toolexec:cli"


def register(app: typer.Typer) -> None:
    app.command("cancel")(cancel)


def cancel(
    invocation_id: Annotated[str, typer.Argument(help="id of the invocation to stop")],
    reason: Annotated[str | None, typer.Option("--reason", help="why, kept in the event")] = None,
    token: Annotated[str | None, typer.Option("--token", help="capability token (JWT)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Cancel an invocation of the running `up` (tool.invoke.cancel.requested).

    Through the running gateway when there is one: unknown invocations fail with
    E3702, and for ended ones it is a no-op (exit 0, status `already_ended`), as
    `POST /v1/invocations/{id}/cancel` answers.
    With only TOOLEXEC_KAFKA_BOOTSTRAP set, the event is emitted directly. The
    invocation then ends with E3703 unless it ends first."""
    import asyncio

    from toolexec.runtime_file import read_runtime
    from toolexec.settings import Settings, kafka_client_options

    if not invocation_id.strip():
        bad_usage("the invocation id is empty", as_json)
    settings = Settings()
    runtime = read_runtime(settings) or {}
    if runtime.get("gateway_url"):
        status, body = _through_gateway(runtime["gateway_url"], invocation_id, reason, token)
    elif bootstrap := settings.kafka_bootstrap or runtime.get("kafka_bootstrap"):
        status, body = asyncio.run(_through_broker(bootstrap, invocation_id, reason,
                                                   kafka_client_options(settings)))
    else:
        status, body = no_running_system()
    raise typer.Exit(_report(status, body, as_json))


def _through_gateway(url: str, invocation_id: str, reason: str | None,
                     token: str | None) -> tuple[int, dict[str, Any]]:
    return gateway_call(url, "POST", f"/v1/invocations/{invocation_id}/cancel",
                        token=token, body={"reason": reason})


async def _through_broker(bootstrap: str, invocation_id: str, reason: str | None,
                          client_options: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    from toolexec.client import InvocationClient, InvocationNotDelivered
    from toolexec.usecases.cancel import cancel_invocation

    try:
        async with InvocationClient(bootstrap, client_options=client_options) as client:
            outcome = await cancel_invocation(client, invocation_id, None, reason,
                                              requested_by=REQUESTED_BY)
    except InvocationNotDelivered as error:
        return 503, {"error": error.to_dict()}
    return 202, outcome.to_dict()


def _report(status: int, body: dict[str, Any], as_json: bool) -> int:
    if as_json:
        out.print_json(data=body)
    elif status == 202:
        err.print(f"cancel requested for {escape(body['invocation_id'])}")
    elif status == 200:
        err.print(f"{escape(body['invocation_id'])} had already ended "
                  f"({escape(str(body.get('ended_as')))}): nothing to cancel", highlight=False)
    else:
        error = body.get("error") or {}
        err.print(f"[red]{error.get('code', 'E3000')}[/] {escape(str(error.get('message')))}",
                  highlight=False)
    return 0 if status in (200, 202) else 1
