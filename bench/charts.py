#!/usr/bin/env python3
"""SVG bar charts of the recorded BENCH lines (bench/results/*.txt) for docs/figures.md.

    python3 bench/charts.py [OUT_DIR]          # write the charts (default docs/figures/)
    python3 bench/charts.py --check            # fail if docs/figures/ is not current

Standard library only; the SVG is written by hand, with every number formatted
explicitly, so the same data gives the same bytes on any machine. What each chart
shows is the CHARTS table below: which BENCH lines, which keys, which groups.
"""

import glob
import math
import os
import sys
import tempfile
from xml.sax.saxutils import escape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
OUT = os.path.join(ROOT, "docs", "figures")

# Series colours (colour-blind safe: Okabe-Ito).
COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00"]


def parse_line(line):
    """One BENCH line: (name, {key: value}); values stay strings."""
    parts = line.split()
    if len(parts) < 2 or parts[0] != "BENCH":
        raise ValueError("not a BENCH line: %r" % line)
    fields = {}
    for p in parts[2:]:
        k, sep, v = p.partition("=")
        if not sep:
            raise ValueError("no '=' in %r" % p)
        fields[k] = v
    return parts[1], fields


def read_results(directory):
    """Every BENCH line of directory/*.txt, in file then line order."""
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "*.txt"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    out.append(parse_line(line))
    return out


def num(s):
    return float(s.replace(",", ""))


def fmt(x):
    """A value for a label: at most 3 significant digits after the point, no exponent."""
    if x >= 1000:
        return "{:,.0f}".format(x)
    if x >= 100:
        return "{:.0f}".format(x)
    if x >= 10:
        return "{:.1f}".format(x)
    return "{:.2f}".format(x)


def tick_label(v):
    """An axis value: whole numbers without decimals."""
    if v == int(v):
        return "{:,d}".format(int(v))
    return "{:g}".format(round(v, 6))


def c(x):
    """A coordinate: two decimals, fixed."""
    return "{:.2f}".format(x)


def bar_chart(title, subtitle, unit, groups, series, values, reference=None):
    """A grouped bar chart: `groups` along x, one bar per series in each; values[g][s]
    (None: no bar). `reference`: (value, label) for a dashed horizontal line."""
    width, height = 760, 360
    left, right, top, bottom = 64, 16, 58, 78
    plot_w, plot_h = width - left - right, height - top - bottom
    vmax = max([v for row in values for v in row if v is not None] + [reference[0] if reference else 0])
    # A round top: a round multiple of a power of ten, above the largest value.
    need = vmax * 1.08
    p = 10 ** math.floor(math.log10(need))
    top_v = next(p * m for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if p * m >= need)
    tick = top_v / 5

    def y(v):
        return top + plot_h - v / top_v * plot_h

    o = []
    o.append('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Verdana, sans-serif">' % (width, height, width, height))
    o.append('<rect width="%d" height="%d" fill="#ffffff"/>' % (width, height))
    o.append('<text x="%s" y="22" font-size="15" font-weight="bold">%s</text>' % (c(left), escape(title)))
    o.append('<text x="%s" y="40" font-size="11" fill="#444444">%s</text>' % (c(left), escape(subtitle)))
    # Grid and y axis.
    for i in range(6):
        v = tick * i
        o.append('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e0e0e0"/>' % (c(left), c(y(v)), c(left + plot_w), c(y(v))))
        o.append('<text x="%s" y="%s" font-size="10" text-anchor="end" fill="#444444">%s</text>' % (c(left - 6), c(y(v) + 3.5), tick_label(v)))
    o.append('<text x="14" y="%s" font-size="11" fill="#444444" transform="rotate(-90 14 %s)" text-anchor="middle">%s</text>' % (c(top + plot_h / 2), c(top + plot_h / 2), escape(unit)))
    # Bars.
    gw = plot_w / len(groups)
    bw = min(28.0, (gw - 16) / len(series))
    for gi, g in enumerate(groups):
        x0 = left + gi * gw + (gw - bw * len(series)) / 2
        for si in range(len(series)):
            v = values[gi][si]
            if v is None:
                continue
            x = x0 + si * bw
            o.append('<rect x="%s" y="%s" width="%s" height="%s" fill="%s"><title>%s, %s: %s</title></rect>' % (c(x + 1), c(y(v)), c(bw - 2), c(top + plot_h - y(v)), COLOURS[si % len(COLOURS)], escape(g), escape(series[si]), fmt(v)))
            if bw >= 18:
                o.append('<text x="%s" y="%s" font-size="8" text-anchor="middle" fill="#222222">%s</text>' % (c(x + bw / 2), c(y(v) - 3), fmt(v)))
        o.append('<text x="%s" y="%s" font-size="10" text-anchor="middle">%s</text>' % (c(left + gi * gw + gw / 2), c(top + plot_h + 15), escape(g)))
    o.append('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#444444"/>' % (c(left), c(top + plot_h), c(left + plot_w), c(top + plot_h)))
    if reference:
        rv, rl = reference
        o.append('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#C00000" stroke-dasharray="6,4"/>' % (c(left), c(y(rv)), c(left + plot_w), c(y(rv))))
        o.append('<text x="%s" y="%s" font-size="10" text-anchor="end" fill="#C00000">%s</text>' % (c(left + plot_w - 2), c(y(rv) - 4), escape(rl)))
    # Legend.
    lx = left
    for si, s in enumerate(series):
        o.append('<rect x="%s" y="%s" width="10" height="10" fill="%s"/>' % (c(lx), c(height - 26), COLOURS[si % len(COLOURS)]))
        o.append('<text x="%s" y="%s" font-size="11">%s</text>' % (c(lx + 14), c(height - 17), escape(s)))
        lx += 30 + 6.5 * len(s)
    o.append("</svg>")
    return "\n".join(o) + "\n"


