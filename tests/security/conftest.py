"""Fixtures of the security tests: the in-memory pipeline with the policy engine wired,
an RSA key pair, and token forging helpers."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from faststream.kafka import KafkaBroker

from consumers import authorize, execute, finalize, resolve
from consumers.claim_store import InMemoryClaims
from consumers.deadletter import DeadLetters
from consumers.decision_cache import DecisionStore, MemoryDecisions
from consumers.pipeline import PipelineDeps, passthrough_decoder, pipeline_groups, process_record
from consumers.policy_engine import CedarEvaluator
from contracts import topics
from contracts.envelope import Envelope
from domain.credentials import CredentialGrants
from domain.policy import DecisionCache
from projections.policy_view import PolicyView
from tests.handlers.conftest import (
    FIXED_NOW,
    FakeRegistry,
    Harness,
    ScriptedRunner,
    publish_on,
    sealed_tools,
)

NOW = int(FIXED_NOW.timestamp())


@pytest.fixture(scope="session")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def claims(tool: str = "py_echo", **changes: Any) -> dict[str, Any]:
    base = {"sub": "did:example:agent", "iat": NOW, "exp": NOW + 300, "jti": "jti-1",
            "tools": [{"tool_id": tool, "version_range": "^1"}]}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def rs256(key: rsa.RSAPrivateKey, **changes: Any) -> str:
    return jwt.encode(claims(**changes), key, algorithm="RS256")


def unsigned(**changes: Any) -> str:
    """A token with `alg: none` and no signature."""
    def part(obj: Mapping[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims(**changes))}."


def build_secure_harness(public_keys: list[Any], *,
                         secrets: Callable[[str], str | None] = lambda name: None,
                         runner: Any = None, external: Any = None,
                         decisions: DecisionStore | None = None, evaluator: Any = None,
                         credential_grants: CredentialGrants | None = None,
                         ) -> tuple[Harness, KafkaBroker, PolicyView, DecisionCache]:
    """The pipeline on TestKafkaBroker with require_auth on and Cedar policies wired.
    Decisions are cached in `decisions`, else in the returned in-process cache;
    credentials are granted as `credential_grants` says (nothing by default)."""
    broker = KafkaBroker("localhost:9092", apply_types=False, decoder=passthrough_decoder)
    registry = FakeRegistry()
    for tool in sealed_tools():
        registry.add(tool)
    runner = runner or ScriptedRunner()
    claims_store = InMemoryClaims("test-executor")
    harness = Harness(broker, registry, runner, claims_store, {"require_auth": True})
    cache = DecisionCache()
    decisions = decisions if decisions is not None else MemoryDecisions(cache)
    view = PolicyView()
    view.on_change(decisions.invalidate)

    async def publish(envelope: Envelope) -> None:
        harness.events.append(envelope)
        await publish_on(broker, envelope)

    def clock() -> datetime:
        return FIXED_NOW

    async def no_sleep(seconds: float) -> None:
        return None

    grants = {} if credential_grants is None else {"credential_grants": credential_grants}

    deps = PipelineDeps(
        resolve=resolve.ResolveDeps(registry=registry, publish=publish, clock=clock),
        authorize=authorize.AuthorizeDeps(
            publish=publish, clock=clock, require_auth=True, public_keys=lambda: public_keys,
            pending=authorize.PendingTokens(), registry=registry, policies=view,
            evaluator=evaluator or CedarEvaluator(), cache=decisions, external=external),
        execute=execute.ExecuteDeps(registry=registry, publish=publish, clock=clock,
                                    runner=runner, claims=claims_store, secrets=secrets,
                                    random=lambda: 0.0, sleep=no_sleep, **grants),
        finalize=finalize.FinalizeDeps(publish=publish, clock=clock),
        dead_letters=DeadLetters(publish, clock),
        clock=clock,
    )
    groups = pipeline_groups(deps, group_prefix="sec", execute_workers=1)

    @broker.subscriber(topics.INVOCATIONS, group_id="groups")
    async def all_steps(message: Any) -> None:
        for group in groups:
            await process_record(message.raw_message, group, deps)

    return harness, broker, view, cache
