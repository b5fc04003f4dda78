"""Fixtures of the security tests: the in-memory pipeline with the policy engine wired,
an RSA key pair, token forging helpers, and `sandbox`: each sandbox giving a run a
fresh root that this host offers (the namespace launcher, bubblewrap)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from consumers.adapters.decision_cache import DecisionStore, MemoryDecisions
from consumers.adapters.policy_engine import CedarEvaluator
from consumers.primitives import bubblewrap, namespace_launcher
from consumers.runtime.runs import InvocationRuns
from consumers.steps import authorize
from domain.credentials import CredentialGrants
from domain.policy import DecisionCache
from projections.policy_view import PolicyView
from tests.handlers.conftest import (
    FIXED_NOW,
    Harness,
    build_harness,
    clock,
    dead_letters_of,
    pipeline_deps,
)

NOW = int(FIXED_NOW.timestamp())
NO_BWRAP = pytest.mark.skipif(bubblewrap.bwrap_binary() is None,
                              reason="bubblewrap not installed")
NO_LAUNCHER = pytest.mark.skipif(not namespace_launcher.usable(),
                                 reason="the namespace launcher needs root")


@pytest.fixture(params=[pytest.param("namespaces", marks=NO_LAUNCHER),
                        pytest.param("bwrap", marks=NO_BWRAP)])
def sandbox(request: pytest.FixtureRequest) -> str:
    """Each sandbox giving a run a fresh root available here, by name."""
    return str(request.param)


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
                         ) -> tuple[Harness, PolicyView, DecisionCache]:
    """The pipeline's runs with require_auth on and Cedar policies wired. Decisions
    are cached in `decisions`, else in the returned in-process cache; credentials are
    granted as `credential_grants` says (nothing by default)."""
    harness = build_harness(runner=runner)
    cache = DecisionCache()
    decisions = decisions if decisions is not None else MemoryDecisions(cache)
    view = PolicyView()
    view.on_change(decisions.invalidate)
    deps = pipeline_deps(harness, secrets=secrets, credential_grants=credential_grants,
                         authorize_deps=authorize.AuthorizeDeps(
                             clock=clock, require_auth=True, public_keys=lambda: public_keys,
                             policies=view, evaluator=evaluator or CedarEvaluator(),
                             cache=decisions, external=external))
    harness.runs = InvocationRuns(deps, dead_letters_of(harness), consumer="sec.pipeline")
    return harness, view, cache
