"""Scenario 4 of `toolexec bench`: the per-invocation domain work, in microseconds.

Calls the domain functions the pipeline calls, in a loop, with their caches warm:
cached chain resolution, integrity verification (IntegrityCache), parent->child
validation, parameter validation and the permission decision. The uncached costs are
reported beside them as the baseline, and the per-event codec and plan building as
context (they are paid on every invocation too).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from consumers.adapters.policy_engine import CedarEvaluator
from consumers.steps.derived_events import derive
from contracts.envelope import new_envelope
from contracts.events import ChainLink, ChainResolved, InvokeRequested
from contracts.kafka_binding import decode, encode
from domain.capability import VerifiedTokens, authorise
from domain.chain import ChainCache, resolve_chain
from domain.child_validation import ensure_chain_valid
from domain.integrity import IntegrityCache, verify_chain
from domain.model import ResolvedChain
from domain.plan import build_plan
from domain.policy import AccessRequest, DecisionCache, PolicyBundle, ToolResource, decide
from domain.validation import validate_parameters
from toolexec.bench.env import SCRIPT_PARAMS, SCRIPT_TOOL, bench_registry, write_bench_tools
from toolexec.bench.report import Figure, ScenarioResult, percentile

HOT_PATH_TARGET_US = 5000.0


def per_call_us(operation: Callable[[], Any], iterations: int) -> float:
    """Mean wall time of `operation` in microseconds over `iterations` calls."""
    operation()
    began = time.perf_counter_ns()
    for _ in range(iterations):
        operation()
    return (time.perf_counter_ns() - began) / iterations / 1000


def capability_token(tool_id: str) -> tuple[str, Any]:
    """A fresh RS256 key and a token granting `tool_id` (any version)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    claims = {"sub": "did:example:bench", "jti": str(uuid.uuid4()), "iat": now,
              "exp": now + 3600, "tools": [{"tool_id": tool_id, "version_range": "*"}]}
    return jwt.encode(claims, key, algorithm="RS256"), key.public_key()


def _chain_event(chain: ResolvedChain) -> Any:
    request = InvokeRequested(invocation_id=str(uuid.uuid4()), tool_id=SCRIPT_TOOL,
                              parameters=dict(SCRIPT_PARAMS))
    now = datetime.now(UTC)
    cause = new_envelope(request, source="urn:bench", partitionkey=request.invocation_id,
                         correlationid=request.invocation_id, id=str(uuid.uuid4()), time=now)
    resolved = ChainResolved(
        invocation_id=request.invocation_id, tool_id=chain.leaf.tool_id,
        version=chain.leaf.version, parameters=request.parameters,
        chain=[ChainLink(tool_id=t.tool_id, version=t.version, integrity=t.integrity,
                         tool_type=t.tool_type, executor=t.executor) for t in chain.links])
    return derive(cause, resolved, step="resolve", now=now)


def hot_path(root: Path, *, iterations: int) -> ScenarioResult:
    """Scenario 4 (no broker, no processes: domain functions in this process)."""
    registry = bench_registry(write_bench_tools(root, "127.0.0.1:9"))
    cache = ChainCache()
    chain = cache.resolve(registry, SCRIPT_TOOL, "*", revision=registry.revision)
    leaf = chain.leaf
    schema = leaf.manifest["parameters"]
    token, public_key = capability_token(SCRIPT_TOOL)
    keys = [public_key]
    now = int(time.time())
    permission = PermissionCheck(token, keys, leaf, now)
    steps: dict[str, Callable[[], Any]] = {
        "resolve (ChainCache hit)":
            lambda: cache.resolve(registry, SCRIPT_TOOL, "*", revision=registry.revision),
        "integrity verify (cached)": lambda: verify_chain(chain),
        "child validation": lambda: ensure_chain_valid(chain, strict=True),
        "param validation": lambda: validate_parameters(schema, SCRIPT_PARAMS),
        "permission (token seen before, cached Cedar decision)": permission.cached,
    }
    figures: dict[str, Figure] = {f"{name} us": round(per_call_us(step, iterations), 2)
                                  for name, step in steps.items()}
    totals = _sequence_us(list(steps.values()), iterations)
    total_p50 = percentile(totals, 50)
    figures.update({"total p50 us": round(total_p50, 2),
                    "total p99 us": round(percentile(totals, 99), 2)})
    figures.update(_baselines(registry, chain, iterations))
    figures["baseline: permission uncached (RS256 + Cedar) us"] = round(
        per_call_us(permission.uncached, max(10, iterations // 10)), 2)
    return ScenarioResult(
        "hot-path", "4. hot path (per invocation, domain only)", figures,
        f"< {HOT_PATH_TARGET_US / 1000:g} ms", total_p50 < HOT_PATH_TARGET_US,
        ["permission: capability token (VerifiedTokens) then Cedar through the decision "
         "cache, as the authorize step does; its baseline verifies and evaluates afresh",
         "baselines: uncached resolve, integrity and permission; per-event codec and plan "
         "building are paid on every invocation too (not in the total)"])


POLICY = """
@id("bench-permit")
permit(principal, action, resource) when { resource.tool_id like "*" };
@id("bench-forbid")
forbid(principal, action, resource) when { resource.tags.contains("forbidden") };
"""


class PermissionCheck:
    """The authorize step's permission work for one token and tool version."""

    def __init__(self, token: str, keys: list[Any], leaf: Any, now: int) -> None:
        self.token, self.keys, self.leaf, self.now = token, keys, leaf, now
        self.verified = VerifiedTokens()
        self.cache = DecisionCache()
        self.bundle = PolicyBundle({"bench": ("1", POLICY)})
        self.evaluator = CedarEvaluator()
        self.resource = ToolResource.from_manifest(leaf.tool_id, leaf.version, leaf.manifest)

    def _check(self, verified: VerifiedTokens | None, cache: DecisionCache | None) -> None:
        capability = authorise(self.token, self.keys, tool_id=self.leaf.tool_id,
                               version=self.leaf.version, now=self.now, verified=verified)
        request = AccessRequest.build(capability.subject, self.resource, SCRIPT_PARAMS,
                                      now=self.now)
        assert decide(request, self.bundle, self.evaluator, cache, clock=self.now).allowed

    def cached(self) -> None:
        self._check(self.verified, self.cache)

    def uncached(self) -> None:
        self._check(None, None)


def _sequence_us(steps: list[Callable[[], Any]], iterations: int) -> list[float]:
    totals: list[float] = []
    for _ in range(iterations):
        began = time.perf_counter_ns()
        for step in steps:
            step()
        totals.append((time.perf_counter_ns() - began) / 1000)
    return totals


def _baselines(registry: Any, chain: ResolvedChain, iterations: int) -> dict[str, Figure]:
    event = _chain_event(chain)
    record = encode(event)
    few = max(10, iterations // 10)
    fresh = IntegrityCache(max_entries=0)
    return {
        "baseline: resolve uncached us":
            round(per_call_us(lambda: resolve_chain(registry, SCRIPT_TOOL, "*"), few), 2),
        "baseline: integrity uncached us":
            round(per_call_us(lambda: verify_chain(chain, cache=fresh), few), 2),
        "context: build_plan us": round(per_call_us(lambda: build_plan(chain), few), 2),
        "context: encode one event us": round(per_call_us(lambda: encode(event), iterations), 2),
        "context: decode one event us": round(per_call_us(
            lambda: decode(record.key, record.value, record.headers), iterations), 2),
    }
