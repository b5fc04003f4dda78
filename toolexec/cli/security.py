"""CLI commands for capability tokens, policies and publisher keys: `token issue`,
`policy apply`, `policy test`, `keys new`."""

from __future__ import annotations

import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from domain.errors import ToolexecError
from domain.scopes import Scopes, is_namespace
from toolexec.cli.output import bad_usage, echo_json, fail_with

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from domain.policy_what_if import WhatIf

err = Console(stderr=True)
out = Console()
SOURCE = "urn:toolexec:cli"

token_app = typer.Typer(no_args_is_help=True, help="Capability tokens (RS256 JWT).")
policy_app = typer.Typer(no_args_is_help=True, help="ABAC policies (Cedar).")
keys_app = typer.Typer(no_args_is_help=True, help="Publisher keys (Ed25519).")


def register(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token")
    app.add_typer(policy_app, name="policy")
    app.add_typer(keys_app, name="keys")


@keys_app.command("new")
def keys_new(
    path: Annotated[Path, typer.Argument(help="private key file to write (PEM, 0600); the "
                                              "public key goes to PATH.pub")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Make a publisher's Ed25519 key pair: sign with `toolexec publish --sign-key PATH`,
    give PATH.pub (or the key id printed) to the operators' trust store."""
    from toolexec.keys import new_publisher_keys

    try:
        made = new_publisher_keys(path)
    except OSError as error:
        bad_usage(str(error), as_json)
    if as_json:
        echo_json({"private_key": str(made.private), "public_key": str(made.public),
                   "key_id": made.key_id})
        return
    err.print(f"wrote {made.private} (private, keep it) and {made.public}", highlight=False)
    out.print(made.key_id, highlight=False)


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
    from toolexec.keys import ensure_dev_keys, issue_token, load_private_key
    from toolexec.settings import Settings

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


@policy_app.command("apply")
def apply(
    file: Annotated[Path, typer.Argument(help="Cedar policy file (.cedar, or .json)")],
    set_id: Annotated[str | None, typer.Option("--set", help="policy set id "
                                                "(default: the file name)")] = None,
    version: Annotated[str | None, typer.Option("--version", help="default: content hash")] = None,
    token: Annotated[str | None, typer.Option(
        "--token", help="capability token (JWT) with the policy scope; default "
        "TOOLEXEC_TOKEN (needed when authorization is on)")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="emit nothing: print what the policy set would change in the "
        "recorded decisions (as `policy test`)")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Validate a policy file and emit policy.updated to the running system. With
    authorization on, the token needs the policy scope (or admin)."""
    import asyncio

    from toolexec import rights
    from toolexec.runtime_file import read_runtime
    from toolexec.settings import Settings, kafka_client_options
    from toolexec.usecases.policy import apply_policy, policy_event, read_policy_file

    if dry_run:
        _what_if(file, set_id, version, None, None, as_json)
        return
    settings = Settings()
    try:
        text = read_policy_file(file)
        runtime = read_runtime(settings) or {}
        bootstrap = settings.kafka_bootstrap or runtime.get("kafka_bootstrap")
        if not bootstrap:
            raise ToolexecError("no running toolexec found: start `toolexec up` first "
                                "or set TOOLEXEC_KAFKA_BOOTSTRAP", code="E3001")
        event = policy_event(text, policy_set_id=set_id or file.stem, version=version)
        capability = rights.caller(settings, token or settings.token, runtime)
        asyncio.run(apply_policy(bootstrap, event, capability, kafka_client_options(settings)))
    except ToolexecError as error:
        fail_with(error, as_json)
    data = event.data
    if as_json:
        out.print_json(data={"type": event.type, "policy_set_id": data.policy_set_id,
                             "version": data.version, "event_id": event.id})
    else:
        err.print(f"applied policy set {data.policy_set_id} version {data.version}")


@policy_app.command("test")
def test(
    file: Annotated[Path, typer.Argument(help="candidate Cedar policy file (.cedar, or .json)")],
    since: Annotated[str | None, typer.Option(
        "--since", help="decisions from this long ago (30m, 12h, 7d, 2w) or this time "
        "(ISO 8601 with offset); default: every recorded decision")] = None,
    tool: Annotated[str | None, typer.Option("--tool", help="only this tool's decisions")] = None,
    set_id: Annotated[str | None, typer.Option(
        "--set", help="the policy set the candidate replaces (default: the file name)")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Replay the recorded permission decisions against the policy sets in force with
    FILE's set replaced, and print, per tool and agent, what would change (allow->deny,
    deny->allow) and which invocations. Nothing is emitted."""
    _what_if(file, set_id, None, since, tool, as_json)


_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _since(text: str | None, as_json: bool) -> datetime | None:
    if text is None:
        return None
    matched = _DURATION.match(text.strip())
    if matched:
        seconds = int(matched.group(1)) * _UNIT_SECONDS[matched.group(2)]
        return datetime.now(UTC) - timedelta(seconds=seconds)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        bad_usage(f"--since expects a duration (30m, 12h, 7d, 2w) or an ISO 8601 time, "
                  f"got {text!r}", as_json)
    if moment.utcoffset() is None:
        bad_usage("--since needs a UTC offset (e.g. Z)", as_json)
    return moment.astimezone(UTC)


def _what_if(file: Path, set_id: str | None, version: str | None, since: str | None,
             tool: str | None, as_json: bool) -> None:
    from toolexec.cli.projections import with_engine
    from toolexec.settings import Settings
    from toolexec.usecases.policy import policy_what_if, read_policy_file, what_if_json

    settings = Settings()
    moment = _since(since, as_json)
    try:
        text = read_policy_file(file)
    except ToolexecError as error:
        fail_with(error, as_json)

    async def work(engine: AsyncEngine) -> WhatIf:
        return await policy_what_if(
            engine, text, policy_set_id=set_id or file.stem, version=version, since=moment,
            tool_id=tool, default=settings.policy_default)

    # read-your-writes: the decisions, policy sets and tools on the log when asked
    result = with_engine(settings, work, as_json, after=("audit", "registry"))
    answer = what_if_json(result)
    if as_json:
        echo_json(answer)
        return
    err.print(f"{answer['replayed']} decision(s) replayed, {answer['skipped']} left out "
              f"(authorization off, token refused, or tool version unknown); "
              f"{answer['changed']} would change", highlight=False, soft_wrap=True)
    if not answer["changes"]:
        return
    table = Table("tool", "agent", "allow->deny", "deny->allow")
    for row in answer["by_tool_and_agent"]:
        table.add_row(escape(row["tool_id"]), escape(row["subject"]),
                      str(row["allow_to_deny"]), str(row["deny_to_allow"]))
    out.print(table)
    for change in answer["changes"]:
        out.print(f"{change['invocation_id']} {escape(change['tool_id'])}@"
                  f"{escape(change['version'])} {escape(change['subject'])}: "
                  f"{change['before']} -> {change['after']} ({escape(change['reason'])})",
                  highlight=False, soft_wrap=True)  # one line per invocation
