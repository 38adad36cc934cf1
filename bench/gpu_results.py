#!/usr/bin/env python3
"""Turns the files bench/gpu_check.sh brought back from a GPU into a section of docs/results.md.

    python3 bench/gpu_results.py DIR [--out docs/results.md]

DIR holds what gpu_check.sh writes to $OUT (the device tool's files_at): gpu.txt, summary.json,
backend_ops.json, strategies.jsonl, kernel.jsonl, attention.jsonl, eval.jsonl. Every number of the
section comes from those files (nothing typed by hand); a file that is missing or empty leaves its
table out with a line that says so. The section replaces the page's previous GPU section and keeps
every other one (bench/run_benchmarks.py's merge).

The issue's targets (issue 19) are put beside the numbers: attention forward >= 50% and backward
>= 40% of the GPU's dense bf16 peak (H200: 989 TFLOP/s), upipe >= 0.95x ulysses' speed, measured
HBM (the arena's peak) = the plan of the same configuration.
"""
import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_benchmarks import PAGE_HEAD, merge_sections, table  # noqa: E402

# Dense bf16 peaks (NVIDIA's data sheets: half the with-sparsity figure), the more specific name
# first: nvidia-smi says "NVIDIA H100 80GB HBM3" for the SXM part, "NVIDIA H100 PCIe", "... NVL".
BF16_PEAK_TFLOPS = [("H200 NVL", 835.0), ("H200", 989.0), ("H100 PCIe", 756.0),
                    ("H100 NVL", 835.0), ("H100", 989.0)]


def jsonl(path):
    """The JSON objects of a .jsonl file (lines that parse), or [] when it is absent."""
    if not os.path.exists(path):
        return []
    out = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def num(x):
    """A JSON number as float: NaN where the run wrote NaN or inf (nlohmann::json writes null)."""
    return float("nan") if x is None else float(x)


def gib(b):
    return "%.2f GiB" % (num(b) / 2**30)


def env_of(j):
    """The UPIPE_* variables a run reported (print_json's "env"), as `A=1 B=2` or '', less those
    that change no result (UPIPE_CUDA_RESERVE only sizes the device arena's one cudaMalloc)."""
    quiet = {"UPIPE_CUDA_RESERVE"}
    return " ".join("%s=%s" % kv for kv in sorted((j.get("env") or {}).items()) if kv[0] not in quiet)


def gpu_name(d):
    """The GPU's name and the commit from gpu.txt (nvidia-smi's csv line, then `commit X`)."""
    name, commit = "unknown GPU", "unknown"
    path = os.path.join(d, "gpu.txt")
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line.startswith("commit "):
                commit = line.split(" ", 1)[1] or commit
            elif "," in line and not line.startswith("name"):
                name = line.split(",")[0].strip()
    return name, commit


def peak_of(name):
    for k, v in BF16_PEAK_TFLOPS:
        if k in name:
            return v
    return None


def steps_part(d):
    path = os.path.join(d, "summary.json")
    if not os.path.exists(path):
        return "No summary.json: the run did not finish its packing."
    rows = [(s["step"], s["rc"], s.get("seconds", ""), s.get("skipped", "passed" if s["rc"] == 0
                                                             else "failed"))
            for s in json.load(open(path))]
    return table(["step", "rc", "seconds", "result"], rows)


def backend_ops_part(d):
    path = os.path.join(d, "backend_ops.json")
    if not os.path.exists(path):
        return "No backend_ops.json."
    j = json.load(open(path))
    failed = []
    for suite in j.get("testsuites", []):
        for t in suite.get("testsuite", []):
            if t.get("failures"):
                failed.append("%s.%s" % (suite.get("name"), t.get("name")))
    line = "test_backend_ops: %d tests, %d failed, %d disabled" % (
        j.get("tests", 0), j.get("failures", 0), j.get("disabled", 0))
    return line + ("; failed: " + ", ".join(failed) if failed else ".")


def kernel_part(d, peak):
    rows = []
    for j in jsonl(os.path.join(d, "kernel.jsonl")):
        cells = [j.get("dtype"), env_of(j) or "default", j.get("seq_len"),
                 "%d/%d" % (j.get("heads", 0), j.get("kv_heads", 0)), j.get("head_dim"),
                 "%.1f" % num(j.get("fwd_tflops")), "%.1f" % num(j.get("bwd_tflops")),
                 "%.1f" % num(j.get("gemm_tflops"))]
        if peak:
            fwd, bwd = num(j.get("fwd_tflops")) / peak, num(j.get("bwd_tflops")) / peak
            ok = j.get("dtype") != "bf16" or (fwd >= 0.5 and bwd >= 0.4)
            cells += ["%.0f%%" % (100 * fwd), "%.0f%%" % (100 * bwd),
                      ("met" if ok else "not met") if j.get("dtype") == "bf16" else "—"]
        rows.append(cells)
    if not rows:
        return "No kernel.jsonl rows."
    head = ["dtype", "env", "S", "H/K", "d", "fwd TFLOP/s", "bwd TFLOP/s", "GEMM TFLOP/s"]
    if peak:
        head += ["fwd % peak", "bwd % peak", "target (bf16: fwd >= 50%, bwd >= 40%)"]
    return table(head, rows)


