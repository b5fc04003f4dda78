"""Report lines as a hostile tool writes them, and coalescing."""

from __future__ import annotations

import pytest

from domain.tool_reports import (
    MESSAGE_MAX,
    Checkpoint,
    Coalescer,
    MalformedReport,
    Progress,
    parse_report,
)


def test_progress_and_checkpoint_lines() -> None:
    assert parse_report(b'{"progress": 0.4, "message": "step 8 of 20"}') == Progress(
        0.4, "step 8 of 20")
    assert parse_report(b'{"message": "warming up"}') == Progress(None, "warming up")
    assert parse_report(b'{"progress": null}') == Progress(None, "")
    assert parse_report(b'{"progress": 7}') == Progress(1.0, "")  # held to 0..1
    assert parse_report(b'{"checkpoint": {"done": 3}}') == Checkpoint({"done": 3})
    long = parse_report(b'{"message": "' + b"m" * 5000 + b'"}')
    assert isinstance(long, Progress) and len(long.message) == MESSAGE_MAX


@pytest.mark.parametrize("line", [
    b"not json", b"[1, 2]", b"{}", b'{"progress": NaN}', b'{"progress": "half"}',
    b'{"progress": true}', b'{"message": 3}', b'{"checkpoint": [1]}',
    b'{"checkpoint": {}, "progress": 1}', b'{"progress": 1e400}', b"\xff\xfe",
])
def test_malformed_lines_are_named(line: bytes) -> None:
    with pytest.raises(MalformedReport):
        parse_report(line)


def test_the_coalescer_lets_one_item_per_interval_through_and_keeps_the_latest() -> None:
    coalescer = Coalescer(1.0)
    assert coalescer.offer("a", 0.0) == "a"
    assert coalescer.offer("b", 0.2) is None
    assert coalescer.offer("c", 0.5) is None
    assert coalescer.due(0.9) is None
    assert coalescer.due(1.0) == "c"
    assert coalescer.due(5.0) is None
    assert coalescer.offer("d", 5.0) == "d"
    assert coalescer.offer("e", 5.1) is None
    assert coalescer.drain() == "e" and coalescer.drain() is None
