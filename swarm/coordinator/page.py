"""The coordinator's status page: ``GET /`` serves one self-contained HTML page.

The page holds no data: its script polls ``GET /v1/fleet`` once a second and draws the
same view as ``swarm status`` (:func:`swarm.status.summarize`): per artifact, nodes
complete and in progress, bytes by source, S3 bytes saved, median and p99 fetch time;
per node, a bar split by the source of its bytes (peers, S3, UDP, not yet), with
state, rate and ETA. When ``/v1/fleet`` fails it keeps the last view under a banner.

Above that, a chart of the last minutes from ``GET /v1/timeline`` (polled every
:data:`TIMELINE_POLL_MS`): the fleet's download rate by source and the nodes holding a
complete copy, sampled by a background task into a ring buffer
(:mod:`swarm.coordinator.timeline`) from the reports the coordinator keeps anyway.

Everything is inline (no CDN, no fonts, no images): a fleet's private subnet often has
no route to the internet, and the page must still work there. The chart is uPlot
(MIT), vendored in ``static/`` and inlined into the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Final

from aiohttp import web

from swarm.coordinator.handlers import CLOCK, STORE
from swarm.coordinator.timeline import SAMPLE_PERIOD, NodeSample, Timeline

log = logging.getLogger(__name__)

PATH: Final = "/"
TIMELINE_PATH: Final = "/v1/timeline"
TIMELINE: Final = web.AppKey("timeline", Timeline)
TIMELINE_POLL_MS: Final = 2000
"""How often the page reads the timeline (its samples are 1 s apart)."""
UPLOT_VERSION: Final = "1.6.32"
"""The vendored uPlot (``static/README.md`` says how to update it)."""

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
.summary, .rates-now { margin: 2px 0 8px; color: var(--muted); }
.summary b, .rates-now b { color: var(--ink); font-weight: 600; }
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
#timeline { padding: 12px 20px 0; }
#timeline section { margin-bottom: 0; }
#chart { min-height: 240px; }
#chart .u-legend { font-size: 12px; }
</style>
<style>/* uPlot UPLOT_VERSION (MIT, static/uPlot.LICENSE) */
UPLOT_CSS</style>
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
<div id="timeline"><section>
  <h2>Fleet download rate <small id="chart-caption">by source, last minutes</small></h2>
  <div class="rates-now" id="chart-now"></div>
  <div id="chart"></div>
</section></div>
<main id="fleet"></main>
<script>/* uPlot UPLOT_VERSION (MIT, static/uPlot.LICENSE): vendored from npm */
UPLOT_JS</script>
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

// -- the chart of the last minutes (GET /v1/timeline) --------------------------------
const TIMELINE_POLL_MS = TIMELINE_POLL_VALUE;
let chart = null;

function cssColour(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function rateText(v) { return v === null || v === undefined ? "-" : (v).toFixed(1) + " MB/s"; }

function makeChart(box, data) {
  const line = (label, colour) => ({ label: label, stroke: cssColour(colour), width: 2,
    scale: "rate", value: (u, v) => rateText(v), points: { show: false } });
  return new uPlot({
    width: Math.max(320, box.clientWidth), height: 220,
    cursor: { drag: { x: false, y: false } },
    series: [
      {},
      line("peers", "--peers"), line("S3", "--s3"), line("UDP", "--udp"),
      { label: "nodes complete", stroke: cssColour("--ink"), width: 1.5, dash: [5, 4],
        scale: "count", paths: uPlot.paths.stepped({ align: 1 }), points: { show: false },
        value: (u, v) => (v === null || v === undefined ? "-" : String(v)) },
    ],
    scales: {
      x: { time: true },
      rate: { range: (u, lo, hi) => [0, Math.max(1, hi * 1.1)] },
      count: { range: (u, lo, hi) => [0, Math.max(1, hi + 1)] },
    },
    axes: [
      {},
      { scale: "rate", label: "MB/s", size: 60 },
      { scale: "count", side: 1, label: "nodes complete", grid: { show: false }, size: 50,
        values: (u, ticks) => ticks.map((t) => (Number.isInteger(t) ? String(t) : "")) },
    ],
  }, data, box);
}

function drawTimeline(tl) {
  const mb = (xs) => (xs || []).map((v) => v / 1e6);
  const data = [tl.t || [], mb(tl.peers), mb(tl.s3), mb(tl.udp), tl.complete || []];
  const box = document.getElementById("chart");
  if (chart === null) chart = makeChart(box, data);
  else chart.setData(data);
  const n = data[0].length;
  const last = (i) => (n ? data[i][n - 1] : null);
  const minutes = Math.round((n ? data[0][n - 1] - data[0][0] : 0) / 60);
  document.getElementById("chart-caption").textContent =
    "by source, last " + (minutes < 1 ? "minute" : minutes + " minutes");
  const now = el("span", {}, "now: ");
  SOURCES.forEach(([key, label], i) => {
    if (i) now.append(" \u00b7 ");
    now.append(el("b", { textContent: rateText(last(i + 1)) }), " from " + label);
  });
  now.append(" \u00b7 ", el("b", { textContent: String(n ? last(4) : 0) }), " nodes complete");
  document.getElementById("chart-now").replaceChildren(now);
}

async function tickTimeline() {
  try {
    const token = new URLSearchParams(location.hash.slice(1)).get("token");
    const headers = token ? { Authorization: "Bearer " + token } : {};
    const response = await fetch("TIMELINE_PATH_VALUE", { cache: "no-store", headers });
    if (response.ok) drawTimeline(await response.json());
  } catch (error) {
    // the fleet view's banner says when the coordinator cannot be read
  } finally {
    setTimeout(tickTimeline, TIMELINE_POLL_MS);
  }
}

window.addEventListener("resize", () => {
  const box = document.getElementById("chart");
  if (chart !== null) chart.setSize({ width: Math.max(320, box.clientWidth), height: 220 });
});

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
tickTimeline();
</script>
</body>
</html>
"""


