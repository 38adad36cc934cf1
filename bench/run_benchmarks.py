#!/usr/bin/env python3
"""Runs upipe's benchmarks and writes docs/results.md (and plots in docs/img/).

Nothing on the results page is typed by hand: every number comes from a `upipe bench` run made
by this script, whose command lines, as run, are printed next to the tables. Usage:

    python3 bench/run_benchmarks.py [--build build] [--quick] [--only SECTION,...] [--out DIR]

By default it replaces the sections it runs in docs/results.md (the page keeps the others) and their
plots in docs/img/, and says so before it starts; --out DIR writes DIR/results.md and DIR/img/
instead (--out FILE.md: that page, img/ beside it), e.g. to try it without touching the docs.

A run that fails leaves its cause (upipe's error line) in its table cell; the page is still written
with what ran, and the script then names the sections with failures and exits 1.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPI = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-x", "OMP_NUM_THREADS=1"]
# The python with torch + transformers for the PyTorch baseline of the model section.
TORCH_PYTHON = os.environ.get("TORCH_PYTHON", "/tmp/hf/bin/python")
ALL_METHODS = ["ulysses", "upipe", "ring", "usp", "upipe-ring", "fpdt", "upipe-fpdt"]


# Every run that failed, as (command, cause); main() reports the sections that added to it.
FAILURES = []


def failure_cause(p):
    """Why a finished process failed, in one line: its last `upipe:` error line and its exit status,
    else its exit status and the last line of its output that is not blank, JSON or one of mpirun's
    banner rules."""
    lines = [l.strip() for l in (p.stdout or "").splitlines() + (p.stderr or "").splitlines()]
    lines = [l for l in lines if l and l.strip("-=") and not l.startswith("{")]
    ours = [l for l in lines if l.startswith("upipe:")]
    errors = [l for l in ours if l.startswith("upipe: error")]
    if p.returncode >= 0:
        status = "exit %d" % p.returncode
    else:
        try:
            status = "killed by %s" % signal.Signals(-p.returncode).name
        except ValueError:
            status = "killed by signal %d" % -p.returncode
    if errors or ours:
        return "%s (%s)" % ((errors or ours)[-1], status)
    return status + ("; last output: " + lines[-1] if lines else ", no output")


def failed(shown, err, expected=None):
    """Prints a failed run's cause and records it, unless err contains `expected` (a failure that
    the caller reports as a finding, e.g. a kernel path this CPU lacks)."""
    if expected and expected in err:
        print("  not run: " + err, flush=True)
    else:
        print("  failed: " + err, flush=True)
        FAILURES.append((shown, err))
    return shown, None, err


def shown_path(path):
    """A path as the page shows it: from the repository's root when it is inside, else as it is."""
    rel = os.path.relpath(path, ROOT)
    return path if rel.startswith("..") else rel


def shown_command(cmd, env_extra=None):
    """The command line as run, to print and put on the page: the environment it sets (OMP_NUM_THREADS=1
    comes with mpirun's -x), mpirun's flags, and the binary's path from the repository's root."""
    env = dict(env_extra or {})
    if cmd[0] != MPI[0]:
        env = dict(OMP_NUM_THREADS="1", **env)
    show = lambda a: shown_path(a) if a in (UPIPE, TORCH_PYTHON) else a
    return " ".join(["%s=%s" % kv for kv in env.items()] + [shlex.quote(show(a)) for a in cmd])


