#!/usr/bin/env python3
"""Plots `upipe train` metrics files against the step, one figure with a grid of panels:

  loss            loss, the copy task's copy_loss and the validation loss, when present
  tokens/s        tokens/s per rank
  memory          the device arena's peak per rank, the host peak when it is not zero, and the
                  device budget (budget_bytes) when it is within 4x of the peaks (else the
                  legend says it is off the scale)
  MFU             model FLOPs utilization, %
  step time       seconds per step; a run's first step (warm-up) is left off the scale when it is
                  over 3x the others' highest, and the panel says its value
  lr / grad norm  the learning rate (left axis) and the gradient norm (right axis)

A panel whose numbers no line has (an older file) is left out. Usage:

    python3 bench/plot_metrics.py METRICS.jsonl [MORE.jsonl ...] OUT.png [--title TEXT]

Several files (runs to compare) go on the same panels, one line style per file, named by file
in the legends. With python3-matplotlib (`make bench` installs it; `sudo apt-get install
python3-matplotlib`) it writes the PNG. Without it, it writes the same panels as an SVG drawn
with the standard library alone (OUT with its suffix replaced by .svg; any browser shows it) and
says so. Lines that are not JSON objects with a "step" (a torn last line) are skipped; null
values (a diverged step) are gaps.
"""
import argparse
import json
import math
import os
import sys
from xml.sax.saxutils import escape

MIB, GIB = 2**20, 2**30


class Panel:
    """One panel: its series (key, label, color) on the left axis and, optionally, on a right axis;
    scale multiplies the values (e.g. a fraction to %); zero_based starts the y axis at 0."""

    def __init__(self, name, ylabel, left, right=(), right_label="", scale=1.0, zero_based=False,
                 warmup_off_scale=False):
        self.name, self.ylabel, self.left, self.right, self.right_label = name, ylabel, left, right, right_label
        self.scale, self.zero_based, self.warmup_off_scale = scale, zero_based, warmup_off_scale


PANELS = [
    Panel("loss", "loss (nats)", [("loss", "loss", "#1f77b4"), ("copy_loss", "copy loss (copied half)", "#ff7f0e"),
                                  ("val_loss", "validation loss", "#d62728")]),
    Panel("tokens/s", "tokens/s per rank", [("tokens_per_s", "tokens/s per rank", "#2ca02c")], zero_based=True),
    Panel("memory", "peak per rank", [("peak_bytes", "device peak", "#9467bd"),
                                      ("host_peak_bytes", "host peak", "#8c564b"),
                                      ("budget_bytes", "device budget", "#7f7f7f")], zero_based=True),
    Panel("MFU", "MFU (%)", [("mfu", "MFU", "#e377c2")], scale=100.0, zero_based=True),
    Panel("step time", "step time (s)", [("step_s", "step time", "#17becf")], zero_based=True,
          warmup_off_scale=True),
    Panel("lr / grad norm", "learning rate", [("lr", "learning rate", "#bcbd22")],
          right=[("grad_norm", "grad norm (right axis)", "#1f77b4")], right_label="grad norm", zero_based=True),
]
# One line style per metrics file: matplotlib's and SVG's stroke-dasharray.
STYLES = [("-", None), ("--", "6,4"), (":", "2,3"), ("-.", "8,3,2,3")]
# The budget line is drawn when it is at most this many times the highest peak.
BUDGET_IN_SCALE = 4.0
# A run's first step is left off the step-time scale when it is over this many times the others'.
WARMUP_OFF_SCALE = 3.0


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


