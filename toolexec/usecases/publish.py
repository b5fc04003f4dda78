"""Publishing tool sources to a running system (`toolexec publish`, `run --tools`, the
tools `up` starts with): find the sources, plan them against the registry as the log
holds it (`toolexec.publishing`), check the caller's publish rights, send what is new.
Rejections are publications too (`tool.publish.rejected`): callers report them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from domain.errors import InvalidRequest
from toolexec import rights
from toolexec.runtime_file import read_runtime, runtime_status
from toolexec.settings import Settings, kafka_client_options
from toolexec.sources import bash_syntax_check, collect_sources

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from domain.model import ToolSource
    from domain.registry import RegistryView
    from domain.scopes import Need
    from toolexec.client import InvocationClient
    from toolexec.publishing import Publication

REGISTRY_CATCH_UP_SECONDS = 10.0  # a restarted `up` reads the registry already in its log


def require_existing(paths: list[Path]) -> None:
    """Every path exists, else InvalidRequest (E3004) naming the first that does not."""
    for path in paths:
        if not path.exists():
            raise InvalidRequest(f"{path} does not exist", details={"path": str(path)})


@dataclass
class Found:
    """The sources a running system publishes (built-ins first), their tool types, and
    the rejections of sources that could not be read."""

    sources: list[ToolSource]
    known: dict[str, str]
    unreadable: list[Publication]

    def only_under(self, paths: list[Path]) -> Found:
        """The part of what was found that comes from `paths`."""
        return Found([s for s in self.sources if _from_paths(s.origin, paths)], self.known,
                     [p for p in self.unreadable if _from_paths(p.source.origin, paths)])


def find_sources(tool_dirs: list[Path], settings: Settings) -> Found:
    """Built-in tools, `tool_dirs` and the configured tool directories, read."""
    from toolexec.publishing import unreadable

    now = datetime.now(UTC)
    refused: list[Publication] = []
    sources = collect_sources(tool_dirs, settings, on_error=lambda error: refused.append(
        unreadable(str(error.details.get("path", "")), error, now)))
    known = {str(s.manifest.get("tool_id")): str(s.manifest.get("tool_type")) for s in sources}
    return Found(sources, known, refused)


def _from_paths(origin: str, paths: list[Path]) -> bool:
    return any(str(origin).startswith(str(p.resolve())) or str(origin).startswith(str(p))
               for p in paths)


def plan(found: Found, registry: RegistryView, settings: Settings,
         published_by: str | None = None) -> list[Publication]:
    """What publishing `found` to `registry` does (pins, no-ops, rejections)."""
    from toolexec.publishing import plan_publications

    return found.unreadable + plan_publications(
        found.sources, registry, now=datetime.now(UTC), published_by=published_by,
        bash_syntax=bash_syntax_check, known_tools=found.known,
        limits=settings.publication_limits, max_record_bytes=settings.max_message_bytes)


def needs(publications: list[Publication]) -> list[Need]:
    """The rights the new events of `publications` need."""
    return [p.need for p in publications if p.event is not None]


async def publish_to_stack(stack: Any, tool_dirs: list[Path], settings: Settings,
                           token: str | None = None,
                           check_rights: bool = False) -> list[Publication]:
    """Plan the tools of `tool_dirs` (and the built-ins) against the stack's registry
    view once it has read the registry topic, then publish what is new."""
    capability = rights.caller(settings, token) if check_rights else None
    found = find_sources(tool_dirs, settings)
    await stack.registry.catch_up(REGISTRY_CATCH_UP_SECONDS)
    publications = plan(found, stack.registry, settings,
                        published_by=capability.subject if capability else None)
    rights.demand(capability, needs(publications))
    await stack.publish_all(p.event for p in publications if p.event is not None)
    return publications


async def publish_to_running(client: InvocationClient, runtime: Mapping[str, Any],
                             found: Found, settings: Settings,
                             token: str | None,
                             sign_key: Ed25519PrivateKey | None = None) -> list[Publication]:
    """Plan `found` against the running system's registry as its log holds it, check
    the caller's publish rights when authorization is on, sign every new version with
    the publisher's `sign_key` when given, then send what is new."""
    from toolexec.publishing import sign_publications
    from toolexec.registry_reads import published_versions

    capability = rights.caller(settings, token, runtime)
    registry = await published_versions(str(runtime["kafka_bootstrap"]),
                                        settings.publication_limits,
                                        client_options=kafka_client_options(settings))
    publications = plan(found, registry, settings,
                        published_by=capability.subject if capability else None)
    rights.demand(capability, needs(publications))
    if sign_key is not None:
        publications = sign_publications(publications, sign_key)
    for publication in publications:
        if publication.event is not None:
            await client.send(publication.event)
    return publications


