#!/usr/bin/env python3
"""A picture of config/monitoring/tessera-dashboard.json over a real run, as SVG.

    python3 bench/dashboard.py --prometheus URL --run RUN_JSON [--out SVG]
    python3 bench/dashboard.py --cache QUERIES_JSON --run RUN_JSON [--out SVG]

Not Grafana (Grafana is AGPL and not used here): the dashboard's own panels, laid out
by their gridPos on Grafana's 24-column grid, each target's `expr` run through the
Prometheus HTTP API (/api/v1/query_range, or /api/v1/query for an instant target)
over the run's window, with the template variables at "All" ($namespace, $volume,
$node become `.*`) and $__rate_interval at RATE_INTERVAL. Time series are drawn as
lines with the panel's unit and legendFormat, the table as the rows of its instant
query, rows as bars. A panel whose queries return nothing says so, with the reason
from EMPTY_WHY when this run cannot show it. The answers are kept beside RUN_JSON
(queries.json) so the picture can be drawn again without the server (--cache).
Standard library only; `make dashboard-picture` runs the whole (bench/dashboard.sh).
"""

import json
import math
import os
import re
import sys
import time
import urllib.parse
import urllib.request
from xml.sax.saxutils import escape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(ROOT, "config", "monitoring", "tessera-dashboard.json")
OUT = os.path.join(ROOT, "docs", "figures", "dashboard.svg")

RATE_INTERVAL = "20s"  # $__rate_interval: Grafana's 4 x the 2 s scrape interval, rounded up
POINTS = 150  # samples per series over the window

# Why a panel of this run has no series (shown instead of the plot).
EMPTY_WHY = {}

# What a reader of this run's picture would otherwise misread (shown under the title).
NOTES = {
    "Attach latency (ticket seen to satisfied)": "The step at the takeover is the claimed volume's "
    "ticket satisfied again after its daemon was replaced, timed from when the ticket was first "
    "seen: beyond the top bucket (81.92 s).",
}

# Grafana's classic palette, in its order.
COLOURS = ["#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9", "#705DA0",
           "#508642", "#CCA300", "#447EBC", "#C15C17", "#890F02", "#0A437C", "#6D1F62", "#584477"]
BG, PANEL, BORDER, TEXT, DIM, GRID = "#111217", "#181B1F", "#2C3235", "#CCCCDC", "#8E8E9A", "#2A2D33"

COL_W, ROW_H, GAP = 62, 32, 8  # px per grid column / grid row, gap between panels
HEADER = 72


def substitute(expr):
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    for var in ("namespace", "volume", "node"):
        expr = expr.replace("$" + var, ".*")
    return expr


def title_of(title):
    for var in ("namespace", "volume", "node"):
        title = title.replace("$" + var, "All")
    return title


def query(base, expr, start, end, instant):
    if instant:
        path, params = "/api/v1/query", {"query": expr, "time": "%.3f" % end}
    else:
        step = max(2, math.ceil((end - start) / POINTS))
        params = {"query": expr, "start": "%.3f" % start, "end": "%.3f" % end, "step": str(step)}
        path = "/api/v1/query_range"
    url = base.rstrip("/") + path + "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError("%s: %s" % (expr, body))
    return body["data"]["result"]


def legend(fmt, metric):
    if not fmt:
        return "{" + ", ".join('%s="%s"' % kv for kv in sorted(metric.items())) + "}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt)


def fetch_all(panels, base, run):
    """{expr: result} for every target of every panel."""
    with urllib.request.urlopen(base.rstrip("/") + "/api/v1/status/buildinfo", timeout=30) as r:
        answers = {"prometheus version": json.load(r)["data"]["version"]}
    for p in panels:
        for t in p.get("targets", []):
            expr = substitute(t["expr"])
            if expr not in answers:
                answers[expr] = query(base, expr, run["start"], run["end"], bool(t.get("instant")))
    return answers


def si(v, unit):
    """A value in the panel's unit, as Grafana would label it (roughly)."""
    if unit == "percentunit":
        return "%.3g%%" % (v * 100)
    if unit == "s":
        for div, suffix in ((1, " s"), (1e-3, " ms"), (1e-6, " µs"), (1e-9, " ns")):
            if abs(v) >= div or div == 1e-9:
                if v == 0:
                    return "0 s"
                return "%.3g%s" % (v / div, suffix)
    binary = unit in ("Bps", "bytes")
    prefixes = ["", "Ki", "Mi", "Gi", "Ti"] if binary else ["", "K", "M", "G", "T"]
    i = 0
    while abs(v) >= (1024.0 if binary else 1000.0) and i < len(prefixes) - 1:
        v /= 1024.0 if binary else 1000.0
        i += 1
    if binary:
        return "%.3g %s%s" % (v, prefixes[i], "B/s" if unit == "Bps" else "B")
    return "%.3g%s%s" % (v, prefixes[i], {"ops": " ops/s", "reqps": " req/s"}.get(unit, ""))


