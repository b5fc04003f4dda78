"""The tool-side report protocol: one JSON object per line in TOOLEXEC_REPORT_FILE.

`{"progress": 0.4, "message": "step 8 of 20"}` (progress may be null or absent) or
`{"checkpoint": {...the state...}}`. Lines are written by the tool, so by an
attacker: each is parsed strictly (no NaN, no duplicate meaning: an object with both
keys, or neither, is malformed), bounded in length, and a malformed one is named,
never fatal. Progress is coalesced (`Coalescer`): at most one report per interval
reaches the log, the latest one winning; checkpoints supersede each other the same
way, since only the last one is resumed from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

MESSAGE_MAX = 1000
"""Characters of a progress message kept (the event's limit)."""


@dataclass(frozen=True, slots=True)
class Progress:
    fraction: float | None
    message: str


@dataclass(frozen=True, slots=True)
class Checkpoint:
    state: dict[str, Any]


Report = Progress | Checkpoint


class MalformedReport(ValueError):
    """A line that is not a report; the message says why (for the warning logged)."""


def parse_report(line: bytes) -> Report:
    """One report from one line (without its line break); MalformedReport otherwise."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        raise MalformedReport(f"not JSON: {error}") from error
    if not isinstance(value, dict):
        raise MalformedReport("not a JSON object")
    if "checkpoint" in value:
        if "progress" in value or "message" in value:
            raise MalformedReport("a report is a checkpoint or progress, not both")
        state = value["checkpoint"]
        if not isinstance(state, dict):
            raise MalformedReport("a checkpoint's state must be a JSON object")
        return Checkpoint(state)
    if "progress" not in value and "message" not in value:
        raise MalformedReport("neither progress nor checkpoint")
    return Progress(_fraction(value.get("progress")), _message(value.get("message")))


def _fraction(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise MalformedReport("progress must be a number from 0 to 1, or null")
    return min(max(float(value), 0.0), 1.0)


def _message(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedReport("message must be a string")
    return value[:MESSAGE_MAX]


class Coalescer:
    """Lets at most one item through per `interval` seconds; an item offered too soon
    waits, replaced by any later one, until `due` lets it out."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._last: float | None = None
        self._pending: Any = None

    def offer(self, item: Any, now: float) -> Any:
        """The item to emit now (None: it waits, replacing what waited)."""
        self._pending = item
        return self.due(now)

    def due(self, now: float) -> Any:
        """The waiting item when its time has come, else None."""
        if self._pending is None or (self._last is not None
                                     and now - self._last < self._interval):
            return None
        item, self._pending, self._last = self._pending, None, now
        return item

    def drain(self) -> Any:
        """The waiting item whatever the time (the run ended), else None."""
        item, self._pending = self._pending, None
        return item
