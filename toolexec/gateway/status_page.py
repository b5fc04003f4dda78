"""The gateway's status page (`GET /`): server-rendered HTML over the read models.

Recent invocations with status and latency, circuit-breaker states, registry contents,
and an audit search form whose results are the records `GET /v1/audit` answers for
the same filters. No JavaScript; every value is HTML-escaped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import urlencode

from toolexec.gateway.models import InvocationView

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem; color: #222; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 2rem; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #ddd; padding: .3rem .5rem; text-align: left;
         vertical-align: top; }
th { background: #f4f4f4; } code { font-size: 12px; overflow-wrap: anywhere; }
.status { font-weight: 600; } .completed, .closed { color: #17703a; }
.failed, .cancelled, .open { color: #b3261e; } .half_open, .running { color: #8a5a00; }
form { display: flex; gap: .5rem; flex-wrap: wrap; align-items: end; }
label { display: flex; flex-direction: column; font-size: 12px; }
.empty { color: #777; font-style: italic; }
"""


@dataclass(frozen=True)
class Viewer:
    """Who reads the page (authorization on) and whether they see every caller's
    invocations (audit scope) or only their own."""

    subject: str
    sees_everything: bool


@dataclass(frozen=True)
class AuditFilters:
    """The audit search form's fields."""

    tool: str = ""
    type: str = ""
    invocation: str = ""
    limit: int = 50

    @property
    def active(self) -> bool:
        return bool(self.tool or self.type or self.invocation)

    def api_query(self) -> str:
        """The same search as a `/v1/audit` query string."""
        params = {"tool": self.tool, "type": self.type, "invocation": self.invocation}
        return urlencode({k: v for k, v in params.items() if v} | {"limit": self.limit})


def _cell(value: Any, css: str = "") -> str:
    text = "" if value is None else str(value)
    attribute = f' class="{escape(css)}"' if css else ""
    return f"<td{attribute}>{escape(text)}</td>"


def _table(section: str, headers: Sequence[str], rows: Iterable[str], empty: str) -> str:
    body = "".join(rows)
    if not body:
        return f'<p class="empty" data-section="{section}">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return (f'<table data-section="{section}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def _latency(view: InvocationView) -> str:
    return "" if view.duration_ms is None else f"{view.duration_ms:.1f} ms"


def invocations_table(views: Sequence[InvocationView]) -> str:
    rows = (f'<tr data-invocation="{escape(v.invocation_id)}">'
            + _cell(v.invocation_id) + _cell(v.tool_id)
            + _cell(v.version or v.version_range)
            + _cell(v.status, f"status {v.status}") + _cell(_latency(v))
            + _cell(v.error.code if v.error else "") + _cell(v.updated_at) + "</tr>"
            for v in views)
    return _table("invocations", ("invocation", "tool", "version", "status", "latency",
                                  "error", "updated"), rows, "No invocations yet.")


def circuits_table(circuits: Sequence[Mapping[str, Any]]) -> str:
    rows = (f'<tr data-service="{escape(str(c["service_id"]))}">'
            + _cell(c["service_id"]) + _cell(c["state"], f"status {c['state']}")
            + _cell(c["failure_count"]) + _cell(c["since"]) + _cell(c["reason"]) + "</tr>"
            for c in circuits)
    return _table("circuits", ("service", "state", "failures", "since", "reason"), rows,
                  "No external service has a circuit breaker yet: all closed.")


def registry_table(tools: Sequence[Mapping[str, Any]]) -> str:
    rows = (f'<tr data-tool="{escape(str(t["tool_id"]))}">'
            + _cell(t["tool_id"]) + _cell(t["current_version"] or t["latest_version"])
            + _cell(t["tool_type"]) + _cell(t["lifecycle"]) + _cell(t["description"])
            + "</tr>" for t in tools)
    return _table("registry", ("tool", "version", "type", "lifecycle", "description"), rows,
                  "The registry is empty.")


def audit_section(filters: AuditFilters, rows: Sequence[Mapping[str, Any]] | None) -> str:
    def field(name: str, label: str, value: str) -> str:
        return (f'<label>{escape(label)}<input name="{name}" value="{escape(value)}">'
                "</label>")

    form = ('<form id="audit-search" method="get" action="/">'
            + field("audit_tool", "tool id", filters.tool)
            + field("audit_type", "event type", filters.type)
            + field("audit_invocation", "invocation id", filters.invocation)
            + f'<input type="hidden" name="audit_limit" value="{filters.limit}">'
            '<button type="submit">Search</button></form>')
    if rows is None:
        return form
    link = f'<p><a href="/v1/audit?{escape(filters.api_query())}">as JSON</a> · ' \
           f"{len(rows)} record(s)</p>"
    table_rows = (f'<tr data-event="{escape(str(r["event_id"]))}">' + _cell(r["time"])
                  + _cell(r["type"]) + _cell(r["invocation_id"]) + _cell(r["tool_id"])
                  + _cell(f"{r['topic']}/{r['partition']}@{r['offset']}")
                  + f"<td><code>{escape(json.dumps(r['event'].get('data'))[:300])}</code></td>"
                  + "</tr>" for r in rows)
    return form + link + _table("audit", ("time", "type", "invocation", "tool", "position",
                                          "data"), table_rows, "No matching audit record.")


def viewer_line(viewer: Viewer | None) -> str:
    if viewer is None:
        return ""
    scope = "every caller's invocations" if viewer.sees_everything else "your invocations only"
    return (f'<p id="viewer">Signed in as <code>{escape(viewer.subject)}</code> '
            f"({scope}). "
            '<form method="post" action="/session/end" style="display:inline">'
            '<button type="submit">Sign out</button></form></p>')


def render(*, invocations: Sequence[InvocationView], circuits: Sequence[Mapping[str, Any]],
           tools: Sequence[Mapping[str, Any]], filters: AuditFilters,
           audit_rows: Sequence[Mapping[str, Any]] | None,
           viewer: Viewer | None = None) -> str:
    """The whole page."""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        "<title>toolexec status</title>"
        f'<meta name="viewport" content="width=device-width"><style>{STYLE}</style></head>'
        f"<body><h1>toolexec status</h1>{viewer_line(viewer)}"
        '<p><a href="/docs">API (OpenAPI)</a> · <a href="/asyncapi.json">events (AsyncAPI)</a>'
        ' · <a href="/health">health</a> · <a href="/metrics">metrics</a></p>'
        f'<section id="invocations"><h2>Recent invocations</h2>'
        f"{invocations_table(invocations)}</section>"
        f'<section id="circuits"><h2>Circuit breakers</h2>{circuits_table(circuits)}</section>'
        f'<section id="registry"><h2>Registry ({len(tools)} tools)</h2>'
        f"{registry_table(tools)}</section>"
        f'<section id="audit"><h2>Audit search</h2>{audit_section(filters, audit_rows)}'
        "</section></body></html>"
    )
