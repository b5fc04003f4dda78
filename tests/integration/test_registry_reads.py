"""`published_versions` (what `toolexec publish` and the lifecycle commands plan
against) on a real broker: publications sent together in one batch are all seen, the
last batch's included (Tansu's end offset stops at that batch's first record)."""

from __future__ import annotations

import textwrap
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from contracts.kafka_binding import encode
from contracts.topics import REGISTRY
from domain.publication_limits import PublicationLimits
from tests.log_reading import send_as_one_batch
from toolexec.publishing import publish_event
from toolexec.registry_reads import published_versions
from toolexec.sources import load_source

pytestmark = pytest.mark.integration


def _tool(directory: Path, tool_id: str) -> Path:
    tool = directory / tool_id
    tool.mkdir()
    (tool / "tool.yaml").write_text(textwrap.dedent(f"""\
        tool_id: {tool_id}
        version: "1.0.0"
        tool_type: script
        executor: python_runtime
        description: Prints nothing.
        config:
          entrypoint: main.py
        """))
    (tool / "main.py").write_text("print('{}')\n")
    return tool


async def test_publications_sent_together_are_all_seen(kafka_bootstrap: str,
                                                       tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    tools = [f"batched_{tag}_{n}" for n in range(8)]
    now = datetime.now(UTC)
    events = [publish_event(load_source(_tool(tmp_path, tool_id)), now=now)
              for tool_id in tools]
    assert {event.type for event in events} == {"tool.published"}
    await send_as_one_batch(kafka_bootstrap, REGISTRY, [encode(event) for event in events])

    view = await published_versions(kafka_bootstrap, PublicationLimits())
    assert [tool_id for tool_id in tools if view.get(tool_id, "1.0.0") is None] == []
