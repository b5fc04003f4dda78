"""A pipeline's stop ends every partition recovery, those a rebalance began meanwhile too:
none is left to meet the stopped consumer and fail unheard."""

from __future__ import annotations

import asyncio

from aiokafka.errors import ConsumerStoppedError
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from consumers.runtime.pipeline import Pipeline
from consumers.steps import authorize
from contracts.fact_signature import FactSigner, FactVerifier
from tests.handlers.conftest import build_harness, clock, dead_letters_of, pipeline_deps


class _RebalancingConsumer:
    """Stops as aiokafka's does after a rebalance assigned a partition during the
    pipeline's drain: the assignment's recovery starts and meets the stopped consumer."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline
        self.recovery: asyncio.Task[None] | None = None

    async def stop(self) -> None:
        async def recover() -> None:
            await asyncio.sleep(0)
            raise ConsumerStoppedError()

        self.recovery = asyncio.create_task(recover())
        self._pipeline._recovering[3] = self.recovery


async def test_stop_ends_the_recoveries_a_rebalance_began_while_it_drained() -> None:
    harness = build_harness()
    deps = pipeline_deps(harness, authorize_deps=authorize.AuthorizeDeps(
        clock=clock, require_auth=False, public_keys=lambda: []))
    signer = FactSigner(Ed25519PrivateKey.generate())
    pipeline = Pipeline("127.0.0.1:9", None, deps, dead_letters_of(harness),  # type: ignore[arg-type]
                        signer=signer, verifier=FactVerifier([signer.public_key]), group="g")
    waiting = asyncio.create_task(asyncio.Event().wait())  # a recovery still reading the log
    pipeline._recovering[1] = waiting
    consumer = _RebalancingConsumer(pipeline)
    pipeline._consumer = consumer  # type: ignore[assignment]

    await pipeline.stop()

    assert waiting.cancelled()
    assert consumer.recovery is not None and consumer.recovery.cancelled()
    assert pipeline._recovering == {}
