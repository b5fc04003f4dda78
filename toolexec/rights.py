"""The one rights check of every write and read outside the invocation pipeline.

The CLI's write commands (`publish`, `run --tools`, `deprecate`, `remove`, `restore`,
`policy apply`) and the HTTP gateway's routes (register, lifecycle, cancel, audit,
invocation reads, status page) call the same two functions: `caller` verifies the
presented token (None when authorization is off: the embedded default checks
nothing), `demand` checks it grants what the action needs. A right therefore means
the same thing wherever it is used. Authorization is on when this process's settings
say so, or when the running `toolexec up` a CLI command talks to says so in its
runtime file.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from domain.capability import Capability, authorise_reader, require
from domain.scopes import Need
from toolexec import keys
from toolexec.settings import Settings


def auth_required(settings: Settings, runtime: Mapping[str, Any] | None = None) -> bool:
    """Whether writes and reads need a capability token: this process's setting, or
    the running system's (`require_auth` in its runtime file)."""
    return settings.auth_required or bool((runtime or {}).get("require_auth"))


def caller(settings: Settings, token: str | None,
           runtime: Mapping[str, Any] | None = None) -> Capability | None:
    """The verified capability of `token` when authorization is on, else None.

    Raises AuthorizationError: E3203 (no or malformed token, lifetime over the maximum,
    issued in the future), E3202 (signature), E3201 (expired)."""
    if not auth_required(settings, runtime):
        return None
    return authorise_reader(token, keys.verification_keys(settings), now=int(time.time()),
                            lifetime=keys.token_lifetime(settings))


def demand(capability: Capability | None, needs: Iterable[Need]) -> None:
    """Check `capability` grants every one of `needs` (E3206 otherwise: a scope missing,
    or admin for runtimes, primitives and MCP servers). None (authorization off)
    grants everything."""
    if capability is None:
        return
    for need in needs:
        require(capability, need)
