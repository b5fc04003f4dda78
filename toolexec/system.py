"""The wiring of the servers the CLI starts: the whole system of `toolexec up`
(broker, pipeline, read models, HTTP gateway, the tools published) and the MCP server
of `toolexec mcp`. The front ends stay apart: the CLI starts them through here."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolexec import heap
from toolexec.settings import Settings

if TYPE_CHECKING:
    from toolexec.publishing import Publication
    from toolexec.read_models import ReadModels

# FastAPI, uvicorn, the MCP SDK and the stack are imported by the functions that start
# them, so that `toolexec --help` starts quickly.


@dataclass
class RunningSystem:
    """A started `toolexec up`: its stack, its gateway's URL, what publishing the tools
    it was given did."""

    stack: Any
    gateway_url: str
    publications: list[Publication]


@contextlib.asynccontextmanager
async def running_system(settings: Settings, tools: list[Path]) -> AsyncIterator[RunningSystem]:
    """Start the whole system (keeping an embedded broker running after it stops),
    publish the built-in tools and those of `tools`, serve the HTTP gateway."""
    from toolexec.gateway.server import serve_gateway
    from toolexec.read_models import start_read_models
    from toolexec.stack import Stack
    from toolexec.usecases.publish import publish_to_stack

    started: list[ReadModels] = []

    async def read_models(settings: Settings, bootstrap: str) -> ReadModels:
        started.append(await start_read_models(settings, bootstrap))
        return started[-1]

    async with Stack(settings, read_models_factory=read_models, keep_broker=True) as stack, \
            serve_gateway(stack, started[0], settings) as gateway_url, \
            callback_deliverer(settings, stack, started[0]):
        publications = await publish_to_stack(stack, tools, settings)
        heap.settle()
        yield RunningSystem(stack, gateway_url, publications)


@contextlib.asynccontextmanager
async def callback_deliverer(settings: Settings, stack: Any,
                             read_models: ReadModels) -> AsyncIterator[None]:
    """The callback deliverer of `up`, when the operator allows callback hosts (none
    allowed: every callback_url is refused at the front ends, nothing to deliver)."""
    if not settings.callback_hosts:
        yield
        return
    from toolexec.callback_delivery import CallbackDeliverer, read_model_lookup
    from toolexec.settings import kafka_client_options

    lookup = read_model_lookup(read_models.engine, read_models.wait_caught_up)
    async with CallbackDeliverer(settings, stack.bootstrap, lookup=lookup,
                                 publish=stack.publish, verifier=stack.verifier,
                                 client_options=kafka_client_options(settings)):
        yield


def serve_mcp(settings: Settings, tools: list[Path], *, http: bool, host: str,
              port: int) -> None:
    """Serve the MCP server over stdio, or streamable HTTP at http://HOST:PORT/mcp."""
    from toolexec.gateway.mcp import Gateway, build_server

    server = build_server(Gateway(settings, tools))
    if http:
        server.run("streamable-http", host=host, port=port)
    else:
        server.run("stdio")
