#!/usr/bin/env python3
"""Plots a `upipe train` metrics file: loss (with the copy task's copy_loss and the validation
loss when present) and tokens/s per rank against the step, one figure with two panels. Usage:

    python3 bench/plot_metrics.py METRICS.jsonl OUT.png [--title TEXT]

With python3-matplotlib (`make bench` installs it; `sudo apt-get install python3-matplotlib`)
it writes the PNG. Without it, it writes the same two panels as an SVG drawn with the standard
library alone (OUT with its suffix replaced by .svg; any browser shows it) and says so. Lines
that are not JSON objects with a "step" (a torn last line) are skipped; null values (a diverged
loss) are gaps.
"""
import argparse
import json
import math
import os
import sys
from xml.sax.saxutils import escape

LOSS_SERIES = [("loss", "loss", "#1f77b4"), ("copy_loss", "copy loss (copied half)", "#ff7f0e"),
               ("val_loss", "validation loss", "#d62728")]
TPS_SERIES = [("tokens_per_s", "tokens/s per rank", "#2ca02c")]


def read_metrics(path):
    rows = []
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
    rows.sort(key=lambda r: r["step"])
    return rows


def series(rows, key):
    """(steps, values) of the rows that have a number under key; None becomes NaN (a gap)."""
    xs, ys = [], []
    for r in rows:
        if key in r:
            xs.append(r["step"])
            ys.append(math.nan if r[key] is None else float(r[key]))
    return xs, ys


def plot_matplotlib(rows, out, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for ax, panel, ylabel in ((axes[0], LOSS_SERIES, "loss (nats)"),
                              (axes[1], TPS_SERIES, "tokens/s per rank")):
        for key, label, color in panel:
            xs, ys = series(rows, key)
            if xs:
                ax.plot(xs, ys, label=label, color=color, marker="o" if key == "val_loss" else None)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[1].set_ylim(bottom=0)
    axes[1].set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def svg_panel(rows, panel, ylabel, top, x_range, zero_based):
    """SVG elements of one panel 640x260 at y offset `top`: axes, min/max ticks, polylines."""
    left, width, height = 70, 540, 200
    found = [(key, label, color, *series(rows, key)) for key, label, color in panel]
    found = [f for f in found if f[3]]
    values = [y for f in found for y in f[4] if math.isfinite(y)]
    if not values:
        return []
    lo, hi = (0.0 if zero_based else min(values)), max(values)
    if hi <= lo:
        hi = lo + 1.0
    x0, x1 = x_range
    sx = lambda x: left + (x - x0) / (x1 - x0 or 1) * width
    sy = lambda y: top + height - (y - lo) / (hi - lo) * height
    e = [f'<rect x="{left}" y="{top}" width="{width}" height="{height}" fill="none" stroke="#999"/>',
         f'<text x="{left - 6}" y="{top + 4}" text-anchor="end">{hi:.4g}</text>',
         f'<text x="{left - 6}" y="{top + height + 4}" text-anchor="end">{lo:.4g}</text>',
         f'<text x="14" y="{top + height / 2}" transform="rotate(-90 14 {top + height / 2})" '
         f'text-anchor="middle">{escape(ylabel)}</text>']
    for i, (key, label, color, xs, ys) in enumerate(found):
        runs, run = [], []
        for x, y in zip(xs, ys):  # a NaN breaks the line
            if math.isfinite(y):
                run.append(f"{sx(x):.1f},{sy(y):.1f}")
            elif run:
                runs.append(run)
                run = []
        runs.append(run)
        for r in runs:
            if len(r) == 1:
                cx, cy = r[0].split(",")
                e.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{color}"/>')
            elif r:
                e.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                         f'points="{" ".join(r)}"/>')
        e.append(f'<text x="{left + width - 6}" y="{top + 16 + 16 * i}" text-anchor="end" '
                 f'fill="{color}">{escape(label)}</text>')
    return e


def plot_svg(rows, out, title):
    steps = [r["step"] for r in rows]
    x_range = (min(steps), max(steps))
    e = ['<svg xmlns="http://www.w3.org/2000/svg" width="640" height="560" '
         'font-family="sans-serif" font-size="12">',
         '<rect width="640" height="560" fill="white"/>',
         f'<text x="320" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>']
    e += svg_panel(rows, LOSS_SERIES, "loss (nats)", 40, x_range, zero_based=False)
    e += svg_panel(rows, TPS_SERIES, "tokens/s per rank", 300, x_range, zero_based=True)
    e += [f'<text x="70" y="520">{x_range[0]}</text>',
          f'<text x="610" y="520" text-anchor="end">{x_range[1]}</text>',
          '<text x="340" y="540" text-anchor="middle">step</text>', "</svg>"]
    with open(out, "w") as f:
        f.write("\n".join(e) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metrics", help="JSONL file written by upipe train (metrics.path)")
    ap.add_argument("out", help="PNG to write (an SVG beside it without matplotlib)")
    ap.add_argument("--title", default=None, help="figure title (default: the metrics file)")
    ap.add_argument("--svg", action="store_true", help="write the SVG even with matplotlib")
    args = ap.parse_args()

    try:
        rows = read_metrics(args.metrics)
    except OSError as e:
        sys.exit(f"plot_metrics: cannot read {args.metrics}: {e.strerror}")
    if not rows:
        sys.exit(f"plot_metrics: {args.metrics} holds no metrics lines")
    title = args.title or args.metrics
    out = args.out
    try:
        try:
            if args.svg:
                raise ImportError("--svg")
            plot_matplotlib(rows, out, title)
            print(f"{out}: {len(rows)} steps")
        except ImportError as e:
            out = os.path.splitext(args.out)[0] + ".svg"
            plot_svg(rows, out, title)
            why = "as asked" if args.svg else f"matplotlib is not installed ({e})"
            print(f"{out}: {len(rows)} steps, as SVG: {why}; for a PNG: "
                  "sudo apt-get install python3-matplotlib")
    except OSError as e:  # a missing directory, no permission, a full disk
        sys.exit(f"plot_metrics: cannot write {e.filename or out}: {e.strerror or e}")


if __name__ == "__main__":
    main()
