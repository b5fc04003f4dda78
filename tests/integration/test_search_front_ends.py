"""The three search front ends give the same ranked list for the same query:
`toolexec search`, `GET /v1/tools?q=` and the MCP gateway's `search` tool."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from projections.database import make_engine, migrate
from tests.cli_process import toolexec
from toolexec.bench.search import publish, relevance_set
from toolexec.gateway.http import GatewayContext, create_app
from toolexec.gateway.mcp import Gateway
from toolexec.settings import Settings

pytestmark = pytest.mark.integration

QUERIES = ("word frequency", "tranlsate", "conv", "download a web page", "text")


async def _populated(cwd: Path) -> Settings:
    settings = Settings(state_dir=cwd / ".toolexec")
    settings.state_dir.mkdir(parents=True)
    engine = make_engine(settings.effective_database_url)
    await migrate(engine)
    await publish(engine, relevance_set()[0])
    await engine.dispose()
    return settings


async def _always(*_: object) -> bool:
    return True


async def test_cli_http_and_mcp_rank_alike(tmp_path: Path) -> None:
    settings = await _populated(tmp_path)
    engine = make_engine(settings.effective_database_url)
    app = create_app(GatewayContext(settings=settings, engine=engine, client=None,  # type: ignore[arg-type]
                                    probe=None, consumers=dict, catch_up=_always))  # type: ignore[arg-type]
    mcp = Gateway(settings, [])
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://gateway") as http:
            for query in QUERIES:
                cli = toolexec("search", query, "--limit", "10", "--json", cwd=tmp_path)
                assert cli.returncode == 0, cli.stderr
                over_cli = json.loads(cli.stdout)
                over_http = (await http.get("/v1/tools", params={"q": query, "limit": 10})).json()
                over_mcp = await mcp.search(query, 10)
                ranked = [t["tool_id"] for t in over_cli["tools"]]
                assert ranked, query
                assert [t["tool_id"] for t in over_http["tools"]] == ranked
                assert [t["tool_id"] for t in over_mcp["results"]] == ranked
                assert over_cli["mode"] == over_http["mode"] == over_mcp["mode"] == "lexical"
                assert [t["score"] for t in over_mcp["results"]] == [
                    t["score"] for t in over_http["tools"]]
                assert over_cli["total"] == over_http["total"] == over_mcp["total"]
            filtered = (await http.get("/v1/tools", params={
                "q": "text", "tag": "nlp", "limit": 1, "offset": 1})).json()
    finally:
        await mcp.close()
        await engine.dispose()
    assert filtered["total"] == 2 and len(filtered["tools"]) == 1
    assert set(filtered["tools"][0]["tags"]) >= {"nlp"}
