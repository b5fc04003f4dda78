"""Serving the gateway inside a running stack: uvicorn on the stack's event loop.

`serve_gateway(stack, read_models, settings)` wires the gateway's context from the
running parts (broker, read models, consumers), binds the socket (port 0 = a free
port), and yields the gateway's URL until the block ends; the process's own signal
handling (Ctrl-C in `toolexec up`) decides when that is.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Generator, Mapping
from typing import Any

import structlog
import uvicorn
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from sqlalchemy.ext.asyncio import AsyncEngine

from contracts import topics
from contracts.kafka_clients import close_quietly
from projections.runner import stored_offsets
from toolexec import keys
from toolexec.asyncapi import asyncapi_document
from toolexec.client import InvocationClient
from toolexec.gateway.http import GatewayContext, create_app, current_manifest
from toolexec.metrics import PipelineMetrics
from toolexec.read_models import ReadModels
from toolexec.settings import Settings, fetch_waits, kafka_client_options
from toolexec.stack import Stack

log = structlog.get_logger(__name__)

START_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0
CATCH_UP_BROKER_SECONDS = 2.0
"""How long a read waits to learn the log's end before answering from the read model."""


class KafkaProbe:
    """Broker liveness and consumer lag (pipeline groups' commits, read models' stored
    offsets) against the log's end offsets."""

    def __init__(self, bootstrap: str, engine: AsyncEngine,
                 groups: Mapping[str, tuple[str, ...]],
                 read_models: Mapping[str, tuple[str, ...]], *,
                 client_options: Mapping[str, Any] | None = None) -> None:
        self._bootstrap = bootstrap
        self._client_options = dict(client_options or {})
        self._engine = engine
        self._groups = groups
        self._read_models = read_models
        self._consumer: AIOKafkaConsumer | None = None
        # One never-subscribing member per group reads its commits (OffsetFetch); the
        # admin client's OffsetFetch is not understood by Tansu.
        self._readers: dict[str, AIOKafkaConsumer] = {}

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, group_id=None,
                                          **self._client_options)
        await self._consumer.start()

    async def stop(self) -> None:
        for reader in self._readers.values():
            await reader.stop()
        self._readers.clear()
        if self._consumer is not None:
            await close_quietly(self._consumer.stop())

    async def _committed(self, group: str,
                         places: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        reader = self._readers.get(group)
        if reader is None:
            reader = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, group_id=group,
                                      enable_auto_commit=False, **self._client_options)
            await reader.start()
            self._readers[group] = reader
        committed = {}
        for topic, partition in places:
            offset = await reader.committed(TopicPartition(topic, partition))
            if offset is not None:
                committed[(topic, partition)] = offset
        return committed

    async def ping(self) -> None:
        assert self._consumer is not None
        await self._consumer.topics()  # a metadata round trip

    async def _ends(self) -> dict[tuple[str, int], int]:
        assert self._consumer is not None
        tps = [TopicPartition(topic, p) for topic in topics.ALL_TOPICS
               for p in self._consumer.partitions_for_topic(topic) or ()]
        ends = await self._consumer.end_offsets(tps) if tps else {}
        return {(tp.topic, tp.partition): offset for tp, offset in ends.items()}

    async def lag(self) -> dict[str, int]:
        ends = await self._ends()
        lag: dict[str, int] = {}
        for group, group_topics in self._groups.items():
            positions = await self._committed(group, [p for p in ends if p[0] in group_topics])
            lag[group] = _behind(ends, positions, group_topics)
        for name, model_topics in self._read_models.items():
            stored = await stored_offsets(self._engine, name)
            lag[f"projection.{name}"] = _behind(ends, stored, model_topics)
        return lag


def _behind(ends: Mapping[tuple[str, int], int], positions: Mapping[tuple[str, int], int],
            of_topics: tuple[str, ...]) -> int:
    return sum(max(end - max(positions.get(place, 0), 0), 0)
               for place, end in ends.items() if place[0] in of_topics)


