"""The coordinator's status page: ``GET /`` serves one self-contained HTML page.

The page holds no data: its script polls ``GET /v1/fleet`` once a second and draws the
same view as ``swarm status`` (:func:`swarm.status.summarize`): per artifact, nodes
complete and in progress, bytes by source, S3 bytes saved, median and p99 fetch time;
per node, a bar split by the source of its bytes (peers, S3, UDP, not yet), with
state, rate and ETA. When ``/v1/fleet`` fails it keeps the last view under a banner.

Everything is inline (no CDN, no fonts, no images): a fleet's private subnet often has
no route to the internet, and the page must still work there.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

PATH: Final = "/"

HEADERS: Final = {
    # Always fetch the current page after an upgrade; the data is polled anyway.
    "Cache-Control": "no-cache",
    # Inline script and style only, and no request but to this coordinator.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:"
    ),
    "X-Content-Type-Options": "nosniff",
}

STATUS_PAGE: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>swarm fleet</title>
<style>
:root { --peers: #2e9d5b; --s3: #e8891c; --udp: #3a72d8; --other: #9272c4;
        --left: #e3e7eb; --ink: #1c232b; --muted: #66717c; }
body { margin: 0; background: #f5f6f8; color: var(--ink);
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
header { display: flex; align-items: baseline; gap: 16px; padding: 10px 20px;
         background: var(--ink); color: #fff; }
header h1 { margin: 0; font-size: 18px; }
#updated { color: #aeb8c2; flex: 1; }
.legend span { margin-left: 12px; white-space: nowrap; }
.legend span::before { content: ""; display: inline-block; width: 10px; height: 10px;
                       margin-right: 5px; border-radius: 2px; background: var(--c); }
#error { display: none; padding: 8px 20px; background: #c62828; color: #fff;
         font-weight: 600; }
main { padding: 12px 20px; }
section { margin-bottom: 14px; padding: 10px 14px; background: #fff;
          border: 1px solid #dce1e6; border-radius: 6px; }
h2 { margin: 0; font-size: 16px; }
h2 small { color: var(--muted); font-weight: normal; }
.summary { margin: 2px 0 8px; color: var(--muted); }
.summary b { color: var(--ink); font-weight: 600; }
table { width: 100%; border-collapse: collapse; }
th { color: var(--muted); font-size: 12px; font-weight: 600; text-align: left; }
td, th { padding: 3px 12px 3px 0; white-space: nowrap; }
td.bar-cell { width: 100%; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
.addr { color: var(--muted); font-size: 12px; margin-left: 6px; }
.bar { display: flex; height: 14px; min-width: 200px; overflow: hidden;
       border-radius: 3px; background: var(--left); }
.bar i { display: block; height: 100%; }
.complete { color: var(--peers); font-weight: 600; }
.fetching { color: #b36a00; font-weight: 600; }
tr.silent td { opacity: .5; }
.empty { color: var(--muted); }
</style>
</head>
<body>
<header>
  <h1>swarm fleet</h1>
  <span id="updated">connecting&hellip;</span>
  <span class="legend">
    <span style="--c: var(--peers)">peers</span><span style="--c: var(--s3)">S3</span
    ><span style="--c: var(--udp)">UDP</span><span style="--c: var(--other)">other</span
    ><span style="--c: var(--left)">not yet</span>
  </span>
</header>
<div id="error" role="alert"></div>
<main id="fleet"></main>
<script>
"use strict";
// Mirrors swarm/status.py summarize(): keep the two in step.
const SOURCES = [["peers", "peers"], ["s3", "S3"], ["udp", "UDP"]];
const ACTIVE_RATE = 1024;  // bytes/s above which a source counts as in use
const POLL_MS = 1000;
const COLUMNS = [["node"], ["bytes by source"], ["held", "num"], ["state"], ["down", "num"],
                 ["up", "num"], ["ETA", "num"], ["sources"]];
let lastOk = null;

function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  Object.assign(node, attrs || {});
  node.append(...kids.filter((k) => k !== null && k !== undefined));
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

function secs(s) {
  if (s === null || s === undefined) return "-";
  if (s < 120) return s.toFixed(1) + "s";
  return Math.floor(s / 60) + "m" + String(Math.round(s % 60)).padStart(2, "0") + "s";
}

function summarizeArtifact(a) {
  const by = a.bytes_by_source || {};
  const size = a.size || 0;
  const h = a.history || {};
  const nodes = a.nodes || 0;
  return {
    name: a.name || a.info_hash.slice(0, 12), size: size, by: by,
    complete: a.nodes_complete || 0, inProgress: nodes - (a.nodes_complete || 0),
    s3Saved: size ? Math.max(0, nodes * size - (by.s3 || 0)) : null,
    total: h.completed || 0, median: h.median_seconds, p99: h.p99_seconds,
  };
}

function summarizeNode(node, item) {
  const rates = item.rates || {};
  const down = (item.down_rate || 0) + (rates.s3 || 0);
  const left = item.size - item.have_bytes;
  return {
    state: item.complete ? "complete" : "fetching", progress: item.progress || 0,
    down: down, up: item.up_rate || 0, mode: item.mode,
    sources: Object.keys(rates).filter((s) => rates[s] > ACTIVE_RATE).sort(),
    eta: item.complete || down <= 0 ? null : left / down,
  };
}

// Bar segments as fractions of the artifact: the bytes held, split in proportion to
// the bytes each source delivered (which can exceed what is held: discarded pieces).
function segments(item) {
  const by = item.bytes_by_source || {};
  const held = item.size > 0 ? Math.min(item.have_bytes / item.size, 1) : 1;
  const known = SOURCES.map(([key]) => key);
  const parts = SOURCES.map(([key, label]) => [key, label, by[key] || 0]);
  const other = Object.keys(by).filter((k) => !known.includes(k))
    .reduce((sum, k) => sum + by[k], 0);
  parts.push(["other", "other", other]);
  const total = parts.reduce((sum, p) => sum + p[2], 0);
  if (total === 0) parts[3][2] = 1;  // held bytes of unknown origin (resumed)
  const scale = held / (total || 1);
  return parts.map(([key, label, n]) => [key, label, n * scale, n]);
}

function bar(item) {
  const out = el("div", { className: "bar" });
  for (const [key, label, share, n] of segments(item)) {
    if (share <= 0) continue;
    const seg = el("i", { title: label + ": " + bytes(n) });
    seg.style.width = (share * 100).toFixed(3) + "%";
    seg.style.background = "var(--" + key + ")";
    out.append(seg);
  }
  return out;
}

function summaryLine(s) {
  const parts = [
    [String(s.complete), " complete, "], [String(s.inProgress), " in progress"],
    ...SOURCES.map(([key, label]) => [bytes(s.by[key] || 0), " from " + label]),
    [bytes(s.s3Saved), " S3 saved"], [secs(s.median), " median"], [secs(s.p99), " p99"],
    [String(s.total), " done in history"],
  ];
  const line = el("div", { className: "summary" });
  parts.forEach(([value, text], i) => {
    if (i > 1) line.append(" \\u00b7 ");
    line.append(el("b", { textContent: value }), text);
  });
  return line;
}

function nodeRow(node, item, interval) {
  const n = summarizeNode(node, item);
  const silent = node.age > 3 * interval;
  const state = n.state + (silent ? " (silent " + Math.round(node.age) + "s)" : "");
  const how = [n.sources.join("+"), n.mode].filter(Boolean).join(" \\u00b7 ");
  return el("tr", { className: silent ? "silent" : "" },
    el("td", {}, el("b", { textContent: node.node }),
       el("span", { className: "addr", textContent: node.addr || "" })),
    el("td", { className: "bar-cell" }, bar(item)),
    el("td", { className: "num", textContent: (n.progress * 100).toFixed(0) + "%" }),
    el("td", { className: n.state, textContent: state }),
    el("td", { className: "num", textContent: bytes(n.down) + "/s" }),
    el("td", { className: "num", textContent: bytes(n.up) + "/s" }),
    el("td", { className: "num", textContent: n.state === "complete" ? "" : secs(n.eta) }),
    el("td", { textContent: how }));
}

function render(fleet) {
  const nodes = fleet.nodes || [];
  const sections = (fleet.artifacts || []).map((a) => {
    const s = summarizeArtifact(a);
    const rows = [];
    for (const node of nodes) {
      for (const item of node.artifacts || []) {
        if (item.info_hash === a.info_hash) {
          rows.push(nodeRow(node, item, fleet.report_interval || 1));
        }
      }
    }
    const head = el("tr", {}, ...COLUMNS.map(([t, cls]) => el("th", { className: cls || "",
      textContent: t })));
    return el("section", { id: "artifact-" + a.info_hash },
      el("h2", {}, s.name + " ",
         el("small", { textContent: bytes(s.size) + " \\u00b7 " + a.info_hash.slice(0, 12) })),
      summaryLine(s),
      rows.length ? el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows))
                  : el("div", { className: "empty", textContent: "no node reports it" }));
  });
  if (!sections.length) {
    sections.push(el("p", { className: "empty", textContent:
      "No artifacts yet: nodes appear here once their daemon reports to this coordinator." }));
  }
  document.getElementById("fleet").replaceChildren(...sections);
  document.getElementById("updated").textContent = nodes.length + " node" +
    (nodes.length === 1 ? "" : "s") + " \\u00b7 updated " + new Date().toLocaleTimeString();
}

function showError(message) {
  const banner = document.getElementById("error");
  const since = lastOk ? " Showing data from " +
    Math.round((Date.now() - lastOk) / 1000) + "s ago." : "";
  banner.textContent = "Cannot read /v1/fleet from the coordinator (" + message + ")." +
    since + " Retrying every second.";
  banner.style.display = "block";
}

async function tick() {
  try {
    // A fleet with a secret: open the page as /#token=FLEET_TOKEN (a fragment never
    // reaches server logs); the token goes along as a Bearer header.
    const token = new URLSearchParams(location.hash.slice(1)).get("token");
    const headers = token ? { Authorization: "Bearer " + token } : {};
    const response = await fetch("/v1/fleet", { cache: "no-store", headers });
    if (!response.ok) throw new Error("HTTP " + response.status);
    render(await response.json());
    lastOk = Date.now();
    document.getElementById("error").style.display = "none";
  } catch (error) {
    showError(error.message || String(error));
  } finally {
    setTimeout(tick, POLL_MS);
  }
}

tick();
</script>
</body>
</html>
"""


async def _status_page(request: web.Request) -> web.Response:
    return web.Response(text=STATUS_PAGE, content_type="text/html", headers=HEADERS)


def add_routes(app: web.Application) -> None:
    """Register ``GET /`` (and ``HEAD /``): the fleet status page."""
    app.router.add_get(PATH, _status_page)
