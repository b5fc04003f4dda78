"""CLI commands for capability tokens and policies: `token issue`, `policy apply`."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from consumers.policy_engine import cedar_text_from_json, compile_policies
from contracts.envelope import Envelope, new_envelope
from contracts.events import PolicyUpdated
from domain.errors import AuthorizationError
from domain.scopes import POLICY_NEED, Scopes, is_namespace
from toolexec import rights
from toolexec.cli_output import bad_usage, fail, fail_with
from toolexec.keys import ensure_dev_keys, issue_token, load_private_key
from toolexec.runtime_file import read_runtime
from toolexec.settings import Settings, kafka_client_options

err = Console(stderr=True)
out = Console()
SOURCE = "urn:toolexec:cli"

token_app = typer.Typer(no_args_is_help=True, help="Capability tokens (RS256 JWT).")
policy_app = typer.Typer(no_args_is_help=True, help="ABAC policies (Cedar).")


def register(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token")
    app.add_typer(policy_app, name="policy")


def _tool_grant(text: str) -> tuple[str, str]:
    tool_id, _, version_range = text.partition("@")
    if not tool_id:
        raise typer.BadParameter(f"--tool expects ID[@RANGE], got {text!r}")
    return tool_id, version_range or "*"


def _namespaces(option: str, patterns: list[str]) -> tuple[str, ...]:
    for pattern in patterns:
        if not is_namespace(pattern):
            raise typer.BadParameter(f"{option} expects a tool id, a prefix ending in '*' "
                                     f"(e.g. acme_*) or '*', got {pattern!r}")
    return tuple(patterns)


Namespaces = list[str]


@token_app.command("issue")
def issue(
    sub: Annotated[str, typer.Option("--sub", help="agent DID (the token subject)")],
    tool: Annotated[Namespaces, typer.Option(
        "--tool", help="invoke: ID[@RANGE], repeatable")] = [],  # noqa: B006
    publish: Annotated[Namespaces, typer.Option(
        "--publish", help="publish tools: ID, PREFIX* or *, repeatable")] = [],  # noqa: B006
    lifecycle: Annotated[Namespaces, typer.Option(
        "--lifecycle", help="deprecate/remove/restore tools: ID, PREFIX* or *, "
        "repeatable")] = [],  # noqa: B006
    approve: Annotated[Namespaces, typer.Option(
        "--approve", help="decide approvals of invocations: ID, PREFIX* or *, "
        "repeatable")] = [],  # noqa: B006
    policy: Annotated[bool, typer.Option("--policy", help="apply policy sets")] = False,
    audit: Annotated[bool, typer.Option(
        "--audit", help="read the audit trail and every caller's invocations")] = False,
    admin: Annotated[bool, typer.Option(
        "--admin", help="every scope on every tool; the only right to publish or retire "
        "runtimes, primitives and MCP servers")] = False,
    ttl: Annotated[int, typer.Option("--ttl", min=1, help="lifetime in seconds")] = 900,
    key: Annotated[Path | None, typer.Option("--key", help="RSA private key (PEM); "
                                                "default: the embedded dev key")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Sign a capability token (RS256) granting the tools it may invoke (--tool) and
    its scopes (--publish, --lifecycle, --approve, --policy, --audit, --admin)."""
    grants = [_tool_grant(t) for t in tool]
    scopes = Scopes(publish=_namespaces("--publish", publish),
                    lifecycle=_namespaces("--lifecycle", lifecycle),
                    approve=_namespaces("--approve", approve),
                    policy=policy, audit=audit, admin=admin)
    if not grants and scopes.empty:
        raise typer.BadParameter("grant something: --tool, --publish, --lifecycle, "
                                 "--approve, --policy, --audit or --admin")
    settings = Settings()
    if ttl > settings.token_max_ttl_seconds:
        raise typer.BadParameter(f"--ttl {ttl} exceeds the {settings.token_max_ttl_seconds} s "
                                 "maximum lifetime accepted (TOOLEXEC_TOKEN_MAX_TTL_SECONDS)")
    key_path = key or ensure_dev_keys(Path(settings.state_dir)).private
    if not key_path.exists():
        bad_usage(f"{key_path} does not exist", as_json)
    now = int(time.time())
    jti = str(uuid.uuid4())
    token = issue_token(load_private_key(key_path), subject=sub, tools=grants,
                        ttl_seconds=ttl, now=now, jti=jti, scopes=scopes)
    if as_json:
        out.print_json(data={"token": token, "sub": sub, "jti": jti, "iat": now,
                             "exp": now + ttl, "tools": [{"tool_id": t, "version_range": r}
                                                         for t, r in grants],
                             "scopes": scopes.to_claim()})
    else:
        out.print(token, markup=False, highlight=False, soft_wrap=True)