def running_bootstrap(settings: Settings) -> str | None:
    """TOOLEXEC_KAFKA_BOOTSTRAP, else the running `up`'s broker, else the state
    directory's embedded broker if it runs (a published tool waits in its log for the
    next `up`)."""
    from toolexec.broker_control import running_broker

    if settings.kafka_bootstrap:
        return settings.kafka_bootstrap
    runtime = read_runtime(settings)
    if runtime is not None:
        return str(runtime["kafka_bootstrap"])
    broker = running_broker(settings)
    return broker.bootstrap if broker is not None else None


def no_running_system(settings: Settings) -> str:
    """Why no running system was found, and what to do."""
    status = runtime_status(settings)
    hint = f"{status.describe()}; " if status.state == "stale" else ""
    return (f"no running toolexec found: {hint}start `toolexec up` first or set "
            "TOOLEXEC_KAFKA_BOOTSTRAP")


async def publish_paths(paths: list[Path], settings: Settings,
                        token: str | None, sign_key: Path | None = None) -> list[Publication]:
    """Publish the tools under `paths` to the running system (`toolexec publish`),
    each new version signed with the Ed25519 key in the PEM file `sign_key` when given.
    Raises InvalidRequest for a missing path or an unusable key, ToolexecError E3001
    when no system runs, AuthorizationError when the token may not publish them."""
    from domain.errors import ToolexecError
    from toolexec.client import InvocationClient

    require_existing(paths)
    private_key = None if sign_key is None else publisher_private_key(sign_key)
    bootstrap = running_bootstrap(settings)
    if not bootstrap:
        raise ToolexecError(no_running_system(settings), code="E3001")
    runtime = {**(read_runtime(settings) or {}), "kafka_bootstrap": bootstrap}
    found = find_sources(paths, settings).only_under(paths)
    async with InvocationClient(bootstrap, client_options=kafka_client_options(settings)
                                ) as client:
        return await publish_to_running(client, runtime, found, settings, token,
                                        sign_key=private_key)


def publisher_private_key(path: Path) -> Ed25519PrivateKey:
    """The publisher's Ed25519 key in the PEM file `path`; InvalidRequest (E3004) when
    it cannot be read or is not one."""
    from toolexec.keys import load_publisher_private_key

    try:
        return load_publisher_private_key(path)
    except (OSError, ValueError, TypeError) as error:
        raise InvalidRequest(f"{path} is not a usable Ed25519 private key (PEM): {error}",
                             details={"path": str(path)}) from None


def publication_json(p: Publication) -> dict[str, Any]:
    """A publication as the front ends answer it: its event's data, or "unchanged"."""
    if p.event is not None:
        return {"type": p.event.type, **json.loads(p.event.data.model_dump_json())}
    pin = p.executor_pin
    return {"type": "unchanged", "tool_id": p.tool_id, "version": p.version,
            "integrity": p.integrity,
            "executor_pin": None if pin is None else {"tool_id": pin.tool_id,
                                                      "version": pin.version,
                                                      "integrity": pin.integrity}}