def lines_of(results, name, **match):
    return [f for n, f in results if n == name and all(f.get(k) == v for k, v in match.items())]


def fuse_data_rows(results):
    (f,) = lines_of(results, "fuse", date="2026-11-30")
    rows = [
        ("overwrite, fio", "seq_overwrite", "mibs"),
        ("write, dd", "seq_write_dd", "mibs"),
        ("write+fsync", "seq_write_fsync", "mibs"),
        ("seq read", "seq_read", "mibs"),
        ("rand read", "rand_read", "iops"),
        ("rand write", "rand_write", "iops"),
        ("create", "create", "per_s"),
        ("stat", "stat", "per_s"),
        ("unlink", "unlink", "per_s"),
    ]
    groups, values = [], []
    for label, row, unit in rows:
        native = num(f["%s_native_%s" % (row, unit)])
        groups.append(label)
        values.append([num(f["%s_%s_%s" % (row, t, unit)]) / native for t in ("tessera", "bindfs")])
    return bar_chart(
        "FUSE throughput against the native directory",
        "make bench-fuse, daemon mode on ext4, 2026-11-30: medians of 3 rounds (bench/results/fuse.txt)",
        "× native (higher is better)",
        groups, ["tessera", "bindfs"], values, reference=(1.0, "native"))


def fuse_round_trip(results):
    fs = lines_of(results, "fuse", date="2026-12-01")
    groups, values = [], []
    for op in ("create", "stat", "unlink"):
        for f in fs:
            null = num(f["%s_nullfs_p50_us" % op])
            groups.append("%s %s" % (op, f["run"]))
            values.append([num(f["%s_%s_p50_us" % (op, t)]) / null for t in ("tessera", "bindfs")])
    return bar_chart(
        "FUSE metadata against the round-trip floor (a null FUSE filesystem)",
        "make bench-fuse, 2026-12-01, three runs on a shared machine: median operation (bench/results/fuse.txt)",
        "× null FUSE filesystem (lower is better)",
        groups, ["tessera", "bindfs"], values, reference=(1.2, "goal ≤ 1.2 (stat, unlink)"))


def controller_ratio(results):
    cs = lines_of(results, "controller", date="2026-12-02")
    groups = [f["run"] for f in cs]
    values = [[num(f["controller_over_minimal"]), num(f["controller_over_chain"])] for f in cs]
    return bar_chart(
        "Controller: 1,000 attaches against the API floors",
        "make bench-controller, 2026-12-02, quiet machine; floors' objects bare (A, B, C) or in the controller's shape (S1–S6)",
        "× floor (lower is better)",
        groups, ["÷ minimal floor", "÷ watch-driven chain"], values, reference=(1.2, "goal 1.2× minimal"))


def attach_latency(results):
    a = lines_of(results, "attach", date="2026-12-02")
    groups = ["run %s" % f["run"] for f in a]
    values = [[num(f["tessera_p50_ms"]), num(f["tessera_p99_ms"]), num(f["floor_p50_ms"]), num(f["noop_p50_ms"])] for f in a]
    return bar_chart(
        "Single attach through the real external-attacher",
        "make bench-attach, 2026-12-02 17:28–17:30 UTC, quiet machine (bench/results/attach.txt)",
        "milliseconds (lower is better)",
        groups, ["Tessera p50", "Tessera p99", "floor p50 (chain + daemon start)", "no-op driver p50"], values,
        reference=(50.0, "goal p50 ≤ 50 ms"))


CHARTS = [
    ("fuse-throughput.svg", fuse_data_rows),
    ("fuse-round-trip.svg", fuse_round_trip),
    ("controller-ratio.svg", controller_ratio),
    ("attach-latency.svg", attach_latency),
]


def render(out_dir):
    results = read_results(RESULTS)
    os.makedirs(out_dir, exist_ok=True)
    for name, chart in CHARTS:
        with open(os.path.join(out_dir, name), "w", encoding="utf-8", newline="\n") as f:
            f.write(chart(results))


def main(argv):
    if argv[1:] == ["--check"]:
        with tempfile.TemporaryDirectory() as tmp:
            render(tmp)
            stale = []
            for name, _ in CHARTS:
                want = open(os.path.join(tmp, name), encoding="utf-8").read()
                path = os.path.join(OUT, name)
                have = open(path, encoding="utf-8").read() if os.path.exists(path) else None
                if have != want:
                    stale.append(os.path.relpath(path, ROOT))
        if stale:
            print("bench charts not current (run `make charts`): " + ", ".join(stale), file=sys.stderr)
            return 1
        print("bench charts current: %d" % len(CHARTS))
        return 0
    render(argv[1] if len(argv) > 1 else OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