def consumer_states(stack: Stack, read_models: ReadModels) -> dict[str, str]:
    """Every consumer of this process: "running", or why not."""
    states: dict[str, str] = {}
    broker = stack.broker
    for subscriber in broker.subscribers if broker is not None else ():
        group = getattr(subscriber, "group_id", None)
        watched = ",".join(str(getattr(t, "name", t)) for t in getattr(subscriber, "topics", ()))
        name = group or f"view:{watched}"
        states[name] = "running" if getattr(subscriber, "running", False) else "stopped"
    if stack.pipeline is not None:
        states[stack.pipeline.group] = "running" if stack.pipeline.running else "stopped"
    for name, state in read_models.states().items():
        states[f"projection.{name}"] = state  # "running", rebuilding, diverged or failed
    return states


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the host process owns Ctrl-C."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on (host, port); port 0 picks a free one.

    TCP_NODELAY is set here, on the listening socket, so that every accepted
    connection inherits it: uvicorn serving given sockets does not set it, and a
    keep-alive client then waits ~40 ms per request (the response's second segment
    held by Nagle until the client's delayed ACK)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@contextlib.asynccontextmanager
async def serve_gateway(stack: Stack, read_models: ReadModels,
                        settings: Settings) -> AsyncIterator[str]:
    """Run the gateway over `stack` and `read_models`; yields its base URL."""
    observed = PipelineMetrics()
    stack.observers.append(observed.observe)
    client_options = kafka_client_options(settings)
    client = InvocationClient(stack.bootstrap, pipeline=stack.pipeline, verifier=stack.verifier,
                              fetch_waits=fetch_waits(settings), client_options=client_options,
                              seal_to=keys.token_seal_public_key(settings))
    groups = {g: (topics.INVOCATIONS,) for s in (stack.broker.subscribers if stack.broker else ())
              if (g := getattr(s, "group_id", None))}
    if stack.pipeline is not None:
        groups[stack.pipeline.group] = (topics.REQUESTS,)
    probe = KafkaProbe(stack.bootstrap, read_models.engine, groups, dict(read_models.topics),
                       client_options=client_options)

    async def catch_up(name: str, timeout: float) -> bool:
        """Read-your-writes for the gateway's reads: bounded, and never an error. With
        the broker away, the read models answer with what they hold (the broker's
        state is what /health reports)."""
        runner = read_models.runners.get(name)
        if runner is None or runner.failure is not None:
            return False
        try:
            async with asyncio.timeout(min(timeout, CATCH_UP_BROKER_SECONDS)):
                ends = await runner.end_offsets()
        except (KafkaError, TimeoutError):
            return False
        return await runner.wait_caught_up_to(ends, timeout)

    document = asyncapi_document(stack.bootstrap)
    await client.start()
    try:
        await probe.start()
        context = GatewayContext(settings=settings, engine=read_models.engine, client=client,
                                 probe=probe, consumers=lambda: consumer_states(stack, read_models),
                                 catch_up=catch_up, asyncapi=lambda: document,
                                 manifest_of=lambda tool_id: current_manifest(stack.registry,
                                                                              tool_id))
        sock = bind(settings.gateway_host, settings.gateway_port)
        async with _serving(create_app(context), sock) as url:
            yield url
    finally:
        await probe.stop()
        await client.stop()


@contextlib.asynccontextmanager
async def _serving(app: Any, sock: socket.socket) -> AsyncIterator[str]:
    server = _EmbeddedServer(uvicorn.Config(app, log_level="warning", lifespan="off",
                                            access_log=False))
    task = asyncio.create_task(server.serve(sockets=[sock]), name="gateway")
    try:
        async with asyncio.timeout(START_TIMEOUT):
            while not server.started:
                if task.done():
                    task.result()  # raises what stopped it
                    raise RuntimeError("gateway stopped while starting")
                await asyncio.sleep(0.02)
        url = url_of(sock)
        log.info("gateway.started", url=url)
        yield url
    finally:
        server.should_exit = True
        try:
            async with asyncio.timeout(STOP_TIMEOUT):
                await task
        except TimeoutError:
            server.force_exit = True
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        sock.close()
