"""The gateway's status page (`GET /`) and invocation pages (`GET /invocations/{id}`):
server-rendered HTML over the read models.

Recent invocations with status and latency, pending work, circuit-breaker states,
registry contents, and an audit search form whose results are the records
`GET /v1/audit` answers for the same filters; every invocation links to its page, the
timeline of its audit records. Every value is HTML-escaped. One small script
(`static/status.js`, the only script the page's Content-Security-Policy allows) polls
`GET /status.json` to refresh the tables and draw the last hour's charts; without it
the page is still whole, as of its loading.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

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
#live { color: #555; font-size: 12px; } #live.stale { color: #b3261e; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(360px, 1fr));
          gap: 1rem; }
figure { margin: 0; } figcaption { font-size: 12px; font-weight: 600; }
svg.chart { width: 100%; height: 170px; background: #fafafa; border: 1px solid #eee; }
.legend { font-size: 12px; display: flex; gap: .8rem; flex-wrap: wrap; }
.swatch { display: inline-block; width: .8rem; height: .8rem; margin-right: .25rem;
          vertical-align: -1px; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; font-size: 12px; margin: 0;
      max-height: 16rem; overflow: auto; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; }
dt { font-weight: 600; } dd { margin: 0; } td.time { white-space: nowrap; }
"""

CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'; style-src 'unsafe-inline'; "
                           "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; "
                           "base-uri 'none'")
"""Sent with every page: no script but the gateway's own runs, whatever a value holds."""
SCRIPT_PATH = "/static/status.js"


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


def invocation_href(invocation_id: str) -> str:
    """The path of an invocation's page."""
    return "/invocations/" + quote(invocation_id, safe="")


def _invocation_cell(invocation_id: str | None) -> str:
    if not invocation_id:
        return "<td></td>"
    return (f'<td><a href="{escape(invocation_href(invocation_id))}">'
            f"{escape(invocation_id)}</a></td>")


def _latency(duration_ms: float | None) -> str:
    return "" if duration_ms is None else f"{duration_ms:.1f} ms"


INVOCATION_COLUMNS = ("invocation", "tool", "version", "status", "progress", "latency", "error",
                      "updated")


def progress_text(progress: Mapping[str, Any] | None) -> str:
    """A progress report in words: "40% step 8 of 20" (the share when known)."""
    if not progress:
        return ""
    fraction = progress.get("fraction")
    share = "" if fraction is None else f"{fraction:.0%} "
    return (share + str(progress.get("message") or "")).strip()


def _progress_cell(progress: Mapping[str, Any] | None) -> str:
    if not progress:
        return "<td></td>"
    fraction = progress.get("fraction")
    bar = "" if fraction is None else f'<progress max="1" value="{float(fraction):.4f}"></progress> '
    return f'<td class="progress">{bar}{escape(progress_text(progress))}</td>'


def invocations_table(summaries: Sequence[Mapping[str, Any]], section: str = "invocations",
                      empty: str = "No invocations yet.") -> str:
    """Rows of invocation summaries (`toolexec.usecases.status.invocation_summary`)."""
    rows = (f'<tr data-invocation="{escape(v["invocation_id"])}">'
            + _invocation_cell(v["invocation_id"]) + _cell(v["tool_id"]) + _cell(v["version"])
            + _cell(v["status"], f"status {v['status']}") + _progress_cell(v.get("progress"))
            + _cell(_latency(v["duration_ms"]))
            + _cell(v["error_code"] or "") + _cell(v["updated_at"]) + "</tr>"
            for v in summaries)
    return _table(section, INVOCATION_COLUMNS, rows, empty)


def pending_section(count: int, summaries: Sequence[Mapping[str, Any]]) -> str:
    shown = f" (the oldest {len(summaries)} shown)" if count > len(summaries) else ""
    return (f'<p><span id="pending-count">{count}</span> invocation(s) not ended{shown}.</p>'
            + invocations_table(summaries, "pending", "Nothing pending."))


APPROVAL_COLUMNS = ("invocation", "tool", "version", "agent", "expires", "call hash")


def approvals_table(approvals: Sequence[Mapping[str, Any]]) -> str:
    """Rows of pending approvals (`toolexec.usecases.status.approval_summary`)."""
    rows = (f'<tr data-invocation="{escape(a["invocation_id"])}">'
            + _invocation_cell(a["invocation_id"]) + _cell(a["tool_id"]) + _cell(a["version"])
            + _cell(a["subject"] or "") + _cell(a["expires_at"])
            + f'<td><code>{escape(str(a["call_hash"]))}</code></td></tr>'
            for a in approvals)
    return _table("approvals", APPROVAL_COLUMNS, rows, "No call waits for an approver.")


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
                  + _cell(r["type"]) + _invocation_cell(r["invocation_id"]) + _cell(r["tool_id"])
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


def _head(title: str) -> str:
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{escape(title)}</title>"
            f'<meta name="viewport" content="width=device-width"><style>{STYLE}</style>')


CHARTS = ('<section id="traffic"><h2>Last hour, per tool</h2>'
          '<p class="empty" id="traffic-note">Charts load with the first refresh.</p>'
          '<div class="legend" id="legend"></div><div class="charts">'
          '<figure><figcaption>invocations ended /s</figcaption>'
          '<svg class="chart" id="chart-rate" role="img" aria-label="invocations per second">'
          "</svg></figure>"
          '<figure><figcaption>latency p50 (solid) / p95 (dashed), ms</figcaption>'
          '<svg class="chart" id="chart-latency" role="img" aria-label="latency"></svg></figure>'
          '<figure><figcaption>error rate, % of ended (cancellations excluded)</figcaption>'
          '<svg class="chart" id="chart-errors" role="img" aria-label="error rate"></svg>'
          "</figure></div></section>")