def number(v):
    """A float of a JSON number; NaN (a gap) for null or anything else."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def series(rows, key, scale=1.0):
    """(steps, values) of the rows that have key; a null or non-number becomes NaN (a gap)."""
    xs, ys = [], []
    for r in rows:
        if key in r:
            xs.append(r["step"])
            ys.append(number(r[key]) * scale)
    return xs, ys


def finite(ys):
    return [y for y in ys if math.isfinite(y)]


def warmup_steps(rows):
    """The first step of each run in the file (a resumed run appends a new "run" id)."""
    seen, steps = set(), set()
    for r in rows:
        if r.get("run") not in seen:
            seen.add(r.get("run"))
            steps.add(r["step"])
    return steps


def legend_room(entries):
    """How far to raise the top of a twin-axis panel, as a fraction of its range, so that a legend of
    that many entries in its upper right covers no line."""
    room = min(0.6, 0.05 + 0.07 * entries)  # of the panel's height
    return room / (1 - room)


def fmt(v):
    return "%.4g" % v


def layout(runs):
    """What to draw: a list of (panel, ylabel, left, right, y_top, notes): left and right are lists of
    (label, color, style, xs, ys), y_top the top of the left axis when the warm-up is left off the
    scale (else None), notes lines to print in the panel. Panels without a finite value are left out."""
    peak = max([0.0] + [y for _, rows in runs for k in ("peak_bytes", "host_peak_bytes")
                        for y in finite(series(rows, k)[1])])
    unit, unit_name = (GIB, "GiB") if peak >= GIB else (MIB, "MiB")
    out = []
    for p in PANELS:
        left, right, notes, y_top = [], [], [], None
        scale = 1.0 / unit if p.name == "memory" else p.scale
        ylabel = "%s (%s)" % (p.ylabel, unit_name) if p.name == "memory" else p.ylabel
        for side, dest in ((p.left, left), (p.right, right)):
            for key, label, color in side:
                for i, (name, rows) in enumerate(runs):
                    xs, ys = series(rows, key, scale)
                    if not finite(ys) or (key == "host_peak_bytes" and max(finite(ys)) == 0):
                        continue  # not in this file, or no host arena in this run (nothing offloaded)
                    if key == "budget_bytes":
                        top = max(finite(ys))
                        if top <= 0:
                            continue
                        if top * unit > BUDGET_IN_SCALE * peak:
                            notes.append("device budget %.4g %s%s: off the scale" % (
                                top * unit / GIB, "GiB", "" if len(runs) == 1 else " (%s)" % name))
                            continue
                    shown = label if len(runs) == 1 else "%s, %s" % (label, name)
                    dest.append((shown, color, STYLES[i % len(STYLES)], xs, ys))
        if not left and not right:
            continue
        if p.warmup_off_scale and left:
            rest, cut = [], []  # the values of the steps after each run's first; (step, value, file) of those
            for name, rows in runs:
                first = warmup_steps(rows)
                for x, y in zip(*series(rows, p.left[0][0], scale)):
                    if math.isfinite(y):
                        (cut.append((x, y, name)) if x in first else rest.append(y))
            if rest and max(rest) > 0 and any(y > WARMUP_OFF_SCALE * max(rest) for _, y, _ in cut):
                y_top = max(rest) * 1.05
                notes += ["step %d (warm-up): %s s%s, off the scale" % (x, fmt(y), "" if len(runs) == 1 else
                                                                        " (%s)" % name)
                          for x, y, name in cut if y > y_top]
        out.append((p, ylabel, left, right, y_top, notes))
    return out


def plot_matplotlib(runs, out, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    panels = layout(runs)
    cols = 2 if len(panels) > 1 else 1
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 3.4 * nrows), squeeze=False)
    axes = [ax for row in axes for ax in row]
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for ax, (p, ylabel, left, right, y_top, notes) in zip(axes, panels):
        handles, twin = [], ax.twinx() if right else None
        for dest, found in ((ax, left), (twin, right)):
            for label, color, (ls, _), xs, ys in found:
                marker = "o" if label.startswith("validation") else None
                handles += dest.plot(xs, ys, label=label, color=color, linestyle=ls, marker=marker,
                                     markersize=3)
            if found and p.zero_based:
                dest.set_ylim(bottom=0)
        if twin is not None:
            twin.set_ylabel(p.right_label)
        if y_top is not None:
            ax.set_ylim(top=y_top)
        if twin is not None:  # room above both axes' lines for the legend, which sees only one axis's
            for a in (ax, twin):
                lo, hi = a.get_ylim()
                a.set_ylim(top=hi + legend_room(len(left) + len(right) + len(notes)) * (hi - lo))
        ax.set_ylabel(ylabel)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        handles += [Line2D([], [], linestyle="none", label=note) for note in notes]
        ax.legend(handles=handles, fontsize=8, loc="upper right" if twin is not None else "best")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return len(panels)


# The SVG's grid: each cell W x H, the plot inside it from (LEFT, TOP) of PW x PH.
W, H, LEFT, TOP, PW, PH = 600, 290, 70, 30, 460, 200


def svg_label(x, y, text, color):
    """Legend text, right-aligned at (x, y), over a white outline of itself so that lines behind it do
    not hide it (two texts: not every SVG renderer knows paint-order)."""
    t = f'<text x="{x}" y="{y}" text-anchor="end" font-size="11" %s>{escape(text)}</text>'
    return [t % 'fill="white" stroke="white" stroke-width="3"', t % f'fill="{color}"']


def svg_axis(ys_list, zero_based, y_top):
    values = [y for ys in ys_list for y in ys if math.isfinite(y)]
    lo, hi = (0.0 if zero_based else min(values)), max(values)
    if y_top is not None:
        hi = y_top
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    return lo, hi


def svg_panel(p, ylabel, left, right, y_top, notes, ox, oy, x_range, clip_id):
    """SVG elements of one panel in the cell at (ox, oy): axes, min/max ticks, polylines, legend."""
    x, y = ox + LEFT, oy + TOP
    x0, x1 = x_range
    sx = lambda v: x + (v - x0) / (x1 - x0 or 1) * PW
    e = [f'<clipPath id="{clip_id}"><rect x="{x}" y="{y - 1}" width="{PW}" height="{PH + 2}"/></clipPath>',
         f'<rect x="{x}" y="{y}" width="{PW}" height="{PH}" fill="none" stroke="#999"/>',
         f'<text x="{ox + 14}" y="{y + PH / 2}" transform="rotate(-90 {ox + 14} {y + PH / 2})" '
         f'text-anchor="middle">{escape(ylabel)}</text>',
         f'<text x="{x}" y="{y + PH + 16}">{x0}</text>',
         f'<text x="{x + PW}" y="{y + PH + 16}" text-anchor="end">{x1}</text>',
         f'<text x="{x + PW / 2}" y="{y + PH + 30}" text-anchor="middle">step</text>']
    legend = 0
    for side, found in (("left", left), ("right", right)):
        if not found:
            continue
        lo, hi = svg_axis([f[4] for f in found], p.zero_based, y_top if side == "left" else None)
        if right:  # room above both axes' lines for the legend
            hi += legend_room(len(left) + len(right) + len(notes)) * (hi - lo)
        sy = lambda v: y + PH - (v - lo) / (hi - lo) * PH
        tx, anchor = (x - 6, "end") if side == "left" else (x + PW + 6, "start")
        e += [f'<text x="{tx}" y="{y + 4}" text-anchor="{anchor}">{fmt(hi)}</text>',
              f'<text x="{tx}" y="{y + PH + 4}" text-anchor="{anchor}">{fmt(lo)}</text>']
        if side == "right":
            e.append(f'<text x="{ox + W - 10}" y="{y + PH / 2}" transform="rotate(90 {ox + W - 10} {y + PH / 2})" '
                     f'text-anchor="middle">{escape(p.right_label)}</text>')
        for label, color, (_, dash), xs, ys in found:
            runs, run = [], []
            for a, b in zip(xs, ys):  # a NaN breaks the line
                if math.isfinite(b):
                    run.append(f"{sx(a):.1f},{sy(b):.1f}")
                elif run:
                    runs.append(run)
                    run = []
            runs.append(run)
            dashes = f' stroke-dasharray="{dash}"' if dash else ""
            for r in runs:
                if len(r) == 1 or (r and label.startswith("validation")):
                    for pt in r:
                        cx, cy = pt.split(",")
                        e.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{color}" '
                                 f'clip-path="url(#{clip_id})"/>')
                if len(r) > 1:
                    e.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{dashes} '
                             f'clip-path="url(#{clip_id})" points="{" ".join(r)}"/>')
            ly = y + 16 + 14 * legend  # the legend: the label and a sample of its line
            e += svg_label(x + PW - 32, ly, label, color)
            e += [f'<line x1="{x + PW - 28}" y1="{ly - 4}" x2="{x + PW - 6}" y2="{ly - 4}" stroke="{color}" '
                  f'stroke-width="1.5"{dashes}/>']
            legend += 1
    for note in notes:
        e += svg_label(x + PW - 6, y + 16 + 14 * legend, note, "#555")
        legend += 1
    return e


def plot_svg(runs, out, title):
    panels = layout(runs)
    steps = [r["step"] for _, rows in runs for r in rows]
    x_range = (min(steps), max(steps))
    cols = 2 if len(panels) > 1 else 1
    nrows = (len(panels) + cols - 1) // cols
    width, height = W * cols, 40 + H * nrows
    e = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         'font-family="sans-serif" font-size="12">',
         f'<rect width="{width}" height="{height}" fill="white"/>',
         f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="14">{escape(title)}</text>']
    for i, panel in enumerate(panels):
        e += svg_panel(*panel, ox=W * (i % cols), oy=40 + H * (i // cols), x_range=x_range, clip_id="c%d" % i)
    e.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(e) + "\n")
    return len(panels)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="+", help="JSONL files written by upipe train (metrics.path), one or more")
    ap.add_argument("out", help="PNG to write (an SVG beside it without matplotlib)")
    ap.add_argument("--title", default=None, help="figure title (default: the metrics files)")
    ap.add_argument("--svg", action="store_true", help="write the SVG even with matplotlib")
    args = ap.parse_args()

    if os.path.splitext(args.out)[1] in (".jsonl", ".json") or any(
            os.path.realpath(args.out) == os.path.realpath(m) for m in args.metrics):
        ap.error(f"the last argument is the image to write, not a metrics file: {args.out}")
    runs = []
    for path in args.metrics:
        try:
            rows = read_metrics(path)
        except OSError as e:
            sys.exit(f"plot_metrics: cannot read {path}: {e.strerror}")
        except UnicodeDecodeError:
            sys.exit(f"plot_metrics: {path} is not a text (JSONL) file")
        if not rows:
            sys.exit(f"plot_metrics: {path} holds no metrics lines")
        runs.append((os.path.basename(path) if len(args.metrics) > 1 else path, rows))
    title = args.title or ", ".join(args.metrics)
    out = args.out
    steps = sum(len(rows) for _, rows in runs)
    what = f"{steps} step{'s' if steps > 1 else ''}" + (f" of {len(runs)} runs" if len(runs) > 1 else "")
    if not layout(runs):
        sys.exit(f"plot_metrics: {title}: no numbers to plot (every value is null)")
    try:
        try:
            if args.svg:
                raise ImportError("--svg")
            n = plot_matplotlib(runs, out, title)
            print(f"{out}: {what}, {n} panels")
        except ImportError as e:
            out = os.path.splitext(args.out)[0] + ".svg"
            n = plot_svg(runs, out, title)
            why = "as asked" if args.svg else f"matplotlib is not installed ({e})"
            print(f"{out}: {what}, {n} panels, as SVG: {why}; for a PNG: "
                  "sudo apt-get install python3-matplotlib")
    except OSError as e:  # a missing directory, no permission, a full disk
        sys.exit(f"plot_metrics: cannot write {e.filename or out}: {e.strerror or e}")


if __name__ == "__main__":
    main()
