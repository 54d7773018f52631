"""The coordinator's status page (``GET /``) in a real headless Chromium, against a real
coordinator on loopback fed real ``/v1/report`` bodies.

Chromium runs as a one-shot command (``--dump-dom`` for the DOM after the page's script
ran, ``--screenshot`` for what a person sees); the PNG is decoded with the stdlib. The
browser tests skip when no Chromium is installed (Debian: ``apt-get install chromium
fonts-liberation``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import struct
import subprocess
import threading
import time
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from swarm.coordinator.app import make_app
from swarm.coordinator.page import TIMELINE, UPLOT_VERSION, add_routes
from swarm.coordinator.timeline import NodeSample
from tests.servers import wait_until

STATIC = Path(__file__).resolve().parents[2] / "swarm" / "coordinator" / "static"

MIB = 1 << 20
INFO_HASH = "0123456789abcdef0123456789abcdef01234567"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chromium-headless-shell")
WINDOW = (1200, 800)
CHROMIUM_TIMEOUT = 90.0

SOURCE_COLOURS = {"peers": (0x2E, 0x9D, 0x5B), "s3": (0xE8, 0x89, 0x1C), "udp": (0x3A, 0x72, 0xD8)}
"""The page's CSS colours for each source (``--peers``, ``--s3``, ``--udp``)."""


# -- a real coordinator on loopback -------------------------------------------------------