def render(*, snapshot: Mapping[str, Any], tools: Sequence[Mapping[str, Any]],
           filters: AuditFilters, audit_rows: Sequence[Mapping[str, Any]] | None,
           viewer: Viewer | None = None) -> str:
    """The whole status page; `snapshot` is `toolexec.usecases.status.status_snapshot`'s."""
    pending = snapshot["pending"]
    return (
        _head("toolexec status") + f'<script src="{SCRIPT_PATH}" defer></script></head>'
        f"<body><h1>toolexec status</h1>{viewer_line(viewer)}"
        '<p><a href="/docs">API (OpenAPI)</a> · <a href="/asyncapi.json">events (AsyncAPI)</a>'
        ' · <a href="/health">health</a> · <a href="/metrics">metrics</a> · '
        '<a href="/status.json">status as JSON</a> · '
        f'<span id="live">as of {escape(snapshot["generated_at"])}</span></p>'
        f"{CHARTS}"
        f'<section id="invocations"><h2>Recent invocations</h2>'
        f'<div id="invocations-body">{invocations_table(snapshot["invocations"])}</div></section>'
        f'<section id="pending"><h2>Pending work</h2><div id="pending-body">'
        f'{pending_section(pending["count"], pending["invocations"])}</div></section>'
        f'<section id="approvals"><h2>Waiting for approval</h2><div id="approvals-body">'
        f'{approvals_table(snapshot["approvals"])}</div></section>'
        f'<section id="circuits"><h2>Circuit breakers</h2><div id="circuits-body">'
        f'{circuits_table(snapshot["circuits"])}</div></section>'
        f'<section id="registry"><h2>Registry ({len(tools)} tools)</h2>'
        f"{registry_table(tools)}</section>"
        f'<section id="audit"><h2>Audit search</h2>{audit_section(filters, audit_rows)}'
        "</section></body></html>"
    )


def _event_data(record: Mapping[str, Any]) -> str:
    data = json.dumps(record["event"].get("data"), indent=1, ensure_ascii=False)
    return data if len(data) <= 4000 else data[:4000] + "\n…"


def _since_first(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each record's time after the first one's, e.g. "+12.5 ms"."""
    try:
        times = [datetime.fromisoformat(r["time"]) for r in records]
    except ValueError:
        return ["" for _ in records]
    return [f"+{(t - times[0]).total_seconds() * 1000:.1f} ms" for t in times]


def timeline_table(records: Sequence[Mapping[str, Any]]) -> str:
    rows = (f'<tr data-event="{escape(str(r["event_id"]))}">' + _cell(r["time"], "time")
            + _cell(elapsed) + _cell(r["type"])
            + _cell(f"{r['topic']}/{r['partition']}@{r['offset']}")
            + f"<td><pre>{escape(_event_data(r))}</pre></td></tr>"
            for r, elapsed in zip(records, _since_first(records), strict=True))
    return _table("timeline", ("time", "after", "type", "position", "data"), rows,
                  "No audit record of this invocation yet.")


def invocation_page(view: InvocationView, records: Sequence[Mapping[str, Any]],
                    viewer: Viewer | None = None) -> str:
    """One invocation: its summary and the timeline of its audit records."""
    facts = {"tool": view.tool_id, "version": view.version or view.version_range,
             "status": view.status, "latency": _latency(view.duration_ms),
             "attempts": view.attempts, "subject": view.subject,
             "requested by": view.requested_by, "requested at": view.requested_at,
             "finished at": view.finished_at,
             "error": f"{view.error.code} ({view.error.stage}): {view.error.message}"
             if view.error else None,
             "result": view.result_summary,
             "progress": progress_text(view.progress.model_dump()) if view.progress else None,
             "checkpoints": f"{view.checkpoints.count} ({view.checkpoints.stored_bytes} of "
                            f"{view.checkpoints.bytes} bytes stored)"
             if view.checkpoints.count else None}
    summary = "".join(f"<dt>{escape(name)}</dt><dd>{escape(str(value))}</dd>"
                      for name, value in facts.items() if value not in (None, ""))
    json_link = f"/v1/audit?{urlencode({'invocation': view.invocation_id, 'limit': 1000})}"
    return (
        _head(f"invocation {view.invocation_id}") + "</head><body>"
        f'<p><a href="/">← status</a></p>{viewer_line(viewer)}'
        f'<h1>Invocation <code id="invocation-id">{escape(view.invocation_id)}</code></h1>'
        f'<dl id="summary">{summary}</dl>'
        f'<section id="timeline"><h2>Timeline ({len(records)} events)</h2>'
        f'<p><a href="{escape(json_link)}">as JSON</a></p>{timeline_table(records)}</section>'
        "</body></html>")


def problem_page(title: str, problem: str) -> str:
    """A page saying why nothing is shown (e.g. an unknown invocation)."""
    return (_head(title) + '</head><body><p><a href="/">← status</a></p>'
            f'<h1>{escape(title)}</h1><p id="problem">{escape(problem)}</p></body></html>')
