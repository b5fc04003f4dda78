"""Applying an ABAC policy set: Cedar text (a `.cedar` file, or a JSON list of Cedar
JSON policies) checked to parse, then sent as `policy.updated` by a caller holding the
policy scope when authorization is on."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from consumers.policy_engine import cedar_text_from_json, compile_policies
from contracts.envelope import Envelope, new_envelope
from contracts.events import PolicyUpdated
from domain.capability import Capability
from domain.errors import InvalidRequest
from domain.scopes import POLICY_NEED
from toolexec import rights

SOURCE = "urn:toolexec:cli"


def read_policy_file(path: Path) -> str:
    """Cedar text of a `.cedar` file, or of a JSON list of Cedar JSON policies, checked
    to parse. Raises InvalidRequest (missing or unreadable file, bad JSON) or
    AuthorizationError (E3206, Cedar that does not parse)."""
    try:
        raw = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            loaded = json.loads(raw)
            raw = cedar_text_from_json(loaded if isinstance(loaded, list) else [loaded])
    except FileNotFoundError:
        raise InvalidRequest(f"{path} does not exist", details={"path": str(path)}) from None
    except (OSError, ValueError) as error:
        raise InvalidRequest(f"{path}: {error}", details={"path": str(path)}) from None
    compile_policies(raw)
    return raw


def policy_event(text: str, *, policy_set_id: str, version: str | None = None) -> Envelope:
    """A `policy.updated` for Cedar policy text; the version defaults to a content hash."""
    version = version or "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
    data = PolicyUpdated(policy_set_id=policy_set_id, version=version, policies=text)
    return new_envelope(data, source=SOURCE, partitionkey=policy_set_id,
                        correlationid=policy_set_id, id=str(uuid.uuid4()),
                        time=datetime.now(UTC))


async def apply_policy(bootstrap: str, event: Envelope, capability: Capability | None,
                       client_options: Mapping[str, Any]) -> None:
    """Send `event` to the running system once `capability` holds the policy scope
    (None: authorization off). Raises AuthorizationError (E3206), E3001 when the broker
    does not take it."""
    from toolexec.client import InvocationClient  # Kafka only for this use case

    rights.demand(capability, [POLICY_NEED])
    async with InvocationClient(bootstrap, client_options=dict(client_options)) as client:
        await client.send(event)
