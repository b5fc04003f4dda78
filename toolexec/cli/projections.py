"""CLI over the SQL read models: projections rebuild, audit replay|verify|export|
verify-export|public-key, search, show.

Every command takes --json and exits 0 on success, 1 on a failure carrying an E3xxx
code (or a broken audit chain), 2 on bad usage. The database is the one `toolexec up`
uses (`TOOLEXEC_DATABASE_URL`, else SQLite under the state directory).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from domain.errors import ToolexecError
from toolexec.cli.output import echo_json, fail, fail_with

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from projections.rebuild import RebuildReport
    from toolexec.settings import Settings

# The settings, SQLAlchemy, Alembic and the projections are imported by the commands
# that use them, so that `toolexec --help` and the offline commands start quickly.

err = Console(stderr=True)
out = Console()
T = TypeVar("T")

JsonFlag = Annotated[bool, typer.Option("--json", help="machine-readable output")]
projections_app = typer.Typer(help="SQL read models folded from the log.", no_args_is_help=True)
audit_app = typer.Typer(help="The audit trail: replay, verify, and export for a third party.",
                        no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add `projections`, `audit`, `search` and `show` to the toolexec CLI."""
    app.add_typer(projections_app, name="projections")
    app.add_typer(audit_app, name="audit")
    app.command("search")(search)
    app.command("show")(show)


# --- plumbing ------------------------------------------------------------------------------

def with_engine(settings: Settings, work: Callable[[AsyncEngine], Awaitable[T]],
                 as_json: bool = False, *, after: tuple[str, ...] = ()) -> T:
    """Run `work` on the read-model database of `settings` (migrated) and return its
    value; a database that cannot be opened or read fails the command (E3001, exit 1).

    `after` names the read models `work` reads: it runs once they have folded the log
    up to its ends as they were when asked (read-your-writes, bounded by
    `TOOLEXEC_READ_YOUR_WRITES_SECONDS`; past the bound it reads what they hold)."""
    import asyncio

    from sqlalchemy.exc import SQLAlchemyError

    from projections.database import make_engine, migrate
    from toolexec.state_files import ensure_state_dir

    async def run() -> T:
        engine = make_engine(settings.effective_database_url)
        try:
            await migrate(engine)
            if after:
                from toolexec.usecases.read_your_writes import read_after_writes

                await read_after_writes(settings, engine, *after)
            return await work(engine)
        finally:
            await engine.dispose()

    if not settings.database_url:
        ensure_state_dir(settings.state_dir)
    try:
        return asyncio.run(run())
    except (SQLAlchemyError, OSError) as error:  # boundary: the store is down or unreadable
        fail("E3001", f"projection store unavailable: {error}"[:500], as_json)


def _bootstrap(settings: Settings, as_json: bool) -> str:
    from toolexec.runtime_file import read_runtime

    if settings.kafka_bootstrap:
        return settings.kafka_bootstrap
    running = read_runtime(settings)
    if running is None:
        from toolexec.broker_control import running_broker

        broker = running_broker(settings)  # the embedded log, served without `up`
        if broker is not None and broker.bootstrap:
            return broker.bootstrap
        fail("E3801", "no broker: start `toolexec up` or `toolexec broker start`, or set "
             "TOOLEXEC_KAFKA_BOOTSTRAP", as_json)
    return str(running["kafka_bootstrap"])


# --- projections rebuild -----------------------------------------------------------------