def _static(name: str) -> str:
    return resources.files("swarm.coordinator").joinpath("static", name).read_text()


def _page() -> str:
    """STATUS_PAGE with uPlot and the constants filled in (once, at import)."""
    js = _static("uPlot.iife.min.js")
    if "</script" in js.lower():  # would end the inline script early
        raise RuntimeError("the vendored uPlot contains '</script': it cannot be inlined")
    return (
        STATUS_PAGE.replace("UPLOT_VERSION", UPLOT_VERSION)
        .replace("TIMELINE_POLL_VALUE", str(TIMELINE_POLL_MS))
        .replace("TIMELINE_PATH_VALUE", TIMELINE_PATH)
        .replace("UPLOT_CSS", _static("uPlot.min.css"))
        .replace("UPLOT_JS", js)
    )


PAGE: Final = _page()


async def _status_page(request: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html", headers=HEADERS)


async def _timeline(request: web.Request) -> web.Response:
    return web.json_response(request.app[TIMELINE].to_json())


def sample_fleet(app: web.Application) -> None:
    """Take one timeline sample from the coordinator's node reports (none without a
    store: an app that serves the page alone)."""
    if STORE not in app:
        return
    now = app[CLOCK]()
    app[TIMELINE].sample(
        now,
        (
            NodeSample(state.report.node, state.last_seen, state.report.artifacts)
            for state in app[STORE].nodes(now)
        ),
    )


def _sampler(period: float) -> Callable[[web.Application], AsyncIterator[None]]:
    async def context(app: web.Application) -> AsyncIterator[None]:
        async def forever() -> None:
            while True:
                try:
                    sample_fleet(app)
                except Exception:  # the chart is a view: never take the coordinator down
                    log.exception("timeline sample failed; retrying in %ss", period)
                await asyncio.sleep(period)

        task = asyncio.create_task(forever())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return context


def add_routes(app: web.Application, sample_period: float = SAMPLE_PERIOD) -> None:
    """Register ``GET /`` (and ``HEAD /``), the fleet status page, and ``GET
    /v1/timeline``, its chart's data (behind the fleet token like ``/v1/fleet``), with
    the background task that samples the fleet every ``sample_period`` seconds."""
    app[TIMELINE] = Timeline(period=sample_period)
    app.router.add_get(PATH, _status_page)
    app.router.add_get(TIMELINE_PATH, _timeline)
    app.cleanup_ctx.append(_sampler(sample_period))
