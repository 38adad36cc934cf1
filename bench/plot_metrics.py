#!/usr/bin/env python3
"""Plots a `upipe train` metrics file: loss (and the copy task's copy_loss) and tokens/s per rank
against the step, one PNG with two panels. Usage:

    /usr/bin/python3 bench/plot_metrics.py METRICS.jsonl OUT.png [--title TEXT]

Debian's python3 with python3-matplotlib (`make bench` installs it). Lines that are not JSON
objects with a "step" (a torn last line) are skipped; null values (a diverged loss) are gaps.
"""
import argparse
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metrics", help="JSONL file written by upipe train (metrics.path)")
    ap.add_argument("out", help="PNG to write")
    ap.add_argument("--title", default=None, help="figure title (default: the metrics file)")
    args = ap.parse_args()

    rows = read_metrics(args.metrics)
    if not rows:
        sys.exit(f"plot_metrics: {args.metrics} holds no metrics lines")

    fig, (ax_loss, ax_tps) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    ax_loss.plot(*series(rows, "loss"), label="loss")
    steps, copy = series(rows, "copy_loss")
    if steps:
        ax_loss.plot(steps, copy, label="copy loss (copied half)")
    ax_loss.set_ylabel("loss (nats)")
    ax_loss.grid(True, alpha=0.3)
    ax_loss.legend()

    ax_tps.plot(*series(rows, "tokens_per_s"), color="tab:green")
    ax_tps.set_ylabel("tokens/s per rank")
    ax_tps.set_xlabel("step")
    ax_tps.set_ylim(bottom=0)
    ax_tps.grid(True, alpha=0.3)

    fig.suptitle(args.title or args.metrics)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"{args.out}: {len(rows)} steps")


if __name__ == "__main__":
    main()