def policy_event(text: str, *, policy_set_id: str, version: str | None = None) -> Envelope:
    """A `policy.updated` for Cedar policy text; the version defaults to a content hash."""
    version = version or "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
    data = PolicyUpdated(policy_set_id=policy_set_id, version=version, policies=text)
    return new_envelope(data, source=SOURCE, partitionkey=policy_set_id,
                        correlationid=policy_set_id, id=str(uuid.uuid4()),
                        time=datetime.now(UTC))


def read_policy_file(path: Path) -> str:
    """Cedar text of a `.cedar` file, or of a JSON list of Cedar JSON policies."""
    raw = path.read_text()
    if path.suffix == ".json":
        loaded = json.loads(raw)
        return cedar_text_from_json(loaded if isinstance(loaded, list) else [loaded])
    return raw


@policy_app.command("apply")
def apply(
    file: Annotated[Path, typer.Argument(help="Cedar policy file (.cedar, or .json)")],
    set_id: Annotated[str | None, typer.Option("--set", help="policy set id "
                                                "(default: the file name)")] = None,
    version: Annotated[str | None, typer.Option("--version", help="default: content hash")] = None,
    token: Annotated[str | None, typer.Option(
        "--token", help="capability token (JWT) with the policy scope; default "
        "TOOLEXEC_TOKEN (needed when authorization is on)")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Validate a policy file and emit policy.updated to the running system. With
    authorization on, the token needs the policy scope (or admin)."""
    if not file.exists():
        bad_usage(f"{file} does not exist", as_json)
    try:
        text = read_policy_file(file)
        compile_policies(text)
    except AuthorizationError as error:
        fail(error.code, f"{file}: {error.message}", as_json, error.details)
    except (ValueError, OSError) as error:
        fail("E3004", f"{file}: {error}", as_json, exit_code=2)
    settings = Settings()
    runtime = read_runtime(settings) or {}
    bootstrap = settings.kafka_bootstrap or runtime.get("kafka_bootstrap")
    if not bootstrap:
        fail("E3001", "no running toolexec found: start `toolexec up` first "
             "or set TOOLEXEC_KAFKA_BOOTSTRAP", as_json)
    try:
        rights.demand(rights.caller(settings, token or settings.token, runtime), [POLICY_NEED])
    except AuthorizationError as error:
        fail_with(error, as_json)
    event = policy_event(text, policy_set_id=set_id or file.stem, version=version)
    asyncio.run(_send(bootstrap, event, kafka_client_options(settings)))
    data = event.data
    if as_json:
        out.print_json(data={"type": event.type, "policy_set_id": data.policy_set_id,
                             "version": data.version, "event_id": event.id})
    else:
        err.print(f"applied policy set {data.policy_set_id} version {data.version}")


async def _send(bootstrap: str, event: Envelope, client_options: dict[str, Any]) -> None:
    from toolexec.client import InvocationClient  # Kafka only for this command

    async with InvocationClient(bootstrap, client_options=client_options) as client:
        await client.send(event)