@projections_app.command("rebuild")
def rebuild_command(
    name: Annotated[str | None, typer.Argument(help="read model; all when omitted")] = None,
    workers: Annotated[int | None, typer.Option(
        "--workers", min=1, max=64,
        help="worker processes (default: one per core); partitions are shared among them")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Drop a read model and replay it from offset 0, showing progress and events/s."""
    from projections.catalog import read_models
    from projections.rebuild import default_workers, rebuild_together
    from projections.rebuild_workers import WorkerFailed, start_fork_server
    from projections.runner import OffsetConflict
    from toolexec.read_models import SIGNED_TOPICS, embedded_archive, fact_verifier
    from toolexec.settings import Settings, consumer_kwargs, kafka_client_options

    processes = workers or default_workers()
    if processes > 1:
        start_fork_server()  # its start overlaps with connecting and migrating
    models = read_models()
    if name is not None and name not in models:
        fail("usage", f"unknown read model {name!r}; one of {', '.join(models)}", as_json,
              exit_code=2)
    chosen = [models[name]] if name else list(models.values())
    settings = Settings()
    bootstrap = _bootstrap(settings, as_json)

    async def work(engine: AsyncEngine) -> list[RebuildReport]:
        with _progress(" + ".join(m.name for m in chosen), "events", as_json) as update:
            # One pass over the log for every chosen model: each record fetched and
            # decoded once, partitions shared among the worker processes.
            try:
                return await rebuild_together(engine, chosen, bootstrap,
                                              consumer_options=consumer_kwargs(settings),
                                              client_options=kafka_client_options(settings),
                                              progress=update, workers=processes,
                                              archive=embedded_archive(settings),
                                              verifier=fact_verifier(settings),
                                              signed_topics=SIGNED_TOPICS)
            except (OffsetConflict, WorkerFailed) as error:
                if isinstance(error, OffsetConflict) or error.kind == "OffsetConflict":
                    fail("E3001", "another runner is writing these read models (a running "
                         "`toolexec up`?): stop it, then rebuild", as_json,
                         {"reason": str(error)[:500]})
                fail("E3000", f"rebuild failed: {error}"[:1000], as_json)

    reports = with_engine(settings, work, as_json)
    if any(m.name == "registry" for m in chosen):
        _embed_rebuilt_registry(settings, as_json)
    rows = [{"name": r.name, "records": r.records, "applied": r.applied,
             "duplicates": r.duplicates, "undecodable": r.undecodable,
             "seconds": round(r.seconds, 3), "events_per_second": round(r.events_per_second, 1),
             "workers": r.workers} for r in reports]
    if as_json:
        echo_json({"rebuilt": rows})
        return
    for row in rows:
        out.print(f"{row['name']}: {row['records']} records in {row['seconds']} s "
                  f"({row['events_per_second']:.0f} events/s, {row['workers']} worker(s)), "
                  f"{row['undecodable']} undecodable")


def _embed_rebuilt_registry(settings: Settings, as_json: bool) -> None:
    """Embed the rebuilt registry's texts that have no stored vector (semantic search on
    PostgreSQL; stored vectors are reused by content hash). A failing endpoint is said,
    not fatal: `toolexec up` tries again."""
    from projections.search_vectors import embed_missing
    from toolexec.embeddings import embedder_from_settings

    embedder = embedder_from_settings(settings)
    if embedder is None:
        return

    async def work(engine: AsyncEngine) -> int:
        with _progress("embeddings", "texts", as_json) as update:
            return await embed_missing(engine, embedder, progress=update)

    try:
        embedded = with_engine(settings, work, as_json)
    except ToolexecError as error:
        err.print(f"[yellow]warning:[/] {escape(str(error))}")
        return
    if embedded and not as_json:
        out.print(f"embeddings: {embedded} new text(s) embedded, stored ones reused")


@contextlib.contextmanager
def _progress(description: str, unit: str,
              as_json: bool) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr when it is a terminal (never with --json); yields
    the `update(done, total)` to call as work goes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[rate]:>9,.0f} " + unit + "/s"),
                  TimeElapsedColumn(), console=err,
                  disable=as_json or not err.is_terminal) as progress:
        task = progress.add_task(escape(description), total=None, rate=0.0)
        started = time.perf_counter()

        def update(done: int, total: int) -> None:
            elapsed = time.perf_counter() - started
            progress.update(task, completed=done, total=max(total, done),
                            rate=done / elapsed if elapsed > 0 else 0.0)

        yield update


# --- audit -------------------------------------------------------------------------------

def _moment(text: str | None, as_json: bool) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        fail("usage", f"not an ISO 8601 time: {text!r}", as_json, exit_code=2)
    if moment.utcoffset() is None:
        fail("usage", f"time needs an offset (e.g. Z): {text!r}", as_json, exit_code=2)
    return moment


@audit_app.command("replay")
def replay(
    since: Annotated[str | None, typer.Option(help="from this time (ISO 8601, inclusive)")] = None,
    until: Annotated[str | None, typer.Option(help="before this time (ISO 8601)")] = None,
    event_type: Annotated[str | None, typer.Option("--type", help="event type")] = None,
    invocation: Annotated[str | None, typer.Option(help="invocation id")] = None,
    tool: Annotated[str | None, typer.Option(help="tool id")] = None,
    output: Annotated[str, typer.Option("--format", help="jsonl | table")] = "jsonl",
    as_json: JsonFlag = False,
) -> None:
    """Stream matching audit records (redacted CloudEvents) in time order."""
    if output not in ("jsonl", "table"):
        fail("usage", "--format is jsonl or table", as_json, exit_code=2)
    from projections.audit import (
        AuditQuery,
        audit_documents,
        audit_records,
        count_audit_records,
    )
    from toolexec.settings import Settings

    query = AuditQuery(since=_moment(since, as_json), until=_moment(until, as_json),
                       type=event_type, invocation_id=invocation, tool_id=tool)
    table = Table("time", "type", "invocation", "tool", "topic/partition@offset")
    shown = not as_json and err.is_terminal
    settings = Settings()

    async def work(engine: AsyncEngine) -> int:
        count = 0
        async with engine.connect() as conn:
            total = await count_audit_records(conn, query) if shown else 0
            with _progress("audit replay", "records", as_json) as update:
                if output == "jsonl" or as_json:
                    async for documents in audit_documents(conn, query):
                        sys.stdout.write("\n".join(documents) + "\n")
                        count += len(documents)
                        update(count, total)
                    return count
                async for record in audit_records(conn, query):
                    count += 1
                    table.add_row(record["time"], record["type"], record["invocation_id"] or "",
                                  record["tool_id"] or "",
                                  f"{record['topic']}/{record['partition']}@{record['offset']}")
                    if count % 1000 == 0:
                        update(count, total)
                update(count, total)
        return count

    count = with_engine(settings, work, as_json, after=("audit",))
    if output == "table" and not as_json:
        out.print(table)
        err.print(f"{count} record(s)")


@audit_app.command("verify")
def verify(as_json: JsonFlag = False) -> None:
    """Re-walk every hash chain of the audit trail and name the first broken record;
    name every fact whose pipeline signature did not verify, every fact of an
    invocation never requested and every terminal event of an invocation that has
    two. Exit 1 when any is found."""
    from projections.audit import audit_findings, verify_audit
    from toolexec.settings import Settings

    settings = Settings()

    async def work(engine: AsyncEngine) -> Any:
        async with engine.connect() as conn:
            with _progress("audit verify", "records", as_json) as update:
                return await verify_audit(conn, update), await audit_findings(conn)

    started = time.perf_counter()
    result, findings = with_engine(settings, work, as_json, after=("audit",))
    seconds = time.perf_counter() - started
    broken = None if result.broken is None else {
        "topic": result.broken.topic, "partition": result.broken.partition,
        "offset": result.broken.offset, "event_id": result.broken.event_id,
        "reason": result.broken.reason}
    ok = result.ok and findings.clean
    if as_json:
        echo_json({"ok": ok, "records": result.records, "chains": result.chains,
                   "broken": broken, "seconds": round(seconds, 3),
                   "untrusted": [r.as_dict() for r in findings.untrusted],
                   "untrusted_count": findings.untrusted_count,
                   "orphaned": [r.as_dict() for r in findings.orphaned],
                   "orphaned_count": findings.orphaned_count,
                   "double_terminal": [r.as_dict() for r in findings.double_terminal],
                   "double_terminal_invocations": findings.double_terminal_invocations})
        raise typer.Exit(0 if ok else 1)
    if broken is None:
        out.print(f"audit chains verified: {result.records} record(s) in {result.chains} "
                  f"chain(s) ({seconds:.1f} s)")
    else:
        err.print(f"[red]audit broken[/] at {escape(broken['topic'])}/{broken['partition']}"
                  f"@{broken['offset']} (event {escape(str(broken['event_id']))}): "
                  f"{escape(broken['reason'])}")
    for title, records, count in (
            ("facts whose pipeline signature did not verify", findings.untrusted,
             findings.untrusted_count),
            ("facts of an invocation that was never requested", findings.orphaned,
             findings.orphaned_count),
            ("invocations with more than one terminal event; their terminal events",
             findings.double_terminal, findings.double_terminal_invocations)):
        if not count:
            continue
        err.print(f"[red]{count} {title}[/]:")
        for r in records:
            err.print(f"  {escape(r.topic)}/{r.partition}@{r.offset} {escape(r.type)} "
                      f"invocation {escape(str(r.invocation_id))} event "
                      f"{escape(r.event_id)} signature {r.signature or '-'}")
    if findings.clean and broken is None:
        out.print("no forged, orphaned or doubled facts")
    raise typer.Exit(0 if ok else 1)


# --- audit export -----------------------------------------------------------------------

def _pipeline_key(settings: Settings, as_json: bool) -> Any:
    from toolexec import keys

    try:
        return keys.fact_signing_key(settings)
    except (OSError, ValueError) as error:
        fail("E3805", f"no pipeline signing key: {error}"[:1000], as_json)


@audit_app.command("export")
def export(
    signed: Annotated[bool, typer.Option(
        "--signed", help="sign the checkpoint with the pipeline's Ed25519 key")] = False,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="write to FILE (atomically) instead of stdout")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Export the whole trail as JSON Lines: a header, every record in chain order, and
    a checkpoint (each chain's end, a digest of the lines; signed with --signed) that
    `toolexec audit verify-export` checks offline. A broken chain is not exported."""
    from projections.audit_export import ExportBroken, export_audit
    from projections.tables import iso
    from toolexec.settings import Settings

    settings = Settings()
    key = _pipeline_key(settings, as_json) if signed else None
    target = None if output is None else output.with_name(f".{output.name}.{os.getpid()}.tmp")
    sink = sys.stdout.buffer if target is None else target.open("wb")
    exported_at = iso(datetime.now(UTC))

    async def work(engine: AsyncEngine) -> tuple[int, str | None]:
        async with engine.connect() as conn:
            with _progress("audit export", "records", as_json) as update:
                last = b""
                async for block in export_audit(conn, exported_at, signing_key=key,
                                                progress=update):
                    sink.write(block)
                    last = block
        import orjson

        checkpoint = orjson.loads(last)
        return int(checkpoint["checkpoint"]["records"]), checkpoint.get("kid")

    try:
        try:
            records, kid = with_engine(settings, work, as_json, after=("audit",))
        finally:
            sink.flush()
            if target is not None:
                sink.close()
    except ExportBroken as broken:
        if target is not None:
            target.unlink(missing_ok=True)
        fail("E3806", f"audit trail broken at {broken}; nothing exported (run `toolexec "
             "audit verify`)", as_json, {"topic": broken.topic, "partition": broken.partition,
                                         "offset": broken.offset, "reason": broken.reason})
    except BaseException:
        if target is not None:
            target.unlink(missing_ok=True)
        raise
    if target is not None and output is not None:
        target.replace(output)
    summary = {"records": records, "signed": kid is not None, "kid": kid,
               "exported_at": exported_at, "output": None if output is None else str(output)}
    if as_json and output is not None:
        echo_json(summary)
    elif not as_json:
        err.print(f"exported {records} record(s)" + (f", signed by key {kid}" if kid else
                                                     ", unsigned")
                  + (f" to {escape(str(output))}" if output else ""))


@audit_app.command("verify-export")
def verify_export_command(
    file: Annotated[Path, typer.Argument(help="an export of `toolexec audit export`",
                                         exists=True, dir_okay=False, readable=True)],
    public_key: Annotated[list[Path] | None, typer.Option(
        "--public-key", help="the pipeline's Ed25519 public key (PEM); repeat while "
        "rotating; with it, a signature is required", exists=True, dir_okay=False)] = None,
    as_json: JsonFlag = False,
) -> None:
    """Verify an export offline (no database, no broker): re-walk every chain, check the
    checkpoint, the digest and the signature. Exit 1 on the first problem."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from projections.audit_export import verify_export

    keys = []
    for path in public_key or []:
        try:
            loaded = serialization.load_pem_public_key(path.read_bytes())
        except (OSError, ValueError) as error:
            fail("usage", f"{path}: not a PEM public key ({error})", as_json, exit_code=2)
        if not isinstance(loaded, Ed25519PublicKey):
            fail("usage", f"{path} does not hold an Ed25519 public key", as_json, exit_code=2)
        keys.append(loaded)
    with file.open("rb") as handle:
        result = verify_export(handle, keys)
    if as_json:
        echo_json(result.as_dict())
        raise typer.Exit(0 if result.ok else 1)
    if result.problem is not None:
        err.print(f"[red]export does not verify[/] at {escape(str(result.problem))}")
        raise typer.Exit(1)
    signed = (f"signature of key {result.kid} verified" if result.signature_checked else
              "signature not checked (no --public-key)" if result.kid else "unsigned")
    out.print(f"export verified: {result.records} record(s) in {result.chains} chain(s), "
              f"exported {result.exported_at}; {signed}")


@audit_app.command("public-key")
def public_key_command(as_json: JsonFlag = False) -> None:
    """Print the pipeline's Ed25519 public key (PEM): hand it to whoever verifies an
    export (`toolexec audit verify-export FILE --public-key PEM`)."""
    from cryptography.hazmat.primitives import serialization

    from contracts.fact_signature import key_id
    from toolexec.settings import Settings

    public = _pipeline_key(Settings(), as_json).public_key()
    pem = public.public_bytes(serialization.Encoding.PEM,
                              serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    if as_json:
        echo_json({"kid": key_id(public), "pem": pem})
        return
    typer.echo(pem, nl=False)


# --- registry ----------------------------------------------------------------------------

def _lifecycle_cell(version: dict[str, Any]) -> str:
    """`deprecated (why; use X)`: the state with what the lifecycle change said."""
    notes = [version.get("lifecycle_reason") or "",
             f"use {version['replacement_tool_id']}" if version.get("replacement_tool_id") else ""]
    said = "; ".join(note for note in notes if note)
    return f"{version['lifecycle']} ({escape(said)})" if said else str(version["lifecycle"])


def search(
    query: Annotated[str, typer.Argument(help="words to look for (typos and partial words "
                                              "are matched too)")],
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    offset: Annotated[int, typer.Option(min=0, max=1_000_000,
                                        help="skip this many results (paging)")] = 0,
    tool_type: Annotated[str | None, typer.Option("--type", help="only tools of this type")] = None,
    tag: Annotated[str | None, typer.Option(help="only tools with this tag")] = None,
    lifecycle: Annotated[str | None, typer.Option(
        help="only tools in this lifecycle (removed ones are left out otherwise)")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Search published tools, best match first (name, tags, description, parameters)."""
    from toolexec.settings import Settings
    from toolexec.usecases.registry import search_page

    settings = Settings()

    async def work(engine: AsyncEngine) -> Any:
        return await search_page(engine, settings, query, limit=limit, offset=offset,
                                 tool_type=tool_type, tag=tag, lifecycle=lifecycle)

    page = with_engine(settings, work, as_json, after=("registry",))
    if as_json:
        echo_json({"tools": page.rows, "mode": page.mode, "total": page.total,
                   "terms": page.describe_terms(), "warning": page.warning})
        return
    table = Table("tool", "version", "type", "lifecycle", "score", "matched", "description")
    for tool in page.rows:
        table.add_row(tool["tool_id"], tool["current_version"] or tool["latest_version"],
                      tool["tool_type"], tool["lifecycle"],
                      "" if tool["score"] is None else f"{tool['score']:.3f}",
                      ", ".join(tool["matched"]), tool["description"])
    out.print(table)
    out.print(f"{len(page.rows)} of {page.total} ({page.mode})"
              + (f"; {escape(page.warning)}" if page.warning else ""))


def _publisher_cell(publisher: dict[str, Any]) -> str:
    if publisher["key_id"] is None:
        return "-"
    return f"{escape(publisher['key_id'])} ({publisher['verdict'].replace('_', ' ')})"


def show(
    tool_id: Annotated[str, typer.Argument(metavar="TOOL", help="tool id")],
    as_json: JsonFlag = False,
) -> None:
    """Show one tool: current version, tags and every version with its integrity."""
    from projections.queries import show_tool
    from toolexec.settings import Settings

    settings = Settings()

    async def work(engine: AsyncEngine) -> dict[str, Any] | None:
        async with engine.connect() as conn:
            return await show_tool(conn, tool_id)

    tool = with_engine(settings, work, as_json, after=("registry",))
    if tool is None:
        fail("E3101", f"tool {tool_id!r} not found", as_json, {"tool_id": tool_id})
    from toolexec.usecases.registry import with_publishers

    try:
        tool = {**tool, "versions": with_publishers(tool["versions"], settings)}
    except ToolexecError as error:  # an unreadable trust store entry
        fail_with(error, as_json)
    if as_json:
        echo_json({"tool": tool})
        return
    out.print(f"[bold]{tool['tool_id']}[/] ({tool['tool_type']}) current "
              f"{tool['current_version'] or '-'}, {tool['lifecycle']}: {tool['description']}")
    if tool["tags"]:
        out.print("tags: " + ", ".join(tool["tags"]))
    table = Table("version", "lifecycle", "integrity", "published", "signed by")
    for version in tool["versions"]:
        table.add_row(version["version"], _lifecycle_cell(version), version["integrity"],
                      version["published_at"], _publisher_cell(version["publisher"]))
    out.print(table)