@contextlib.contextmanager
def serve(app: web.Application) -> Iterator[str]:
    """Run ``app`` on 127.0.0.1, an ephemeral port, in a background event loop."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="coordinator", daemon=True)
    thread.start()
    runner = web.AppRunner(app, access_log=None)

    async def start() -> int:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner.addresses[0][1]

    try:
        port = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def with_page(app: web.Application) -> web.Application:
    """Add the page unless ``make_app`` already does (once it calls ``add_routes``)."""
    if not any(r.method == "GET" and r.resource.canonical == "/" for r in app.router.routes()):
        add_routes(app)
    return app


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[str]:
    with serve(with_page(make_app(db_path=tmp_path / "history.db"))) as url:
        yield url


def post_report(url: str, node: str, port: int, **artifact: object) -> None:
    item: dict[str, object] = {
        "info_hash": INFO_HASH,
        "name": "index.db",
        "size": 64 * MIB,
        "have_bytes": 0,
        "complete": False,
        "bytes_by_source": {},
        "down_rate": 0.0,
        "up_rate": 0.0,
        **artifact,
    }
    body = {"node": node, "addr": f"127.0.0.1:{port}", "artifacts": [item]}
    request = urllib.request.Request(
        url + "/v1/report",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert json.loads(response.read())["ok"] is True


def report_three_nodes(url: str) -> None:
    """One node done (peers + S3), one mid-way (peers + S3), one early (S3 + UDP)."""
    post_report(
        url,
        "node-a",
        6881,
        have_bytes=64 * MIB,
        complete=True,
        elapsed=12.5,
        bytes_by_source={"peers": 48 * MIB, "s3": 16 * MIB, "udp": 0},
        up_rate=4.0 * MIB,
    )
    post_report(
        url,
        "node-b",
        6882,
        have_bytes=38 * MIB,
        bytes_by_source={"peers": 30 * MIB, "s3": 8 * MIB},
        down_rate=20.0 * MIB,
        up_rate=1.0 * MIB,
    )
    post_report(
        url,
        "node-c",
        6883,
        have_bytes=13 * MIB,
        bytes_by_source={"s3": 6 * MIB, "udp": 7 * MIB},
        down_rate=5.0 * MIB,
    )


# -- Chromium, one shot per view ------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium_bin() -> str:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(
        f"no Chromium on PATH (tried {', '.join(CHROMIUM_NAMES)}): "
        "on Debian, apt-get install -y chromium fonts-liberation"
    )


def chromium(binary: str, tmp_path: Path, url: str, *mode: str) -> bytes:
    """Load ``url`` headless, let its script run for 5 s of virtual time, return stdout."""
    args = [
        binary,
        "--headless",
        "--no-sandbox",  # tests run as root in CI; the sandbox refuses root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--no-proxy-server",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        # Virtual time runs the page's 1 s polling several times without waiting for it.
        "--virtual-time-budget=5000",
        *mode,
        url,
    ]
    result = subprocess.run(
        args, capture_output=True, timeout=CHROMIUM_TIMEOUT, check=False, cwd=tmp_path
    )
    assert result.returncode == 0, f"chromium failed: {result.stderr.decode()[-2000:]}"
    return result.stdout


def read_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB(A) non-interlaced PNG -> (width, height, rows of RGB pixels)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    assert header is not None, "PNG without IHDR"
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in (2, 6) and not interlace, f"unexpected PNG {header}"
    bpp = 3 if colour_type == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    assert len(raw) == height * (stride + 1), "truncated PNG data"
    prev = bytearray(stride)
    rows = []
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        unfilter(kind, line, prev, bpp)
        rows.append(b"".join(bytes(line[x : x + 3]) for x in range(0, stride, bpp)))
        prev = line
    return width, height, rows


def unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> None:
    """Undo one row's PNG filter in place (PNG spec, section 9.2)."""
    if kind == 1:
        for i in range(bpp, len(line)):
            line[i] = (line[i] + line[i - bpp]) & 0xFF
    elif kind == 2:
        line[:] = bytes((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
    elif kind == 3:
        for i in range(len(line)):
            left = line[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + (left + prev[i]) // 2) & 0xFF
    elif kind == 4:
        for i in range(len(line)):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            predictor = a if pa <= pb and pa <= pc else b if pb <= pc else c
            line[i] = (line[i] + predictor) & 0xFF
    else:
        assert kind == 0, f"bad PNG filter type {kind}"


def colours(rows: list[bytes]) -> set[tuple[int, int, int]]:
    return {(row[x], row[x + 1], row[x + 2]) for row in rows for x in range(0, len(row), 3)}


def near(colour: tuple[int, int, int], seen: set[tuple[int, int, int]], slack: int = 4) -> bool:
    return any(all(abs(a - b) <= slack for a, b in zip(colour, c, strict=True)) for c in seen)


# -- tests -------------------------------------------------------------------------------------


def test_page_is_self_contained_html(coordinator: str) -> None:
    with urllib.request.urlopen(coordinator + "/", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/html")
        assert "connect-src 'self'" in response.headers["Content-Security-Policy"]
        page = response.read().decode()
    assert "/v1/fleet" in page and "/v1/timeline" in page
    # uPlot is inlined verbatim from the vendored files, with its licence beside them
    vendored_js = (STATIC / "uPlot.iife.min.js").read_text()
    vendored_css = (STATIC / "uPlot.min.css").read_text()
    assert vendored_js in page and vendored_css in page
    assert (
        f"(v{UPLOT_VERSION})" in vendored_js and UPLOT_VERSION in (STATIC / "README.md").read_text()
    )
    assert "MIT License" in (STATIC / "uPlot.LICENSE").read_text()
    # No CDN, font or image from elsewhere: a fleet's subnet may have no internet.
    # (uPlot's banner comment names its repository: that is text, not a request.)
    ours = page.replace(vendored_js, "").replace(vendored_css, "")
    for reference in ("http://", "https://", "src=", "href=", "@import", "url("):
        assert reference not in ours, f"page references an outside resource: {reference!r}"
    for reference in ("src=", "href=", "@import", "url(", "fetch(", "XMLHttpRequest"):
        assert reference not in vendored_js + vendored_css, f"uPlot loads something: {reference}"


def test_timeline_follows_real_reports(coordinator: str) -> None:
    """Two reports of one node: the background sampler turns the bytes between them into
    a rate by source, over the interval between the reports, and the completion into a
    count."""

    def latest() -> dict:
        with urllib.request.urlopen(coordinator + "/v1/timeline", timeout=10) as response:
            return json.loads(response.read())

    first_sent = time.monotonic()
    post_report(coordinator, "node-a", 6881, bytes_by_source={"peers": 0, "s3": 0})
    first_done = time.monotonic()
    wait_until(lambda: (latest()["nodes"] or [0])[-1] == 1, 10, "a sample with node-a")
    second_sent = time.monotonic()
    post_report(
        coordinator,
        "node-a",
        6881,
        have_bytes=64 * MIB,
        complete=True,
        bytes_by_source={"peers": 48 * MIB, "s3": 16 * MIB},
    )
    second_done = time.monotonic()
    wait_until(lambda: (latest()["complete"] or [0])[-1] == 1, 10, "a sample of its completion")
    body = latest()
    peers, s3 = body["peers"][-1], body["s3"][-1]
    assert body["udp"][-1] == 0
    assert peers == pytest.approx(3 * s3, rel=1e-3)  # 48 MiB vs 16 MiB in one interval
    # the rate is over the time between the two reports as the coordinator got them
    assert 48 * MIB / (second_done - first_sent) <= peers * 1.001
    assert peers <= 48 * MIB / (second_sent - first_done) * 1.001


def test_page_renders_fleet(
    coordinator: str, chromium_bin: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report_three_nodes(coordinator)

    dom = chromium(chromium_bin, tmp_path, coordinator + "/", "--dump-dom").decode()
    for node in ("node-a", "node-b", "node-c"):
        assert f"<b>{node}</b>" in dom, f"{node} missing from the rendered page"
    assert "<h2>index.db " in dom
    # The summary line: the same figures as `swarm status`.
    summary = dom[dom.index('class="summary"') :]
    summary = summary[: summary.index("</div>")]
    for figure in (
        "<b>1</b> complete",
        "<b>2</b> in progress",
        "<b>78.0 MiB</b> from peers",
        "<b>30.0 MiB</b> from S3",
        "<b>7.0 MiB</b> from UDP",
        "<b>162.0 MiB</b> S3 saved",  # 3 nodes x 64 MiB - 30 MiB read from S3
        "<b>12.5s</b> median",
    ):
        assert figure in summary, f"{figure!r} not in {summary!r}"
    assert "fetching" in dom and "complete" in dom
    assert "1.3s" in dom  # node-b's ETA: 26 MiB left at 20 MiB/s
    error = dom[dom.index('id="error"') :]
    assert error[: error.index(">")].endswith('style="display: none;"'), "error banner shown"

    shot = tmp_path / "status-page.png"
    chromium(chromium_bin, tmp_path, coordinator + "/", f"--screenshot={shot}")
    width, height, rows = read_png(shot.read_bytes())
    assert (width, height) == WINDOW
    seen = colours(rows)
    assert len(seen) > 50, f"screenshot looks blank: {len(seen)} colours"
    for source, colour in SOURCE_COLOURS.items():
        assert near(colour, seen), f"no {source} segment drawn in the bars ({colour})"
    with capsys.disabled():
        print(f"\nstatus page screenshot: {shot}")


def feed_timeline(app: web.Application, now: float) -> None:
    """Five minutes of a scale-out, sampled every second: S3 first, then the swarm
    takes over, UDP for one far node; nodes complete one after another."""
    timeline = app[TIMELINE]
    counts = {"peers": 0, "s3": 0, "udp": 0}
    for step in range(300):
        t = now - 300 + step
        counts["s3"] += (40 if step < 60 else 8) * MIB
        counts["peers"] += (0 if step < 30 else 90) * MIB
        counts["udp"] += (15 if 100 <= step < 200 else 0) * MIB
        done = min(8, max(0, (step - 120) // 15))
        nodes = [
            NodeSample(f"node-{i}", t, [_Item(i < done, dict(counts) if i == 0 else {})])
            for i in range(8)
        ]
        timeline.sample(t, nodes)


class _Item:
    info_hash = INFO_HASH

    def __init__(self, complete: bool, bytes_by_source: dict[str, int]) -> None:
        self.complete = complete
        self.bytes_by_source = bytes_by_source


def test_chart_draws_rates_by_source_and_completions(chromium_bin: str, tmp_path: Path) -> None:
    """The chart alone (an empty fleet: no node bars), from a timeline of five minutes."""

    async def empty_fleet(request: web.Request) -> web.Response:
        return web.json_response({"nodes": [], "artifacts": [], "report_interval": 1})

    app = web.Application()
    app.router.add_get("/v1/fleet", empty_fleet)
    add_routes(app)
    feed_timeline(app, time.time())
    with serve(app) as url:
        dom = chromium(chromium_bin, tmp_path, url + "/", "--dump-dom").decode()
        shot = tmp_path / "chart.png"
        chromium(chromium_bin, tmp_path, url + "/", f"--screenshot={shot}")
    assert 'class="uplot' in dom and "<canvas" in dom
    legend = dom[dom.index("u-legend") :]
    for label in ("peers", "S3", "UDP", "nodes complete"):
        assert f">{label}<" in legend, f"no {label} series in the chart's legend"
    now = dom[dom.index('id="chart-now"') :]
    now = now[: now.index("</div>")]
    for figure in ("<b>94.4 MB/s</b> from peers", "<b>8.4 MB/s</b> from S3",
                   "<b>0.0 MB/s</b> from UDP", "<b>8</b> nodes complete"):  # fmt: skip
        assert figure in now, f"{figure!r} not in {now!r}"
    assert "last 5 minutes" in dom
    _, _, rows = read_png(shot.read_bytes())
    seen = colours(rows)
    for source, colour in SOURCE_COLOURS.items():  # no bars on this page: these are lines
        assert near(colour, seen, slack=12), f"no {source} line drawn in the chart ({colour})"


def test_page_shows_error_banner_when_fleet_fails(chromium_bin: str, tmp_path: Path) -> None:
    async def unavailable(request: web.Request) -> web.Response:
        return web.json_response({"error": "down for the test"}, status=503)

    app = web.Application()
    app.router.add_get("/v1/fleet", unavailable)
    add_routes(app)
    with serve(app) as url:
        dom = chromium(chromium_bin, tmp_path, url + "/", "--dump-dom").decode()
    banner = dom[dom.index('id="error"') :]
    banner = banner[: banner.index("</div>")]
    assert 'style="display: block;"' in banner
    assert "Cannot read /v1/fleet" in banner and "HTTP 503" in banner
