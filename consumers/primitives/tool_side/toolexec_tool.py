"""toolexec's helper for Python tools: progress, checkpoints and resuming.

    import toolexec_tool
    state = toolexec_tool.last_checkpoint() or {"done": 0}   # resuming? start there
    for step in range(state["done"], 20):
        ...                                                   # one step of work
        toolexec_tool.checkpoint({"done": step + 1})
        toolexec_tool.progress((step + 1) / 20, f"step {step + 1} of 20")

The executor puts this module on PYTHONPATH of every subprocess tool. Outside
toolexec (no TOOLEXEC_REPORT_FILE) every call is a no-op, so a tool runs the same by
hand. The protocol is two plain files (see docs/authoring.md), so a tool in any
language can do the same without this module. Standard library only.
"""

from __future__ import annotations

import json
import os
from typing import Any

REPORT_FILE = "TOOLEXEC_REPORT_FILE"
CHECKPOINT_FILE = "TOOLEXEC_CHECKPOINT_FILE"


def progress(fraction: float | None = None, message: str = "") -> None:
    """Say how far the tool has got: `fraction` from 0 to 1 (None: unknown) and a
    short message (at most 1000 characters are kept)."""
    _append({"progress": fraction, "message": message})


def checkpoint(state: dict[str, Any]) -> None:
    """Save `state` (a JSON object): after a crash the tool starts again with it as
    `last_checkpoint()`. Work done after the last checkpoint is done again."""
    if not isinstance(state, dict):
        raise TypeError("a checkpoint's state must be a dict (a JSON object)")
    _append({"checkpoint": state})


def last_checkpoint() -> dict[str, Any] | None:
    """The state of the last checkpoint when this run resumes an interrupted one,
    else None (a fresh start)."""
    path = os.environ.get(CHECKPOINT_FILE)
    if not path:
        return None
    with open(path, encoding="utf-8") as file:
        state = json.load(file)
    return state if isinstance(state, dict) else None


def _append(report: dict[str, Any]) -> None:
    path = os.environ.get(REPORT_FILE)
    if not path:
        return
    line = json.dumps(report, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    # one write of a whole line in append mode: lines never interleave
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")
