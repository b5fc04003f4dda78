// The status page, live: polls GET /status.json, redraws the tables and the last
// hour's charts. Every value goes into the page as text (textContent, setAttribute),
// never as HTML: tool ids, outputs and parameters are written by whoever calls.
"use strict";
(function () {
  const REFRESH_MS = 3000;
  const SVG = "http://www.w3.org/2000/svg";
  const COLORS = ["#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989",
                  "#0a7ea4", "#57606a"];
  const MOST_TOOLS = 8;

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function table(section, headers, rows, empty) {
    if (!rows.length) return el("p", {"class": "empty", "data-section": section}, empty);
    const t = el("table", {"data-section": section});
    const head = t.appendChild(el("thead")).appendChild(el("tr"));
    headers.forEach((h) => head.appendChild(el("th", {}, h)));
    const body = t.appendChild(el("tbody"));
    rows.forEach((r) => body.appendChild(r));
    return t;
  }

  function invocationLink(id) {
    const td = el("td");
    if (id) td.appendChild(el("a", {href: "/invocations/" + encodeURIComponent(id)}, id));
    return td;
  }

  function progressCell(p) {
    const td = el("td", p ? {"class": "progress"} : {});
    if (!p) return td;
    let text = p.message || "";
    if (p.fraction != null) {
      td.appendChild(el("progress", {max: "1", value: String(p.fraction)}));
      text = Math.round(p.fraction * 100) + "% " + text;
    }
    td.appendChild(document.createTextNode(" " + text.trim()));
    return td;
  }

  function invocationRows(items) {
    return items.map((v) => {
      const tr = el("tr", {"data-invocation": v.invocation_id});
      tr.appendChild(invocationLink(v.invocation_id));
      tr.appendChild(el("td", {}, v.tool_id || ""));
      tr.appendChild(el("td", {}, v.version || ""));
      tr.appendChild(el("td", {"class": "status " + v.status}, v.status));
      tr.appendChild(progressCell(v.progress));
      tr.appendChild(el("td", {}, v.duration_ms == null ? "" : v.duration_ms.toFixed(1) + " ms"));
      tr.appendChild(el("td", {}, v.error_code || ""));
      tr.appendChild(el("td", {}, v.updated_at));
      return tr;
    });
  }

  const COLUMNS = ["invocation", "tool", "version", "status", "progress", "latency", "error",
                   "updated"];

  function replace(id, ...nodes) {
    const box = document.getElementById(id);
    box.replaceChildren(...nodes);
  }

  function drawTables(s) {
    replace("invocations-body",
            table("invocations", COLUMNS, invocationRows(s.invocations), "No invocations yet."));
    const p = s.pending;
    const line = el("p");
    line.appendChild(el("span", {id: "pending-count"}, p.count));
    line.appendChild(document.createTextNode(" invocation(s) not ended" +
      (p.count > p.invocations.length ? " (the oldest " + p.invocations.length + " shown)." : ".")));
    replace("pending-body", line,
            table("pending", COLUMNS, invocationRows(p.invocations), "Nothing pending."));
    const waiting = s.approvals.map((a) => {
      const tr = el("tr", {"data-invocation": a.invocation_id});
      tr.appendChild(invocationLink(a.invocation_id));
      tr.appendChild(el("td", {}, a.tool_id || ""));
      tr.appendChild(el("td", {}, a.version || ""));
      tr.appendChild(el("td", {}, a.subject || ""));
      tr.appendChild(el("td", {}, a.expires_at));
      tr.appendChild(el("td")).appendChild(el("code", {}, a.call_hash));
      return tr;
    });
    replace("approvals-body", table("approvals",
      ["invocation", "tool", "version", "agent", "expires", "call hash"], waiting,
      "No call waits for an approver."));
    const breakers = s.circuits.map((c) => {
      const tr = el("tr", {"data-service": c.service_id});
      tr.appendChild(el("td", {}, c.service_id));
      tr.appendChild(el("td", {"class": "status " + c.state}, c.state));
      tr.appendChild(el("td", {}, c.failure_count));
      tr.appendChild(el("td", {}, c.since));
      tr.appendChild(el("td", {}, c.reason || ""));
      return tr;
    });
    replace("circuits-body", table("circuits", ["service", "state", "failures", "since", "reason"],
      breakers, "No external service has a circuit breaker yet: all closed."));
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    return node;
  }

  // One line chart: series = [{color, dashed, points: [value or null per bucket]}].
  function chart(id, series, buckets, format) {
    const box = document.getElementById(id);
    // Drawn at the box's own size, so text is not stretched.
    const W = box.clientWidth || 600, H = box.clientHeight || 170, L = 48, R = 10, T = 10, B = 20;
    box.setAttribute("viewBox", "0 0 " + W + " " + H);
    const values = series.flatMap((s) => s.points.filter((v) => v != null));
    const top = Math.max(...values, 0) || 1;
    const x = (i) => L + (W - L - R) * (buckets > 1 ? i / (buckets - 1) : 0);
    const y = (v) => T + (H - T - B) * (1 - v / top);
    const nodes = [];
    [0, 0.5, 1].forEach((f) => {
      nodes.push(svg("line", {x1: L, x2: W - R, y1: y(top * f), y2: y(top * f),
                              stroke: "#ddd", "stroke-width": 1}));
      const label = svg("text", {x: L - 4, y: y(top * f) + 4, "text-anchor": "end",
                                 "font-size": 11, fill: "#555"});
      label.textContent = format(top * f);
      nodes.push(label);
    });
    [["-60 min", 0, "start"], ["now", buckets - 1, "end"]].forEach(([text, i, anchor]) => {
      const label = svg("text", {x: x(i), y: H - 4, "text-anchor": anchor, "font-size": 11,
                                 fill: "#555"});
      label.textContent = text;
      nodes.push(label);
    });
    series.forEach((s) => {
      let d = "";
      let pen = false;
      s.points.forEach((v, i) => {
        if (v == null) { pen = false; return; }
        d += (pen ? " L" : " M") + x(i).toFixed(1) + " " + y(v).toFixed(1);
        pen = true;
      });
      if (!d) return;
      const attrs = {d: d.trim(), fill: "none", stroke: s.color, "stroke-width": 2};
      if (s.dashed) attrs["stroke-dasharray"] = "5 3";
      nodes.push(svg("path", attrs));
      s.points.forEach((v, i) => {  // dots, so a lone minute shows
        if (v != null && (v > 0 || !s.dotsAboveZero)) {
          nodes.push(svg("circle", {cx: x(i), cy: y(v), r: 3, fill: s.color}));
        }
      });
    });
    box.replaceChildren(...nodes);
  }

  function drawCharts(traffic) {
    const tools = Object.entries(traffic.tools)
      .map(([tool, buckets]) => [tool, buckets, buckets.reduce((n, b) => n + b.ended, 0)])
      .sort((a, b) => b[2] - a[2]).slice(0, MOST_TOOLS);
    const note = tools.length ? (traffic.endings + " invocation(s) ended in the last hour" +
      (traffic.truncated ? " (the newest " + traffic.endings + " only)" : "") +
      (Object.keys(traffic.tools).length > MOST_TOOLS
        ? "; the " + MOST_TOOLS + " busiest tools shown" : "") + ".")
      : "No invocation ended in the last hour.";
    document.getElementById("traffic-note").textContent = note;
    const legend = tools.map(([tool], i) => {
      const item = el("span", {"data-tool": tool});
      item.appendChild(el("span", {"class": "swatch", style: "background:" + COLORS[i]}));
      item.appendChild(document.createTextNode(tool));
      return item;
    });
    replace("legend", ...legend);
    const buckets = tools.length ? tools[0][1].length : 60;
    const pick = (field, scale = 1) => tools.map(([, b], i) => ({
      color: COLORS[i], points: b.map((x) => x[field] == null ? null : x[field] * scale)}));
    chart("chart-rate", pick("per_second").map((s) => ({...s, dotsAboveZero: true})), buckets,
          (v) => v.toFixed(2));
    chart("chart-latency", pick("p50_ms").concat(
      pick("p95_ms").map((s) => ({...s, dashed: true}))), buckets, (v) => v.toFixed(0));
    chart("chart-errors", pick("error_rate", 100), buckets, (v) => v.toFixed(0) + "%");
  }

  async function refresh() {
    const live = document.getElementById("live");
    try {
      const answer = await fetch("/status.json", {credentials: "same-origin",
                                                  cache: "no-store"});
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      const s = await answer.json();
      drawTables(s);
      drawCharts(s.traffic);
      live.textContent = "live, as of " + s.generated_at;
      live.className = "";
    } catch (error) {
      live.textContent = "not refreshed: " + error.message;
      live.className = "stale";
    }
  }

  refresh();
  setInterval(refresh, REFRESH_MS);
})();