def nice_ticks(lo, hi, n=4):
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    first = math.floor(lo / step) * step
    ticks = []
    v = first
    while not ticks or ticks[-1] < hi:
        ticks.append(v)
        v += step
    return ticks


def c(x):
    return "%.1f" % x


def text(o, x, y, s, size=11, fill=TEXT, anchor="start", weight="normal"):
    o.append('<text x="%s" y="%s" font-size="%d" fill="%s" text-anchor="%s" font-weight="%s">%s</text>'
             % (c(x), c(y), size, fill, anchor, weight, escape(s)))


def clip(s, width_px, size):
    room = int(width_px / (size * 0.6))
    return s if len(s) <= room else s[: max(room - 1, 1)] + "…"


def timeseries(o, p, box, answers, run):
    x0, y0, w, h = box
    unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    series = []
    for t in p.get("targets", []):
        for r in answers[substitute(t["expr"])]:
            pts = [(float(ts), float(v)) for ts, v in r.get("values", []) if v not in ("NaN", "+Inf", "-Inf")]
            if pts:
                series.append((legend(t.get("legendFormat"), r["metric"]), pts))
    if not series:
        why = EMPTY_WHY.get(p["title"], "no series over the run's window")
        for i, line in enumerate(wrap(why, int(w / 6.6))):
            text(o, x0 + w / 2, y0 + h / 2 + i * 15, line, 11, DIM, "middle")
        return
    series.sort(key=lambda s: s[0])
    n_leg = min(len(series), 6)
    leg_h = 14 * math.ceil(n_leg / 2) + 6
    note = wrap(NOTES.get(p["title"], ""), int((w - 20) / 5.2))
    if note != [""]:
        for i, line in enumerate(note):
            text(o, x0 + 10, y0 + 33 + i * 11, line, 9, "#E0B400")
    top = y0 + 30 + (11 * len(note) + 4 if note != [""] else 0)
    left, right, bottom = x0 + 58, x0 + w - 10, y0 + h - leg_h - 20
    lo = min(0.0, min(v for _, pts in series for _, v in pts))
    hi = max(v for _, pts in series for _, v in pts)
    if unit == "percentunit" and p["title"] == "Quota use":
        hi = max(hi, 0.0)
    ticks = nice_ticks(lo, hi if hi > lo else lo + 1)
    vlo, vhi = ticks[0], ticks[-1]
    t0, t1 = run["start"], run["end"]

    def X(t):
        return left + (t - t0) / (t1 - t0) * (right - left)

    def Y(v):
        return bottom - (v - vlo) / (vhi - vlo) * (bottom - top)

    for v in ticks:
        o.append('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="1"/>' % (c(left), c(Y(v)), c(right), c(Y(v)), GRID))
        text(o, left - 5, Y(v) + 3.5, si(v, unit), 9, DIM, "end")
    span = t1 - t0
    minute = 60 if span > 240 else 30
    t = math.ceil(t0 / minute) * minute
    while t <= t1:
        o.append('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="1"/>' % (c(X(t)), c(top), c(X(t)), c(bottom), GRID))
        anchor = "end" if X(t) > right - 24 else "middle"
        text(o, X(t), bottom + 13, time.strftime("%H:%M:%S", time.gmtime(t)), 9, DIM, anchor)
        t += minute
    step = max(2, math.ceil((t1 - t0) / POINTS))
    for i, (name, pts) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        # Break the line where samples are missing (more than two steps apart).
        d, prev = [], None
        for ts, v in pts:
            d.append(("M" if prev is None or ts - prev > 2.5 * step else "L") + "%s %s" % (c(X(ts)), c(Y(v))))
            prev = ts
        o.append('<path d="%s" fill="none" stroke="%s" stroke-width="1.4"/>' % (" ".join(d), colour))
        if len(pts) == 1:
            o.append('<circle cx="%s" cy="%s" r="2" fill="%s"/>' % (c(X(pts[0][0])), c(Y(pts[0][1])), colour))
    col_w = (w - 20) / 2
    for i, (name, _) in enumerate(series[:n_leg]):
        lx = x0 + 10 + (i % 2) * col_w
        ly = bottom + 30 + (i // 2) * 14
        o.append('<rect x="%s" y="%s" width="12" height="3" fill="%s"/>' % (c(lx), c(ly - 4), COLOURS[i % len(COLOURS)]))
        text(o, lx + 16, ly, clip(name, col_w - 22, 9), 9, TEXT)
    if len(series) > n_leg:
        text(o, x0 + w - 8, y0 + 18, "+%d more series" % (len(series) - n_leg), 9, DIM, "end")


def table(o, p, box, answers):
    x0, y0, w, h = box
    rows = []
    for t in p.get("targets", []):
        for r in answers[substitute(t["expr"])]:
            v = r.get("value") or (r.get("values") or [[0, ""]])[-1]
            rows.append((legend(t.get("legendFormat"), r["metric"]), v[1]))
    if not rows:
        text(o, x0 + w / 2, y0 + h / 2, EMPTY_WHY.get(p["title"], "no rows at the run's end"), 11, DIM, "middle")
        return
    rows.sort()
    text(o, x0 + 10, y0 + 44, "Series (at the run's end)", 10, DIM, weight="bold")
    text(o, x0 + w - 10, y0 + 44, "Value", 10, DIM, "end", "bold")
    for i, (name, v) in enumerate(rows[: int((h - 60) / 18)]):
        y = y0 + 64 + i * 18
        o.append('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>' % (c(x0 + 8), c(y - 13), c(x0 + w - 8), c(y - 13), GRID))
        text(o, x0 + 10, y, clip(name, w - 60, 10), 10)
        text(o, x0 + w - 10, y, v, 10, anchor="end")


def wrap(s, width):
    out, line = [], ""
    for word in s.split():
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = (line + " " + word).strip()
    return out + [line]


def render(dashboard, answers, run):
    panels = dashboard["panels"]
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    width = 24 * COL_W + GAP
    height = HEADER + bottom * ROW_H + GAP + 24
    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
         'font-family="DejaVu Sans, Verdana, sans-serif">' % (width, height, width, height),
         '<rect width="100%%" height="100%%" fill="%s"/>' % BG]
    text(o, GAP + 4, 26, dashboard["title"], 18, TEXT, weight="bold")
    window = "%s to %s UTC" % (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(run["start"])),
                               time.strftime("%H:%M:%S", time.gmtime(run["end"])))
    text(o, GAP + 4, 44, "Not a Grafana screenshot (Grafana is AGPL and not used here): drawn by bench/dashboard.py "
         "from tessera-dashboard.json's own queries, answered by Prometheus %s"
         % answers.get("prometheus version", "?"), 11, DIM)
    text(o, GAP + 4, 59, "over a real run (tests/node/dashboard_run.rs), %s. Namespace, Volume, Node: All; "
         "$__rate_interval = %s; the panels by their gridPos." % (window, RATE_INTERVAL), 11, DIM)
    for p in panels:
        g = p["gridPos"]
        x, y = GAP + g["x"] * COL_W, HEADER + g["y"] * ROW_H
        w, h = g["w"] * COL_W - GAP, g["h"] * ROW_H - GAP
        if p["type"] == "row":
            o.append('<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>' % (c(x), c(y), c(w), c(h), BG))
            o.append('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>' % (c(x), c(y + h), c(x + w), c(y + h), BORDER))
            text(o, x + 4, y + h - 6, "⌄ " + title_of(p["title"]), 14, TEXT, weight="bold")
            continue
        o.append('<rect x="%s" y="%s" width="%s" height="%s" rx="3" fill="%s" stroke="%s"/>' % (c(x), c(y), c(w), c(h), PANEL, BORDER))
        text(o, x + 10, y + 19, title_of(p["title"]), 12, TEXT, weight="bold")
        if p["type"] == "table":
            table(o, p, (x, y, w, h), answers)
        else:
            timeseries(o, p, (x, y, w, h), answers, run)
    o.append("</svg>")
    return "\n".join(o) + "\n"


def main(argv):
    args = dict(zip(argv[1::2], argv[2::2]))
    if "--run" not in args or not ("--prometheus" in args or "--cache" in args):
        print(__doc__, file=sys.stderr)
        return 2
    with open(args["--run"], encoding="utf-8") as f:
        run = json.load(f)
    with open(args.get("--dashboard", DASHBOARD), encoding="utf-8") as f:
        dashboard = json.load(f)
    if "--cache" in args:
        with open(args["--cache"], encoding="utf-8") as f:
            answers = json.load(f)
    else:
        answers = fetch_all(dashboard["panels"], args["--prometheus"], run)
        with open(os.path.join(os.path.dirname(args["--run"]), "queries.json"), "w", encoding="utf-8") as f:
            json.dump(answers, f)
    empty = [p["title"] for p in dashboard["panels"] if p.get("targets")
             and not any(answers[substitute(t["expr"])] for t in p["targets"])]
    out = args.get("--out", OUT)
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        f.write(render(dashboard, answers, run))
    print("%s: %d panels, empty: %s" % (out, sum(p["type"] != "row" for p in dashboard["panels"]), empty or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
