"""How a `tools/call` result becomes the primitive outcome the pipeline finalises."""

from __future__ import annotations

import json

import mcp_types

from consumers.primitives.mcp_servers import _outcome
from domain.model import McpPlan

PLAN = McpPlan(server_key="text_mcp@1.0.0#sha256:00", tool_name="upper", transport="stdio")


def _text(text: str) -> mcp_types.TextContent:
    return mcp_types.TextContent(type="text", text=text)


def _result(**fields: object) -> mcp_types.CallToolResult:
    return mcp_types.CallToolResult(**fields)  # type: ignore[arg-type]


def test_structured_content_is_the_result():
    outcome = _outcome(PLAN, _result(content=[_text('{"a": 1}')],
                                     structured_content={"a": 1}), 1.0, "rlimits")
    assert outcome.ok and json.loads(outcome.stdout) == {"a": 1}


def test_a_lone_text_block_is_a_string_even_when_it_looks_like_json():
    outcome = _outcome(PLAN, _result(content=[_text("42")]), 1.0, "rlimits")
    assert json.loads(outcome.stdout) == "42"


def test_several_blocks_are_kept_as_content_blocks():
    outcome = _outcome(PLAN, _result(content=[_text("a"), _text("b")]), 1.0, "rlimits")
    assert [block["text"] for block in json.loads(outcome.stdout)] == ["a", "b"]


def test_is_error_is_a_failure_with_E3401_and_the_servers_words():
    outcome = _outcome(PLAN, _result(content=[_text("disk on fire")], is_error=True),
                       1.0, "rlimits")
    assert not outcome.ok and outcome.error is not None
    assert outcome.error["code"] == "E3401"
    assert "disk on fire" in outcome.error["message"]
    assert outcome.error["details"]["content"] == ["disk on fire"]