def run(args, ranks=None, env_extra=None, expected=None):
    """Runs one upipe command with --json; returns (command string, parsed JSON or None, error)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    cmd = ([*MPI, "-np", str(ranks)] if ranks else []) + [UPIPE] + args + ["--json"]
    shown = shown_command(cmd, env_extra)
    print("+ " + shown, flush=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    except OSError as e:  # mpirun (or the binary) cannot be started
        return failed(shown, "cannot run %s: %s" % (cmd[0], e.strerror), expected)
    if p.returncode != 0:
        return failed(shown, failure_cause(p), expected)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return failed(shown, "no JSON line in the output (exit 0)", expected)
    return shown, json.loads(lines[-1]), None


def mib(b):
    return "%.1f MiB" % (b / 2**20)


def gib(b):
    return "%.2f GiB" % (b / 2**30)


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# upipe's error when UPIPE_CPU_ISA names a path this CPU does not have: a finding, not a failure.
LACKS_ISA = "this CPU lacks"
# The CPU kernels' paths (docs/kernels.md, "Dispatch"), each with oneDNN on the same ISA.
KERNEL_PATHS = [("avx2", {"UPIPE_CPU_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}),
                ("avx512", {"UPIPE_CPU_ISA": "avx512"}),
                ("avx512bf16", {"UPIPE_CPU_ISA": "avx512bf16"}),
                ("amx", {"UPIPE_CPU_ISA": "amx"})]


def section_kernel(quick):
    """Attention kernels and memory-bound kernels on every path this CPU has."""
    s, iters = (4096, 2) if quick else (8192, 3)
    rows, ops_rows, ops_failed, cmds, missing, cpu, rate = [], [], [], [], [], "?", {}
    ops_names = []
    for path, env in KERNEL_PATHS:
        for dt in ["fp32", "bf16"]:
            cmd, j, err = run(["bench", "kernel", "--seq-len", str(s), "--heads", "8", "--kv-heads", "2",
                               "--head-dim", "64", "--dtype", dt, "--iters", str(iters)], env_extra=env,
                             expected=LACKS_ISA)
            if j is None and LACKS_ISA in err:
                if path not in missing:
                    missing.append(path)
                break
            cmds.append(cmd)
            if j is None:
                rows.append([path, "", dt, "failed: " + err] + [""] * 6)
                continue
            cpu = j["cpu"]
            # Each run's rates over its own GEMM's (timed in the same iterations), so the ratio does
            # not see the machine's drift between the two runs.
            rate[(path, dt)] = (j["fwd_vs_gemm"], j["bwd_vs_gemm"])
            vs_fp32 = ""
            if dt == "bf16" and (path, "fp32") in rate:
                f32 = rate[(path, "fp32")]
                vs_fp32 = "%.2f / %.2f" % (j["fwd_vs_gemm"] / f32[0], j["bwd_vs_gemm"] / f32[1])
            rows.append([j["isa"], j["onednn_isa"], dt, "%.3f" % j["fwd_s"], "%.3f" % j["bwd_s"],
                         "%.1f" % (j["fwd_tflops"] * 1e3), "%.1f" % (j["bwd_tflops"] * 1e3),
                         "%.1f" % (j["gemm_tflops"] * 1e3), "%.2f / %.2f" % (j["fwd_vs_gemm"], j["bwd_vs_gemm"]),
                         vs_fp32])
        if path in missing:
            continue
        cmd, j, err = run(["bench", "ops", "--iters", "3" if quick else "5"], env_extra={"UPIPE_CPU_ISA": path})
        cmds.append(cmd)
        if j is not None:
            ops_rows.append([j["isa"]] + ["%.1f (%.2f×)" % (o["gb_per_s"], o["vs_copy"]) for o in j["ops"]])
            ops_names = [o["op"] for o in j["ops"]]
        else:
            ops_failed.append("%s: %s" % (path, err))
    text = ["## Attention kernel (one thread)",
            "CPU: %s. Causal flash attention, S=%d, H=8, K=2, d=64, on each of the CPU kernels' paths "
            "(`UPIPE_CPU_ISA`; the avx2 rows with oneDNN capped to AVX2 too). FLOPs: forward 2·S²·H·d, "
            "backward 2.5× forward; GEMM = oneDNN fp32 (min(S,4096))² × d timed in the same iterations, on "
            "oneDNN's ISA of the row. Targets: forward ≥ 0.80×, backward ≥ 0.75× the GEMM rate on each path; "
            "bf16 ≥ 1.6× fp32 on avx512bf16 and amx (*bf16 / fp32*: the ratio of the two rows' rates on the same path, each "
            "over the GEMM of its own run)." % (cpu, s), ""]
    if missing:
        text += ["Paths this CPU lacks (not run): %s." % ", ".join(missing), ""]
    text += [table(["kernels", "oneDNN", "dtype", "fwd s", "bwd s", "fwd GFLOP/s", "bwd GFLOP/s",
                    "GEMM GFLOP/s", "fwd / bwd vs GEMM", "bf16 / fp32"], rows), ""]
    if ops_rows or ops_failed:
        text += ["### Memory-bound kernels (one thread)",
                 "`upipe bench ops`: (4096, 4096) fp32 tensors (bf16 where converted), GB/s of the bytes each "
                 "op must read and write, and in brackets the ratio to a plain copy (memcpy) of the same "
                 "tensors timed in the same iterations. Target: ≥ 0.70× the copy.", ""]
        if ops_rows:
            text += [table(["kernels"] + ops_names, ops_rows), ""]
        if ops_failed:
            text += ["Failed: %s." % "; ".join(ops_failed), ""]
    text += ["Commands:", "```", *cmds, "```"]
    return "\n".join(text), None


def section_memory(quick):
    s = 4096 if quick else 8192
    base = ["bench", "attention", "--seq-len", str(s), "--heads", "32", "--kv-heads", "8", "--head-dim", "64",
            "--iters", "1"]
    rows, cmds, data = [], [], []
    ul = None
    for method, u in [("ulysses", 0), ("upipe", 4), ("upipe", 8), ("upipe", 16), ("upipe", 32)]:
        cmd, j, err = run(base + ["--method", method] + (["--stage-heads", str(u)] if u else []), ranks=4)
        cmds.append(cmd)
        if j is None:
            rows.append([method, u or "", "failed: " + err, "", "", "", ""])
            continue
        if method == "ulysses":
            ul = j
        ratio = j["attn_peak_bytes"] / ul["attn_peak_bytes"] if ul else float("nan")
        rows.append([method, u or "H", mib(j["attn_peak_bytes"]), mib(j["attn_formula_bytes"]),
                     "%.2f" % ratio, "%.2f" % (j["fwd_s"] + j["bwd_s"]), "%.0f" % j["tokens_per_s"]])
        data.append((method if method == "ulysses" else "upipe U=%d" % u, j["attn_peak_bytes"], j["peak_by_tag"]))
    text = ["## UPipe vs Ulysses: memory (4 ranks, measured)",
            "S=%d, H=32, K=8, d=64, fp32, 4 ranks on 2 cores. Attention intermediates = per-rank peak of "
            "every device byte but x, dy, y, dx and weight gradients (max over ranks), measured by the "
            "arena and next to the closed-form formula. Target: upipe U=C ≤ 0.4× ulysses." % s, "",
            table(["method", "U", "attn peak (measured)", "formula", "vs ulysses", "fwd+bwd s", "tokens/s"], rows),
            "", "Commands:", "```", *cmds, "```"]
    return "\n".join(text), data


def section_speed(quick):
    s = 8192 if quick else 16384
    reps = 2 if quick else 3
    base = ["bench", "attention", "--seq-len", str(s), "--heads", "16", "--kv-heads", "4", "--head-dim", "64",
            "--iters", "1"]
    configs = [("ulysses", 0), ("upipe", 2), ("upipe", 4), ("upipe", 8)]
    best, cmds = {}, []
    # Interleaved repetitions, best of each: this VM's speed drifts by ~10% over minutes, so
    # back-to-back runs of one method would compare the machine, not the methods.
    for _ in range(reps):
        for method, u in configs:
            cmd, j, err = run(base + ["--method", method] + (["--stage-heads", str(u)] if u else []), ranks=2)
            if cmd not in cmds:
                cmds.append(cmd)
            if j is not None and ((method, u) not in best or
                                  j["fwd_s"] + j["bwd_s"] < best[(method, u)]["fwd_s"] + best[(method, u)]["bwd_s"]):
                best[(method, u)] = j
    rows = []
    ref = best.get(("ulysses", 0))
    for method, u in configs:
        j = best.get((method, u))
        if j is None:
            rows.append([method, u or "", "failed", "", "", "", ""])
            continue
        speed = (ref["fwd_s"] + ref["bwd_s"]) / (j["fwd_s"] + j["bwd_s"]) if ref else float("nan")
        rows.append([method, u or "H", "%.2f" % j["fwd_s"], "%.2f" % j["bwd_s"], "%.0f" % j["tokens_per_s"],
                     "%.3f" % speed, mib(j["attn_peak_bytes"])])
    text = ["## UPipe vs Ulysses: speed (2 ranks)",
            "S=%d, H=16, K=4, d=64, fp32, 2 ranks, one thread each; each configuration run %d times, "
            "interleaved, best run shown (one warm-up iteration, then one timed forward + backward). "
            "Target: upipe U=C at ≥ 0.95× ulysses' speed." % (s, reps), "",
            table(["method", "U", "fwd s", "bwd s", "tokens/s", "speed vs ulysses", "attn peak"], rows),
            "", "Commands (each run %d times):" % reps, "```", *cmds, "```"]
    return "\n".join(text), None


def section_overlap(quick):
    s = 8192 if quick else 16384
    reps = 2 if quick else 3
    base = ["bench", "attention", "--seq-len", str(s), "--heads", "16", "--kv-heads", "4", "--head-dim", "64",
            "--iters", "1"]
    configs = [("upipe", ["--stage-heads", "2"]), ("upipe-fpdt", ["--stage-heads", "2", "--chunks", "2"])]
    best, cmds = {}, []
    for _ in range(reps):  # interleaved, best of each (see the speed section)
        for method, knobs in configs:
            for overlap in (False, True):
                cmd, j, err = run(base + ["--method", method] + knobs + (["--overlap"] if overlap else []),
                                  ranks=2)
                if cmd not in cmds:
                    cmds.append(cmd)
                key = (method, overlap)
                if j is not None and (key not in best or j["fwd_s"] + j["bwd_s"] <
                                      best[key]["fwd_s"] + best[key]["bwd_s"]):
                    best[key] = j
    rows = []
    for method, knobs in configs:
        off = best.get((method, False))
        for overlap in (False, True):
            j = best.get((method, overlap))
            if j is None:
                rows.append([method, "on" if overlap else "off", "failed", "", "", "", ""])
                continue
            ratio = (off["fwd_s"] + off["bwd_s"]) / (j["fwd_s"] + j["bwd_s"]) if off else float("nan")
            rows.append([method + " " + " ".join(knobs), "on" if overlap else "off", "%.2f" % j["fwd_s"],
                         "%.2f" % j["bwd_s"], "%.3f" % ratio, mib(j["attn_peak_bytes"]),
                         mib(j["attn_formula_bytes"])])
    # Planned: a Llama-3-8B block on 8 ranks, the memory overlap costs at long sequences.
    prows = []
    for method, knobs in [("upipe", ["--stage-heads", "8"]), ("upipe", ["--stage-heads", "16"]),
                          ("upipe-fpdt", ["--stage-heads", "8", "--chunks", "8"])]:
        cells = [method + " " + " ".join(knobs)]
        for overlap in (False, True):
            cmd, j, err = run(plan_cmd(2**20, method, knobs + (["--overlap"] if overlap else [])))
            cmds.append(cmd)
            cells.append(gib(j["attn_peak_bytes"]) if j else "n/a")
        prows.append(cells)
    text = ["## UPipe stage overlap (--overlap)",
            "Measured: S=%d, H=16, K=4, d=64, fp32, 2 ranks, one thread each; each configuration run %d times, "
            "interleaved, best shown. *speed vs off* = time without overlap / time with it. On the CPU the "
            "non-blocking all-to-alls only progress inside MPI calls (one thread per rank, no progress thread), "
            "so little or no gain is expected here: the schedule is for devices whose collectives run on their "
            "own stream (NCCL). The results are bitwise those without overlap (tests/multirank/"
            "test_strategies.cpp, StageOverlap); the memory it costs is exact (measured = formula)." % (s, reps), "",
            table(["method", "overlap", "fwd s", "bwd s", "speed vs off", "attn peak", "formula"], rows), "",
            "Planned attention intermediates per rank, Llama-3-8B block (H=32, K=8, d=128, bf16), 8 ranks, S=1024K "
            "(meta device):", "",
            table(["method", "overlap off", "overlap on"], prows), "",
            "Commands:", "```", *cmds, "```"]
    return "\n".join(text), None


def section_all(quick):
    s = 4096 if quick else 8192
    base = ["bench", "attention", "--seq-len", str(s), "--heads", "16", "--kv-heads", "4", "--head-dim", "64",
            "--iters", "1"]
    extra = {"upipe": ["--stage-heads", "4"], "usp": ["--ulysses-degree", "2"],
             "upipe-ring": ["--ulysses-degree", "2", "--stage-heads", "2"], "fpdt": ["--chunks", "4"],
             "upipe-fpdt": ["--chunks", "4", "--stage-heads", "4"]}
    rows, cmds = [], []
    for method in ALL_METHODS:
        cmd, j, err = run(base + ["--method", method] + extra.get(method, []), ranks=4)
        cmds.append(cmd)
        if j is None:
            rows.append([method, "not available: " + err, "", "", "", ""])
            continue
        rows.append([method, "%.2f" % j["fwd_s"], "%.2f" % j["bwd_s"], "%.0f" % j["tokens_per_s"],
                     mib(j["attn_peak_bytes"]), mib(j["peak_bytes"])])
    text = ["## All strategies (4 ranks, measured)",
            "S=%d, H=16, K=4, d=64, fp32, 4 ranks on 2 cores (so times are ~2× what 4 cores would give; "
            "compare them with each other)." % s, "",
            table(["method", "fwd s", "bwd s", "tokens/s", "attn peak", "total peak"], rows), "",
            "Commands:", "```", *cmds, "```"]
    return "\n".join(text), None


def section_documents(quick):
    """Packed documents: time of one attention block (forward + backward) against the number of
    equal documents per sequence, for local (1 rank), upipe and ring (2 ranks)."""
    s = 8192 if quick else 16384
    counts = [4, 16, 64] if quick else [4, 16, 64, 256]
    shapes = [("attention-bound block (D = 64)", ["--hidden-size", "64"]),
              ("D = H d = 512", [])]
    base = ["bench", "attention", "--seq-len", str(s), "--heads", "8", "--kv-heads", "2",
            "--head-dim", "64", "--iters", "1"]
    runs = [("local", 1, []), ("upipe", 2, ["--stage-heads", "2"]), ("ring", 2, [])]
    text, cmds = ["## Packed documents: time vs documents per sequence",
                  "S=%d, H=8, K=2, d=64, fp32; n documents of S/n tokens each. One forward + "
                  "backward of the attention block (projections included), slowest rank; "
                  "\"1 document\" is the same S unpacked. The projections do not shrink with the "
                  "documents, so with D = H d = 512 they bound the block's speedup (by FLOPs at "
                  "about 12x for 64 documents); the attention-bound shape (D = 64, the same "
                  "attention) shows the kernels' skipping. docs/documents.md." % s, ""], []
    # A list of n equal lengths L shown as "L,... (n × L)": the rest of the command as run.
    short = lambda c: re.sub(r"--doc-lens (\d+)((,\1){4,})",
                             lambda m: "--doc-lens %s,... (%d × %s)" % (m.group(1), m.group(2).count(",") + 1,
                                                                      m.group(1)), c)
    for label, extra_shape in shapes:
        header = ["method", "ranks", "1 document"] + ["%d docs" % n for n in counts] + \
                 ["speedup at 64 docs"]
        rows = []
        for method, ranks, knobs in runs:
            cmd, j, err = run(base + extra_shape + ["--method", method] + knobs, ranks=ranks)
            cmds.append(short(cmd))
            one = j["fwd_s"] + j["bwd_s"] if j else None
            times = []
            for n in counts:
                lens = ",".join([str(s // n)] * n)
                cmd, j, err = run(base + extra_shape + ["--method", method, "--doc-lens", lens,
                                                        "--no-one-document"] + knobs, ranks=ranks)
                cmds.append(short(cmd))
                times.append(j["fwd_s"] + j["bwd_s"] if j else "failed: " + err)
            fmt = lambda t: "%.3f s" % t if isinstance(t, float) else str(t)
            at = times[counts.index(64)] if 64 in counts else None
            speed = "%.1fx" % (one / at) if isinstance(at, float) and one else ""
            rows.append([method, ranks, fmt(one) if one else "failed"] + [fmt(t) for t in times] +
                        [speed])
        text += ["### " + label, "", table(header, rows), ""]
    text += ["Commands (document lists shortened):", "```", *cmds, "```"]
    return "\n".join(text), None


PLAN_VARIANTS = [  # (label, method, knobs): the variants the strategy docs discuss
    ("upipe U=8", "upipe", ["--stage-heads", "8"]),
    ("usp u=2", "usp", ["--ulysses-degree", "2"]),
    ("usp u=4", "usp", ["--ulysses-degree", "4"]),
    ("upipe-ring u=1 U=1", "upipe-ring", ["--ulysses-degree", "1", "--stage-heads", "1"]),
    ("upipe-ring u=2 U=2", "upipe-ring", ["--ulysses-degree", "2", "--stage-heads", "2"]),
    ("upipe-ring u=4 U=4", "upipe-ring", ["--ulysses-degree", "4", "--stage-heads", "4"]),
    ("fpdt N=16", "fpdt", ["--chunks", "16"]),
    ("fpdt N=64", "fpdt", ["--chunks", "64"]),
    ("upipe-fpdt U=8 N=16", "upipe-fpdt", ["--chunks", "16", "--stage-heads", "8"]),
    ("upipe-fpdt U=8 N=64", "upipe-fpdt", ["--chunks", "64", "--stage-heads", "8"]),
]


def plan_cmd(s, method, knobs):
    return ["bench", "attention", "--meta-ranks", "8", "--seq-len", str(s), "--heads", "32", "--kv-heads", "8",
            "--head-dim", "128", "--dtype", "bf16", "--rope-theta", "500000", "--method", method] + knobs


def comm_cell(j, op):
    c = j["comm"].get(op)
    return "—" if not c else "%s (%d calls)" % (gib(c["bytes"]), c["calls"])


def section_plan(quick):
    lens = [2**17, 2**19, 2**20, 2**22]
    extra = {"upipe": ["--stage-heads", "8"], "usp": ["--ulysses-degree", "4"],
             "upipe-ring": ["--ulysses-degree", "4", "--stage-heads", "4"], "fpdt": ["--chunks", "8"],
             "upipe-fpdt": ["--chunks", "8", "--stage-heads", "8"]}
    series, rows, cmds = {}, [], []
    for method in ALL_METHODS:
        row = [method + (" " + " ".join(extra[method]) if method in extra else "")]
        for s in lens:
            cmd, j, err = run(plan_cmd(s, method, extra.get(method, [])))
            cmds.append(cmd)
            if j is None:
                row.append("n/a")
                continue
            series.setdefault(method, []).append((s, j["attn_peak_bytes"]))
            row.append(gib(j["attn_peak_bytes"]))
        rows.append(row)
    # Variants at 1M and 4M tokens, with the collective traffic of one layer (forward + backward).
    vrows = []
    for label, method, knobs in [("ulysses", "ulysses", []), ("ring", "ring", [])] + PLAN_VARIANTS:
        cells = [label]
        for s in (2**20, 2**22):
            cmd, j, err = run(plan_cmd(s, method, knobs))
            cmds.append(cmd)
            cells.append(gib(j["attn_peak_bytes"]) if j else "n/a")
            if s == 2**20:
                comm = j
        cells += [comm_cell(comm, "all_to_all") if comm else "n/a",
                  comm_cell(comm, "all_to_allv") if comm else "n/a",
                  comm_cell(comm, "sendrecv") if comm else "n/a"]
        vrows.append(cells)
    # The block's output dtype (docs/memory.md, "What the block allocates in each mode"): a bf16
    # y / dx needs an fp32 (S/C, D) accumulator, an fp32 residual stream does not.
    mrows = []
    for label, knobs in [("bf16 (--residual-dtype bf16)", ["--residual-dtype", "bf16"]), ("fp32 (default)", [])]:
        cmd = ["bench", "attention", "--meta-ranks", "8", "--method", "upipe", "--seq-len", str(2**20),
               "--heads", "64", "--kv-heads", "8", "--head-dim", "128", "--dtype", "bf16"] + knobs
        shown, j, err = run(cmd)
        cmds.append(shown)
        if j is None:
            mrows.append([label, "failed: " + err, "", "", ""])
            continue
        tags = j["peak_by_tag"]
        mrows.append([label, "%d B (%s)" % (j["attn_peak_bytes"], gib(j["attn_peak_bytes"])),
                      "%d B" % j["attn_formula_bytes"], "%d B" % tags.get("attn_grad", 0),
                      "%d B" % tags.get("workspace", 0), gib(j["peak_bytes"])])
    text = ["## Planned: Llama-3-8B attention block on 8 ranks (meta device)",
            "H=32, K=8, d=128, bf16; per-rank attention intermediates computed by running the strategy's own "
            "code on the meta device (allocations counted, nothing backed) — the same numbers a real run "
            "measures (tests/unit/test_meta.cpp).", "",
            table(["method"] + ["S=%dK" % (s // 1024) for s in lens], rows), "",
            "Variants, with the bytes one rank sends per layer (forward + backward) at S=1024K:", "",
            table(["variant", "attn peak S=1024K", "attn peak S=4096K", "all-to-all", "all-to-all-v",
                   "sendrecv"], vrows), "",
            "Output dtype of the block (y, dy, dx), upipe U=C, H=64, K=8, d=128 (D=8192), S=1024K, bf16 "
            "compute, 8 ranks (docs/memory.md explains the difference: the fp32 (S/C, D) dx accumulator):", "",
            table(["y, dy, dx", "attention peak", "formula", "attn_grad at the peak",
                   "workspace at the peak", "rank's total peak"], mrows), "",
            "Commands (one per cell):",
            "```", *cmds, "```"]
    return "\n".join(text), series


def section_plan_model(quick):
    """The longest trainable S per method for whole models (upipe plan --max-seq-len)."""
    setups = [("llama3-8b", 8), ("qwen3-32b", 16)]
    text = ["## Planned: max trainable sequence per method, whole training step (upipe plan)",
            "One complete training step (ZeRO-3 gathers and reduce-scatters, forward, backward, AdamW) of "
            "every rank on the meta device (docs/planner.md); 80 GiB of device memory per rank (H100) with "
            "the default 2 GiB reserve, 256 GiB of host memory per rank, bf16, the stash offloaded to the "
            "host, auto knobs (fewest stages that fit); S to a multiple of 64Ki tokens. The limit is "
            "the arena one granule more would exceed and its largest tag at the peak (`limit` of `upipe plan --json`). Each model twice: an exact fp32 stash (each layer's input), "
            "and `--stash-dtype bf16` (half the stash bytes on device and host; its measured "
            "gradient error on the transformers fixtures is in docs/model.md).", ""]
    cmds, data = [], {}
    for model, ranks, ckpt in [(m, r, c) for m, r in setups for c in ("fp32", "bf16")]:
        args = ["plan", "--model", model, "--ranks", str(ranks), "--device-memory", "80G",
                "--host-memory", "256G", "--dtype", "bf16", "--offload-stash", "--stash-dtype", ckpt,
                "--method", "all", "--stage-heads", "auto", "--ulysses-degree", "auto", "--chunks", "auto",
                "--max-seq-len"]
        shown, j, err = run(args)
        cmds.append(shown)
        rows = []
        if j is None:
            rows.append(["failed: " + err] + [""] * 6)
        else:
            for m in j["methods"]:
                if "error" in m:
                    rows.append([m["method"], "not allowed: " + m["error"], "", "", "", "", ""])
                    continue
                k = m["resolved_knobs"]
                knobs = " ".join(("%s=%d" % (n, k[key])) for n, key in (("U", "stage_heads"), ("u", "ulysses_degree"),
                                                                       ("N", "chunks")) if k[key]) or "—"
                t = m["peak_by_tag"]
                rows.append([m["method"], knobs, "%d (%.2fM)" % (m["seq_len"], m["seq_len"] / 1e6),
                             gib(m["device_peak_bytes"]), gib(m["host_peak_bytes"]),
                             "%s %s (%s)" % (m["limit"]["arena"] or "S", m["limit"]["tag"] or "past the longest",
                                             gib(m["limit"]["bytes"]) if m["limit"]["bytes"] else "—"),
                             ", ".join("%s %s" % (n, gib(b)) for n, b in sorted(t.items(), key=lambda x: -x[1])[:5])])
            data[(model, ckpt)] = j
        text += ["### %s on %d x 80 GiB, %s stash" % (model, ranks, ckpt), "",
                 table(["method", "knobs", "max S", "device peak", "host peak", "limit",
                        "largest tags at the peak"], rows), ""]
    best = data.get(("llama3-8b", "bf16"))
    if best:
        by = {m["method"]: m for m in best["methods"] if "seq_len" in m}
        if all(k in by for k in ("upipe", "ulysses", "upipe-fpdt")):
            up = by["upipe"]
            text += ["**Headline** (Llama-3-8B, 8 x 80 GiB, bf16 stash): upipe plans %s tokens, "
                     "ulysses %s, upipe-fpdt %s (the UPipe authors report 5M with UPipe and under 3M with "
                     "Ulysses on 8 H100s). At its maximum upipe's largest tag is `%s` (%s); its top tags: %s." % (
                         format(up["seq_len"], ","), format(by["ulysses"]["seq_len"], ","),
                         format(by["upipe-fpdt"]["seq_len"], ","), up["largest_device_tag"],
                         gib(up["peak_by_tag"][up["largest_device_tag"]]),
                         ", ".join("%s %s" % (n, gib(b)) for n, b in
                                   sorted(up["peak_by_tag"].items(), key=lambda x: -x[1])[:6]))]
            top = max(by.values(), key=lambda m: m["seq_len"])
            knobs = top["knobs_text"] if top["knobs_text"] != "-" else ""
            text += ["The longest of all methods: %s%s, %s tokens (device %s, host %s of 256 GiB)." % (
                top["method"], " (%s)" % knobs if knobs else "", format(top["seq_len"], ","),
                gib(top["device_peak_bytes"]), gib(top["host_peak_bytes"])), ""]
    # Peak vs S for Llama-3-8B (every method, bf16 stash offloaded), budgets unlimited so
    # that every point is planned in full.
    curve = {}
    for mi in (1, 2, 3, 4, 5, 6, 7):
        seq = mi * 2**20
        shown, j, err = run(["plan", "--model", "llama3-8b", "--ranks", "8", "--device-memory", "100000G",
                             "--host-memory", "100000G", "--dtype", "bf16", "--offload-stash",
                             "--stash-dtype", "bf16", "--method", "all", "--seq-len", str(seq)])
        cmds.append(shown)
        for m in (j or {}).get("methods", []):
            if "device_peak_bytes" in m:
                curve.setdefault(m["method"], []).append((seq, m["device_peak_bytes"]))
    data["curve"] = curve
    text += ["Commands:", "```", *cmds, "```"]
    return "\n".join(text), data


def section_plan_scale(quick):
    """Seconds `upipe plan --max-seq-len --method all` takes as the rank count grows."""
    base = ["plan", "--model", "llama3-8b", "--max-seq-len", "--method", "all", "--offload-stash",
            "--stash-dtype", "bf16", "--device-memory", "80G"]
    auto = ["--stage-heads", "auto", "--ulysses-degree", "auto", "--chunks", "auto"]
    setups = [(n, []) for n in ((8, 64) if quick else (8, 16, 32, 64, 1024))]
    setups += [(n, auto) for n in ((64,) if quick else (64, 1024))]
    cmds, rows = [], []
    for ranks, knobs in setups:
        shown, j, err = run(base + ["--ranks", str(ranks)] + knobs)
        cmds.append(shown)
        if j is None:
            rows.append([ranks, "auto" if knobs else "default", "failed: " + err, "", ""])
            continue
        planned = [m for m in j["methods"] if "seq_len" in m]
        rows.append([ranks, "auto" if knobs else "default",
                     "%.1f" % j["plan_seconds"],
                     ", ".join("%s %.2fM (%d)" % (m["method"], m["seq_len"] / 1e6, m["rank_classes"])
                               for m in planned) or "none",
                     len(j["methods"]) - len(planned)])
    text = ["## Planner time at scale (upipe plan --max-seq-len, every method)",
            "The whole `--max-seq-len` search of every method for Llama-3-8B (fp32, 80 GiB device, 256 GiB "
            "host, stash offloaded in bf16), CP = all ranks, one process. Every rank is planned; the ranks "
            "of a rank class allocate alike and one of them is played for all (docs/planner.md, \"Rank "
            "classes\"). Seconds as the command reports them (`plan_seconds`), on the machine above, "
            "which other jobs may share.", "",
            table(["ranks", "knobs", "seconds", "max S per method (rank classes played)",
                   "methods not allowed"], rows), "",
            "Commands:", "```", *cmds, "```"]
    return "\n".join(text), None


def plot_plan_model(data, bars_path, curve_path):
    """A stacked per-tag bar chart at each method's maximum, and device peak vs S (Llama-3-8B)."""
    j = data.get(("llama3-8b", "bf16"))
    if not j:
        return False
    plt = pyplot()
    methods = [m for m in j["methods"] if "peak_by_tag" in m]
    tags = sorted({t for m in methods for t in m["peak_by_tag"]},
                  key=lambda t: -max(m["peak_by_tag"].get(t, 0) for m in methods))
    fig, ax = plt.subplots(figsize=(8, 4.8))
    bottom = [0.0] * len(methods)
    for t in tags:
        v = [m["peak_by_tag"].get(t, 0) / 2**30 for m in methods]
        ax.bar(range(len(methods)), v, bottom=bottom, label=t)
        bottom = [b + x for b, x in zip(bottom, v)]
    ax.set_xticks(range(len(methods)))
    ax.set_xticklabels(["%s\n%.2fM" % (m["method"], m["seq_len"] / 2**20) for m in methods], fontsize=8)
    ax.axhline(78, color="k", lw=0.8, ls="--")
    ax.set_ylabel("device bytes per rank at the peak (GiB)")
    ax.set_title("Llama-3-8B, 8 x 80 GiB, bf16 stash offloaded: each method at its max S")
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(bars_path, dpi=110)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, pts in sorted(data.get("curve", {}).items()):
        ax.plot([p[0] / 2**20 for p in pts], [p[1] / 2**30 for p in pts], marker="o", label=method)
    ax.axhline(78, color="k", lw=0.8, ls="--", label="80 GiB - 2 GiB reserve")
    ax.set_xlabel("sequence length (Mi tokens)")
    ax.set_ylabel("device peak per rank (GiB)")
    ax.set_title("Llama-3-8B training step, 8 ranks, bf16 (planned, exact)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(curve_path, dpi=110)
    return True


COMM_OPS = ["all-to-all", "all-gather", "reduce-scatter", "all-reduce", "sendrecv"]


def section_comm(quick):
    sizes = [2**20, 2**24] + ([] if quick else [2**26])
    load = os.getloadavg()[0]
    rows, cmds = [], []
    for ranks in (2, 4):
        for op in COMM_OPS:
            for b in sizes:
                iters = "10" if b >= 2**26 else "20"
                cmd, j, err = run(["bench", "comm", "--op", op, "--bytes", "%dM" % (b // 2**20), "--iters", iters,
                                   "--warmup", "3"], ranks=ranks)
                cmds.append(cmd)
                if j is None:
                    rows.append([op, ranks, mib(b), "failed: " + err] + [""] * 5)
                    continue
                u, nb, m = j["upipe"], j["upipe_nonblocking"], j["mpi"]
                bw = lambda p: "%.2f / %.2f" % (p["algbw_gbps"], p["busbw_gbps"])
                rows.append([op, ranks, mib(j["bytes"]), "%.0f" % (u["time_s"] * 1e6), bw(u),
                             "%.0f" % (nb["time_s"] * 1e6), "%.0f" % (m["time_s"] * 1e6), bw(m),
                             "%.2f / %.2f" % (j["overhead"], j["overhead_nonblocking"])])
    text = ["## Communicator vs plain MPI (2 and 4 ranks, measured)",
            "Each collective through upipe's MPI communicator (blocking form, and the non-blocking form "
            "started and waited at once) and the plain MPI call on the same buffers (MPI_Alltoall, "
            "MPI_Allgather, MPI_Reduce_scatter_block on fp32 sums, MPI_Allreduce, MPI_Sendrecv in a ring). "
            "Definitions as in nccl-tests: *bytes* B is one rank's total buffer (all-to-all send buffer, "
            "all-gather output, reduce-scatter input, all-reduce buffer, sendrecv message), rounded down to "
            "a multiple of 4·ranks; algbw = B / time; busbw = algbw × (n−1)/n for all-to-all, all-gather "
            "and reduce-scatter, × 2(n−1)/n for all-reduce, × 1 for sendrecv; GB/s = 10⁹ B/s. Time = "
            "median over --iters calls (after 3 warm-up calls) of the slowest rank, a barrier before each; "
            "the three paths are interleaved call by call, so machine drift hits them alike. The data every "
            "path moves is checked before timing. Overhead = upipe time / MPI time (blocking / non-blocking). "
            "Shared-memory transport; the ranks share %d cores with other jobs (load average %.1f when this "
            "section started; 4 ranks are oversubscribed), so single rows can be far off: compare the three "
            "paths within a row, not rows with hardware peaks." % (os.cpu_count(), load), "",
            table(["op", "ranks", "bytes", "upipe µs", "upipe algbw / busbw GB/s", "non-blocking µs", "MPI µs",
                   "MPI algbw / busbw GB/s", "overhead"], rows), "",
            "Commands:", "```", *cmds, "```"]
    return "\n".join(text), None


# The model section's decoder: Llama-3 shape (GQA 4:1, d=64, SwiGLU), small enough that one step
# takes about a second on one core. Both engines read this same config.json (random weights).
MODEL_CONFIG = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 2,
                "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 8192,
                "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
                "tie_word_embeddings": False, "torch_dtype": "float32"}


def run_torch(config, s, iters, attn, dtype="fp32"):
    """The PyTorch eager step on the same model: (command string, parsed JSON or None, error)."""
    script = os.path.join(ROOT, "bench", "bench_model_torch.py")
    args = ["--config", config, "--seq-len", str(s), "--iters", str(iters), "--attn", attn, "--dtype", dtype]
    shown = shown_command([TORCH_PYTHON, "bench/bench_model_torch.py", "--config", "DIR/config.json"] + args[2:])
    print("+ " + shown, flush=True)
    p = subprocess.run([TORCH_PYTHON, script] + args, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        return failed(shown, failure_cause(p))
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return failed(shown, "no JSON line in the output (exit 0)")
    return shown, json.loads(lines[-1]), None


# (label, ranks, dtype, knobs) of the upipe rows and (label, attention, dtype) of PyTorch's.
MODEL_RUNS = [("upipe local", 1, "fp32", []),
              ("upipe local, no checkpoints (none)", 1, "fp32", ["--recompute", "none"]),
              ("upipe upipe (U=C)", 2, "fp32", []),
              ("upipe local, bf16", 1, "bf16", []),
              ("upipe local, bf16, no checkpoints (none)", 1, "bf16", ["--recompute", "none"])]
TORCH_RUNS = [("PyTorch eager, sdpa", "sdpa", "fp32"), ("PyTorch eager, eager attention", "eager", "fp32"),
              ("PyTorch eager, sdpa, bf16 autocast", "sdpa", "bf16")]


def model_rounds(d, s, iters, reps, have_torch):
    """Interleaved rounds of every row: (best JSON per label, per-round step times, commands)."""
    config = os.path.join(d, "config.json")
    base = ["bench", "model", "--model", d, "--random-weights", "--seq-len", str(s), "--iters", str(iters)]
    best, cmds, rounds = {}, [], []
    def keep(label, shown, j, this):
        if shown not in cmds:
            cmds.append(shown)
        if j is not None:
            this[label] = j["step_s"]
            if label not in best or j["step_s"] < best[label]["step_s"]:
                best[label] = j
    # This VM's speed drifts by tens of percent over minutes: each row shows its best round, the
    # ratio to PyTorch is taken within each round, then the median.
    for _ in range(reps):
        this = {}
        for label, ranks, dt, knobs in MODEL_RUNS:
            shown, j, _ = run(base + ["--dtype", dt, "--method", "upipe" if ranks > 1 else "local"] + knobs,
                              ranks=ranks if ranks > 1 else None)
            keep(label, shown.replace(d, "DIR"), j, this)
        for label, attn, dt in TORCH_RUNS if have_torch else []:
            shown, j, _ = run_torch(config, s, iters, attn, dt)
            keep(label, shown, j, this)
        rounds.append(this)
    return best, rounds, cmds


def section_model(quick):
    s, iters = (1024, 2) if quick else (4096, 3)
    reps = 1 if quick else 3
    have_torch = os.path.exists(TORCH_PYTHON)
    with tempfile.TemporaryDirectory(prefix="upipe_bench_model_") as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(MODEL_CONFIG, f)
        best, rounds, cmds = model_rounds(d, s, iters, reps, have_torch)
    torch_of = {"fp32": [l for l, _, dt in TORCH_RUNS if dt == "fp32"],
                "bf16": [l for l, _, dt in TORCH_RUNS if dt == "bf16"]}
    def ratio_median(label, dt):
        """Median over rounds of (the faster PyTorch step of the same dtype) / (label's step)."""
        rs = sorted(min(r[l] for l in torch_of[dt] if l in r) / r[label] for r in rounds
                    if label in r and any(l in r for l in torch_of[dt]))
        if not rs:
            return None
        return rs, (rs[len(rs) // 2] if len(rs) % 2 else (rs[len(rs) // 2 - 1] + rs[len(rs) // 2]) / 2)
    rows = []
    labels = [(r[0], r[2]) for r in MODEL_RUNS] + [(t[0], t[2]) for t in TORCH_RUNS]
    # MFU of a PyTorch row: upipe's model FLOPs of the same step over the GEMM rate upipe measured
    # in the same dtype (the best local row's run).
    upipe_of = {"fp32": best.get("upipe local"), "bf16": best.get("upipe local, bf16")}
    for label, dt in labels:
        j = best.get(label)
        if j is None:
            if label.startswith("upipe") or have_torch:
                rows.append([label, "failed"] + [""] * 11)
            continue
        rm = ratio_median(label, dt)
        ratio = ("%.2f× (%s)" % (rm[1], ", ".join("%.2f" % x for x in rm[0]))) if rm else "—"
        ref = j if "mfu" in j else upipe_of[dt]
        if ref:
            ranks = j.get("ranks", 1)
            mfu = "%.0f%%" % (100 * ref["model_flops"] / ranks / j["step_s"] / (ref["gemm_tflops_per_s"] * 1e12))
        else:
            mfu = "—"
        executed = ("%.1f" % (j["executed_tflops_per_s_per_rank"] * 1e3)) if "hfu" in j else "—"
        hfu = ("%.0f%%" % (100 * j["hfu"])) if "hfu" in j else "—"
        gemm = ("%.1f" % (j["gemm_tflops_per_s"] * 1e3)) if "gemm_tflops_per_s" in j else "—"
        rows.append([label, dt, j.get("ranks", 1), "%.3f" % j["step_s"], "%.3f" % j["fwd_s"], "%.3f" % j["bwd_s"],
                     "%.0f" % j["tokens_per_s"], mib(j["peak_bytes"]) if "peak_bytes" in j else "—", gemm, mfu,
                     executed, hfu, ratio])
    m = MODEL_CONFIG
    up = best.get("upipe local", {})
    tj = best.get("PyTorch eager, sdpa", {})
    text = ["## Whole model: upipe vs PyTorch eager (CPU, one thread per rank)",
            "CPU: %s; upipe's CPU kernels on the %s path (oneDNN chooses its own ISA). Llama decoder, D=%d, "
            "F=%d, L=%d, H=%d, K=%d, d=%d, V=%d (%.1f M parameters), S=%d random tokens, random weights. One "
            "training step = forward to transformers' `labels = input_ids` loss and backward to every gradient. "
            "upipe: `upipe bench model` (full activation checkpointing: each layer is recomputed in backward, so "
            "it does more arithmetic than PyTorch; `local` keeps the recompute's attention intermediates for the "
            "block's backward, the 2-rank strategy recomputes them once more; with `--recompute "
            "none` one rank recomputes nothing; T=1024 tiles; bf16: bf16 activations and compute weights, fp32 "
            "master weights and accumulation); PyTorch: transformers %s, torch %s, `torch.set_num_threads(1)`, "
            "no checkpointing, bf16 rows under `torch.autocast(\"cpu\", bfloat16)` (bench/bench_model_torch.py). "
            "Each row is the median of %d steps after a warm-up, the best of %d interleaved rounds; 2-rank times "
            "are the slower rank's, with both ranks on this machine's %d shared cores. *vs PyTorch* = in each "
            "round, the faster PyTorch step of the same dtype / this row's step time (> 1: upipe is faster); the "
            "median over the rounds, each round's ratio in brackets. *GEMM* = the 1024³ GEMM rate in the row's "
            "dtype that `bench model` measured on every rank before its steps (GFLOP/s per rank). *MFU* = model "
            "FLOPs (6 per matrix parameter per token plus causal attention's 6·S·H·d per token per layer, "
            "src/train/flops.h) per rank / step time / GEMM; PyTorch's rows use the GEMM rate of upipe's local "
            "row of the same dtype. *executed* = the GEMM and attention FLOPs the step ran, recompute included "
            "(src/backend/work_count.h; GFLOP/s per rank), and *HFU* = executed / GEMM: how close the whole step "
            "runs to the machine's GEMM rate. Target: upipe local fp32 ≥ 1.5× PyTorch eager with sdpa."
            % (up.get("cpu", platform.processor() or "?"), up.get("isa", "?"), m["hidden_size"],
               m["intermediate_size"], m["num_hidden_layers"], m["num_attention_heads"], m["num_key_value_heads"],
               m["head_dim"], m["vocab_size"], up["parameters"] / 1e6 if "parameters" in up else float("nan"), s,
               tj.get("transformers", "?"), tj.get("torch", "?"), iters, reps, os.cpu_count()), ""]
    if not have_torch:
        text += ["PyTorch baseline skipped: %s not found (set TORCH_PYTHON to a python with torch and "
                 "transformers)." % TORCH_PYTHON, ""]
    text += [table(["implementation", "dtype", "ranks", "step s", "fwd s", "bwd s", "tokens/s", "peak per rank",
                    "GEMM GFLOP/s", "MFU", "executed GFLOP/s", "HFU", "vs PyTorch"], rows), "",
             "Commands (DIR/config.json holds the configuration above):", "```", *cmds, "```"]
    return "\n".join(text), None


def section_train(quick):
    """Training throughput of upipe vs ulysses vs ring on 2 ranks (upipe train, random data)."""
    s, steps = (4096, 3) if quick else (8192, 4)
    reps = 1 if quick else 2
    methods = ["upipe", "ulysses", "ring"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    best, errors, cmds = {}, {}, []
    with tempfile.TemporaryDirectory(prefix="upipe_bench_train_") as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(MODEL_CONFIG, f)
        # Interleaved repetitions, the best (fastest median) of each: this VM's speed drifts by tens
        # of percent over minutes, and back-to-back single runs can flip the order.
        for _ in range(reps):
            for method in methods:
                metrics = os.path.join(d, method + ".jsonl")
                args = ["train", "--model=" + d, "--data-kind=random", "--seq-len=%d" % s,
                        "--steps=%d" % steps, "--method=" + method, "--dtype=fp32",
                        "--progress=lines", "--metrics-path=" + metrics]
                shown = shown_command([*MPI, "-np", "2", UPIPE] + args).replace(d, "DIR")
                if shown not in cmds:
                    cmds.append(shown)
                print("+ " + shown, flush=True)
                if os.path.exists(metrics):
                    os.remove(metrics)  # the last repetition's: a fresh run refuses an existing file
                try:
                    p = subprocess.run([*MPI, "-np", "2", UPIPE] + args, capture_output=True, text=True,
                                       env=env)
                    err = failure_cause(p) if p.returncode != 0 else None
                except OSError as e:
                    err = "cannot run %s: %s" % (MPI[0], e.strerror)
                lines = []
                if err is None:
                    lines = [json.loads(l) for l in open(metrics) if l.startswith("{")]
                    if not lines:
                        err = "no steps in the metrics file (exit 0)"
                if err is not None:
                    errors[method] = err
                    failed(shown, err)
                    continue
                # The median step by time (the upper one of an even count), every column from that
                # same step: medians taken column by column could pair one step's tokens/s with
                # another's time.
                timed = sorted(lines[1:] or lines, key=lambda x: x["step_s"])  # the first step warms up
                step = timed[len(timed) // 2]
                r = {"tokens_per_s": step["tokens_per_s"], "step_s": step["step_s"], "mfu": step["mfu"],
                     "last": lines[-1]}
                if method not in best or r["step_s"] < best[method]["step_s"]:
                    best[method] = r
    rows = []
    for method in methods:
        if method not in best:
            rows.append([method, s, "failed: " + errors.get(method, "?"), "", "", "", ""])
            continue
        r, last = best[method], best[method]["last"]
        top = sorted(last["peak_by_tag"].items(), key=lambda kv: -kv[1])[:3]
        rows.append([method, s, "%.0f" % r["tokens_per_s"], "%.2f" % r["step_s"], "%.1f%%" % (100 * r["mfu"]),
                     mib(last["peak_bytes"]), ", ".join("%s %s" % (k, mib(v)) for k, v in top)])
    m = MODEL_CONFIG
    text = ["## Training throughput: upipe vs Ulysses vs ring (2 ranks)",
            "`upipe train` on 2 ranks (CP = 2), Llama decoder D=%d, F=%d, L=%d, H=%d, K=%d, d=%d, V=%d, "
            "S=%d random tokens per step, fp32, ZeRO-3, full activation checkpointing, %d steps; "
            "tokens/s per rank, step time and MFU (model FLOPs over this machine's measured GEMM rate, "
            "docs/training.md) are those of one step, the median by step time of the steps after the first "
            "(the slower middle one of an even count), from the run's metrics file, best of %d interleaved "
            "runs; the peak is the device arena's per-rank peak with its three "
            "largest tags. Both ranks share this machine's %d cores, whose speed drifts by tens of percent "
            "over minutes: differences smaller than that are noise." % (
                m["hidden_size"], m["intermediate_size"], m["num_hidden_layers"], m["num_attention_heads"],
                m["num_key_value_heads"], m["head_dim"], m["vocab_size"], s, steps, reps, os.cpu_count()), "",
            table(["method", "S", "tokens/s per rank", "step s", "MFU", "peak per rank", "largest tags"], rows),
            "", "Commands (DIR/config.json holds the configuration above):", "```", *cmds, "```"]
    return "\n".join(text), None


def pyplot():
    """matplotlib.pyplot on the Agg backend; raises ImportError without matplotlib (see plot_links)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_links(section, img, images, draw):
    """The markdown that follows a section: its images, drawn by draw() (False: nothing to plot).
    Without matplotlib nothing is drawn, stderr says so, and the page says so too: an image an earlier
    run left in img/ stays linked, marked as not redrawn from the numbers above; a missing one is a
    line saying the plot needs matplotlib."""
    try:
        if not draw():
            return ""
    except ImportError as e:
        print("run_benchmarks: %s: plots not drawn, matplotlib is not installed (%s); for them: "
              "sudo apt-get install python3-matplotlib" % (section, e), file=sys.stderr, flush=True)
        out = ""
        for alt, name in images:
            if os.path.exists(os.path.join(img, name)):
                out += ("\n\n![%s](img/%s)\n\n_This plot was not redrawn with the numbers above "
                        "(matplotlib is not installed where they were produced): it is from an earlier run of "
                        "this section and may not match them._" % (alt, name))
            else:
                out += ("\n\n_Plot (%s) not drawn: it needs matplotlib (sudo apt-get install "
                        "python3-matplotlib), which is not installed where these numbers were produced._" % alt)
        return out
    return "".join("\n\n![%s](img/%s)" % (alt, name) for alt, name in images)


def plot_plan(series, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] / 2**30 for p in pts], marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("attention intermediates per rank (GiB)")
    ax.set_title("Llama-3-8B attention block, 8 ranks, bf16 (planned, exact)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def plot_memory(data, path):
    plt = pyplot()
    tags = sorted({t for _, _, by in data for t in by if t not in ("act", "params", "grads")})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bottom = [0.0] * len(data)
    for t in tags:
        vals = [by.get(t, 0) / 2**20 for _, _, by in data]
        ax.bar([d[0] for d in data], vals, bottom=bottom, label=t)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("MiB at the rank-0 peak")
    ax.set_title("Attention intermediates by tag at the peak (rank 0)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


# The page's opening lines, written by this script and by bench/gpu_results.py alike.
PAGE_HEAD = ["# Results", "",
             "Every number on this page comes from `bench/run_benchmarks.py` (`make bench`) or, for the GPU "
             "section, from `bench/gpu_results.py` on bench/gpu_check.sh's files; each section says when and "
             "at which commit it was produced. Do not edit by hand.", ""]


def merge_sections(path, fresh):
    """The results page with the freshly run sections replaced (or appended) and the others kept."""
    old = []
    if os.path.exists(path):
        old = ["## " + b.rstrip() for b in open(path).read().split("\n## ")[1:]]
    title = lambda sec: sec.split("\n", 1)[0]
    new = {title(f): f for f in fresh}
    out = [new.pop(title(o), o) for o in old]
    return out + [f for f in fresh if title(f) in new]


# Every section --only accepts, in the order a default run runs them: name -> (function, what it
# measures for --help, the plots it draws as (alt text, file in img/), the function that draws them
# from the section's data). --help's list and the default --only are made from this table.
SECTIONS = {
    "kernel": (section_kernel, "`upipe bench kernel` on every CPU kernel path: attention forward/backward vs a "
               "oneDNN GEMM, one thread; `upipe bench ops`: the memory-bound kernels vs a plain copy.", [], None),
    "memory": (section_memory, "measured attention intermediates of ulysses vs upipe(U) on 4 ranks (H=32, K=8).",
               [("memory by tag", "memory_tags.png")], plot_memory),
    "speed": (section_speed, "ulysses vs upipe(U=C) time on 2 ranks (S=16384, H=16, K=4, d=64).", [], None),
    "overlap": (section_overlap, "upipe and upipe-fpdt with and without --overlap on 2 ranks (time, memory), "
                "and its planned memory for a Llama-3-8B block on 8 ranks.", [], None),
    "all": (section_all, "every strategy side by side on the same configuration (time and peak), 4 ranks.",
            [], None),
    "plan": (section_plan, "meta-device plan of a Llama-3-8B attention block on 8 ranks, S up to 4M tokens.",
             [("planned memory", "plan.png")], plot_plan),
    "comm": (section_comm, "`upipe bench comm`: each collective through the communicator vs plain MPI, 2 and "
             "4 ranks.", [], None),
    "model": (section_model, "`upipe bench model` (a whole Llama decoder's training step, 1 and 2 ranks, fp32 "
              "and bf16) vs PyTorch eager (transformers on the CPU, one thread, fp32 and bf16 autocast; skipped "
              "with a note without TORCH_PYTHON).", [], None),
    "train": (section_train, "`upipe train` throughput of upipe vs ulysses vs ring on 2 ranks (random data): "
              "tokens/s, step time, MFU and peak from the metrics file.", [], None),
    "plan-model": (section_plan_model, "`upipe plan --max-seq-len`: the longest trainable S per method for "
                   "whole Llama-3-8B (8 ranks) and Qwen3-32B (16 ranks) training steps, fp32 and bf16 stash.",
                   [("per-tag peak at each method's maximum", "plan_model_tags.png"),
                    ("device peak vs sequence length", "plan_model_peak.png")],
                   plot_plan_model),
    "plan-scale": (section_plan_scale, "how long `upipe plan --max-seq-len --method all` takes for Llama-3-8B "
                   "on 8 to 1024 ranks (one rank per rank class played, docs/planner.md).", [], None),
    "documents": (section_documents, "packed documents: one attention block's time vs the number of equal "
                  "documents per sequence, local (1 rank), upipe and ring (2 ranks).", [], None),
}


def sections_help():
    """--help's list of the sections, from SECTIONS, wrapped under each name."""
    out = ["Sections (--only; all of them by default, in this order)"]
    for name, (_, what, images, _) in SECTIONS.items():
        if images:
            what += " Plots: %s." % ", ".join("img/" + f for _, f in images)
        lines = textwrap.wrap(what, 100 - 14)
        out += ["  %-11s %s" % (name, lines[0])] + ["  %-11s %s" % ("", l) for l in lines[1:]]
    return "\n".join(out)


def binary_commit():
    """The commit `upipe --version` says the binary was built from ("1135517", "1135517 (modified)"),
    or "unknown"."""
    try:
        first = subprocess.run([UPIPE, "--version"], capture_output=True, text=True,
                               timeout=60).stdout.split("\n", 1)[0]
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    m = re.search(r"\(git ([0-9a-f]+)(, modified)?\)", first)
    if not m:
        return "unknown"
    return m.group(1)[:7] + (" (modified)" if m.group(2) else "")


def main():
    global UPIPE
    ap = argparse.ArgumentParser(description=__doc__ + "\n" + sections_help(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder whose upipe runs "
                    "(default: build/)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (minutes instead of tens of minutes)")
    ap.add_argument("--only", default=",".join(SECTIONS), metavar="SECTION,...",
                    help="sections to run, comma-separated (default: all of them; listed above); the page keeps "
                    "the others from its previous version")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results.md"), metavar="DIR",
                    help="default: docs/results.md and docs/img/, the docs' results page; --out DIR writes "
                    "DIR/results.md and DIR/img/ instead (a FILE.md: that page, img/ beside it)")
    args = ap.parse_args()
    if not args.out.endswith(".md"):
        args.out = os.path.join(args.out, "results.md")
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in only if n not in SECTIONS]
    if unknown or not only:
        what = ("unknown section%s %s" % ("s" if len(unknown) > 1 else "", ", ".join(map(repr, unknown)))
                if unknown else "no section named")
        ap.error("--only: %s; the sections are %s" % (what, ", ".join(SECTIONS)))
    UPIPE = os.path.abspath(os.path.join(args.build, "upipe"))
    if not (os.path.isfile(UPIPE) and os.access(UPIPE, os.X_OK)):
        sys.exit("run_benchmarks: no executable upipe at %s (build it first, or pass --build DIR)" % UPIPE)
    img = os.path.join(os.path.dirname(args.out), "img")
    # Before anything runs: which files this run replaces (the page's other sections are kept).
    rel = lambda p: os.path.relpath(p) if not os.path.relpath(p).startswith("..") else p
    plots = [rel(os.path.join(img, f)) for name in only for _, f in SECTIONS[name][2]]
    if os.path.exists(args.out):
        what = "will replace the section%s %s of %s (its others kept)" % (
            "s" if len(only) > 1 else "", ", ".join(only), rel(args.out))
    else:
        what = "will write %s (new, with %s)" % (rel(args.out), ", ".join(only))
    default = os.path.abspath(args.out) == os.path.join(ROOT, "docs", "results.md")
    print("run_benchmarks: %s%s%s" % (what, " and " + ", ".join(plots) if plots else "",
                                      "; --out DIR writes elsewhere" if default else ""), flush=True)
    os.makedirs(img, exist_ok=True)
    # The binary's commit, not the checkout's: a build left from an older commit stamps that commit.
    commit = binary_commit()
    cpu = "unknown CPU"
    try:
        cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
    except (OSError, IndexError):
        pass
    # The commit is upipe's (`upipe --version`), "(modified)" when built from a checkout with changes.
    build = "" if os.path.abspath(args.build) == os.path.join(ROOT, "build") else \
        " --build " + shlex.quote(shown_path(os.path.abspath(args.build)))
    stamp = "_Generated by `bench/run_benchmarks.py%s%s --only %%s` on %s at commit %s; %s, %d cores._" % (
        build, " --quick" if args.quick else "", datetime.date.today().isoformat(), commit, cpu, os.cpu_count())
    fresh, failed_sections = [], []
    for name in only:
        before = len(FAILURES)
        try:
            text, data = SECTIONS[name][0](args.quick)
        except Exception:  # a bug or an unexpected output: the page keeps this section's previous version
            traceback.print_exc()
            print("run_benchmarks: section %s crashed; the page keeps its previous version" % name,
                  file=sys.stderr, flush=True)
            failed_sections.append("%s (crashed)" % name)
            continue
        if len(FAILURES) > before:
            failed_sections.append("%s (%d failed runs, first: %s)" % (name, len(FAILURES) - before,
                                                                       FAILURES[before][1]))
        title, rest = text.split("\n", 1)
        text = title + "\n" + stamp % name + "\n\n" + rest
        _, _, images, draw = SECTIONS[name]
        if images and data:
            text += plot_links(name, img, images,
                               lambda: draw(data, *[os.path.join(img, f) for _, f in images]))
        fresh.append(text)
    head = PAGE_HEAD
    if fresh:
        # Merge before opening for writing: "w" truncates the page whose other sections are kept.
        sections_text = merge_sections(args.out, fresh)
        with open(args.out, "w") as f:
            f.write("\n".join(head) + "\n" + "\n\n".join(sections_text) + "\n")
        print("wrote " + args.out)
    if failed_sections:
        print("run_benchmarks: failed: " + "; ".join(failed_sections), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