def attention_part(d):
    runs, plans = {}, {}
    for j in jsonl(os.path.join(d, "attention.jsonl")):
        key = (j.get("method"), j.get("seq_len"), bool(j.get("overlap")), j.get("chunks", 0),
               env_of(j))
        (plans if j.get("device") == "meta" else runs)[key] = j
    if not runs:
        return "No attention.jsonl rows."
    rows = []
    for key in sorted(runs, key=lambda k: (k[1], str(k[0]), k[2], k[4])):
        j = runs[key]
        method, s, overlap, chunks, env = key
        t = num(j.get("fwd_s")) + num(j.get("bwd_s"))
        plan = plans.get((method, s, overlap, chunks, ""))
        plan_cell = "—"
        if plan:
            plan_cell = gib(plan.get("peak_bytes")) + (" (= run)" if plan.get("peak_bytes") == j.get("peak_bytes")
                                                    else " (run differs)")
        ratio = "—"
        if method == "upipe" and not overlap:
            u = runs.get(("ulysses", s, False, chunks, env))
            if u:
                r = (num(u.get("fwd_s")) + num(u.get("bwd_s"))) / t
                ratio = "%.2fx %s" % (r, "met" if r >= 0.95 else "not met")
        label = method + (" --overlap" if overlap else "") + (" --chunks %d" % chunks if chunks else "")
        rows.append([label, env or "default", s, "%.3f" % num(j.get("fwd_s")),
                     "%.3f" % num(j.get("bwd_s")), "%.0f" % num(j.get("tokens_per_s", 0)),
                     gib(j.get("attn_peak_bytes")),
                     "=" if j.get("attn_peak_bytes") == j.get("attn_formula_bytes") else "differs",
                     gib(j.get("peak_bytes")), plan_cell,
                     gib(j["driver_bytes_outside_arena"]) if "driver_bytes_outside_arena" in j
                     else "—", ratio])
    return table(["method", "env", "S", "fwd s", "bwd s", "tokens/s", "attn peak", "= formula",
                  "arena peak", "plan", "outside arena", "ulysses time / upipe time (target >= 0.95)"],
                 rows)


def strategies_part(d):
    rows = []
    for j in jsonl(os.path.join(d, "strategies.jsonl")):
        errs = j.get("max_abs_err") or {}
        tol = j.get("tolerance") or {}
        ratios = [num(errs[k]) / num(tol[k]) for k in errs if tol.get(k)]
        worst = float("nan") if any(r != r for r in ratios) else max(ratios, default=0.0)
        rows.append([j.get("method"), j.get("ranks"), j.get("dtype"),
                     "yes" if j.get("overlap") else "", env_of(j) or "default",
                     "passed" if j.get("passed") else "FAILED", "%.2f" % worst,
                     "=" if j.get("attn_peak_bytes") == j.get("attn_formula_bytes") else "differs"])
    if not rows:
        return "No strategies.jsonl rows."
    return table(["method", "ranks", "dtype", "overlap", "env", "vs local", "worst err / tolerance",
                  "attn peak = formula"], rows)


def eval_part(d):
    def model(m):  # a fixture's folder name rather than its whole path
        m = str(m)
        return os.path.basename(os.path.dirname(m)) if m.endswith(".json") else m

    rows = [[model(j.get("model")), j.get("method"), j.get("ranks"), j.get("dtype", "fp32"),
             "%.7f" % num(j["loss"]), j.get("tokens")]
            for j in jsonl(os.path.join(d, "eval.jsonl")) if "loss" in j]
    if not rows:
        return "No eval.jsonl rows."
    return table(["model", "method", "ranks", "dtype", "loss", "tokens"], rows)


def section(d):
    name, commit = gpu_name(d)
    peak = peak_of(name)
    stamp = "_Generated by `bench/gpu_results.py` on %s from bench/gpu_check.sh's files (commit %s)._" % (
        datetime.date.today().isoformat(), commit)
    parts = ["## GPU: %s (bench/gpu_check.sh)" % name, stamp, "",
             "Steps (rc 124: the step's time limit; 125: skipped, out of the run's budget):", "",
             steps_part(d), "", backend_ops_part(d), "",
             "### Attention kernels (`upipe bench kernel --backend cuda`)", "",
             ("Against a dense bf16 peak of %.0f TFLOP/s." % peak) if peak else
             "No known bf16 peak for this GPU: no percentages.", "", kernel_part(d, peak), "",
             "### Attention block on one GPU (`upipe bench attention --backend cuda`)", "",
             attention_part(d), "",
             "### Every strategy against local (`upipe check --backend cuda`)", "",
             strategies_part(d), "",
             "### The model against transformers (`upipe eval --backend cuda`)", "", eval_part(d)]
    return "\n".join(parts).rstrip()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="gpu_check.sh's output folder")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "docs", "results.md"))
    args = ap.parse_args()
    if not os.path.isdir(args.dir):
        print("gpu_results: %s is not a folder" % args.dir, file=sys.stderr)
        return 2
    fresh = section(args.dir)
    head = PAGE_HEAD
    sections_text = merge_sections(args.out, [fresh])
    with open(args.out, "w") as f:
        f.write("\n".join(head) + "\n" + "\n\n".join(sections_text) + "\n")
    print("wrote " + args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
