#!/usr/bin/env bash
# `upipe plan` end to end: one process plans Llama-3-8B on 8 ranks; --json has the issue's fields;
# under mpirun only rank 0 prints; impossible inputs (weights beyond the budget, S no method
# allows, host memory too small for offload, nothing fits) exit 2 with one line saying what does
# not fit. Usage: plan.sh UPIPE_BINARY MPIRUN [MPIRUN ARGS...]
set -u
upipe=$1
shift
MPIRUN=("$@")
failures=0
TMPDIR_PLAN=$(mktemp -d)
trap 'rm -rf "$TMPDIR_PLAN"' EXIT
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# expect TEXT ARGS...: `upipe plan ARGS` exits 2 with exactly one line, the error, containing TEXT.
expect() {
  local text=$1
  shift
  local out rc
  out=$(timeout 120 "$upipe" plan "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne 2 ] || [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ] ||
    ! printf '%s\n' "$out" | grep -q -F -e "upipe: error: " || ! printf '%s\n' "$out" | grep -q -F -e "$text"; then
    fail "upipe plan $* -> exit $rc, want 2 and one line with '$text':"
    printf '%s\n' "$out" | head -5
  else
    echo "ok: upipe plan $* -> $out"
  fi
}
L8="--model llama3-8b --ranks 8"
expect "does not fit 8 ranks of 10.00 GiB" $L8 --device-memory 10G --max-seq-len
expect "does not fit 8 ranks of 10.00 GiB" $L8 --device-memory 10G --seq-len 65536
expect "--seq-len 1001 is not allowed by any method: ulysses: " $L8 --device-memory 80G --method all --seq-len 1001 --data-kind random
expect "--seq-len (1001) must be divisible by 8" $L8 --device-memory 80G --seq-len 1001 --data-kind random
expect "--host-memory 1M is too small: every method needs at least" $L8 --device-memory 80G --host-memory 1M --offload-stash --max-seq-len --method all
expect "is too small: upipe needs at least 64.00 MiB of host memory per rank at S = 1024 (largest: stash 64.00 MiB); give more host memory or drop --offload-stash" $L8 --device-memory 80G --host-memory 1M --offload-stash --method upipe --max-seq-len
# fpdt's host bytes are its K/V chunks, not a stash nobody offloaded.
expect "is too small: fpdt needs at least 256.0 KiB of host memory per rank at S = 1024 (largest: offload 256.0 KiB); give more host memory" --ranks 2 --device-memory 4G --host-memory 1K --method fpdt --max-seq-len
# Nothing fits: said from a method that was planned (ulysses, first in the table, cannot split 32
# heads over 6 ranks; it said "S = 0, peak 0 B").
expect "no method fits 6 ranks of 24.00 GiB (reserve 2.00 GiB) even at S = 3072: the device peak is 24.31 GiB" --model llama3-8b --ranks 6 --device-memory 24G --dtype bf16 --max-seq-len --method all
expect "no method fits 8 ranks of 20.00 GiB" $L8 --device-memory 20G --max-seq-len
# ... and where a memory setting makes some S fit, names it.
expect "no method fits 2 ranks of 4.00 MiB (reserve 0 B) even at S = 1024: the device peak is 4.19 MiB (largest: mlp 1.81 MiB); upipe fits with --tile-tokens=256 up to S = 1024 (MLP and LM-head tiles" \
  --ranks 2 --device-memory 4M --reserve 0 --max-seq-len
expect "give one of --seq-len and --max-seq-len" $L8 --device-memory 80G --seq-len 65536 --max-seq-len
expect "give the device memory per rank to plan for, e.g. --device-memory 80G" $L8 --seq-len 65536
expect "--reserve (90.00 GiB) must be less than --device-memory (80.00 GiB)" $L8 --device-memory 80G --reserve 90G --seq-len 65536
expect "--stage-heads 12 must be a multiple" $L8 --device-memory 80G --method upipe --stage-heads 12 --seq-len 65536
# A train command's settings plan as they are, checked as train checks them: the copy task's odd S
# (plan printed a `run it` command train refused).
expect "--seq-len (255) must be even for data.kind = \"copy\"" --ranks 1 --device-memory 8G --seq-len 255
expect "unknown option '--stpes'; did you mean '--steps'?" $L8 --device-memory 80G --stpes 5

# JSON: the issue's fields; upipe's maximum fits and is a multiple of 64Ki tokens.
out=$(timeout 300 "$upipe" plan $L8 --device-memory 80G --method upipe --stage-heads auto --max-seq-len --offload-stash --json)
rc=$?
if [ $rc -ne 0 ] || ! printf '%s' "$out" | /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
for k in ("model", "ranks", "cp_size", "device_gib", "host_gib", "reserve_gib", "methods"):
    assert k in j, k
m = j["methods"][0]
for k in ("method", "knobs", "seq_len", "fits", "device_peak_bytes", "host_peak_bytes", "peak_by_tag", "limiting_tag", "largest_device_tag", "limit", "resolved_knobs", "knobs_text", "train_command"):
    assert k in m, k
# What limits S is one thing: limiting_tag is the tag of limit (it was the largest device tag,
# "act" for a method the host stash limited); the knobs resolved as knobs_text says them.
assert m["limiting_tag"] == m["limit"]["tag"], m
assert m["knobs"]["stage_heads"] == m["resolved_knobs"]["stage_heads"], m  # auto: the U it chose
assert m["knobs_text"] == "U=%d" % m["resolved_knobs"]["stage_heads"] and m["resolved_knobs"]["stage_heads"] > 0, m
assert m["method"] == "upipe" and m["fits"] and m["seq_len"] % 65536 == 0 and m["seq_len"] >= 1 << 21
assert sum(m["peak_by_tag"].values()) == m["device_peak_bytes"]
assert m["device_peak_bytes"] + j["reserve_gib"] * 2**30 <= 80 * 2**30
assert j["reserve_gib"] == 2 and j["cp_size"] == 8
assert m["limit"]["arena"] in ("device", "host") and m["train_command"].startswith("mpirun -np 8 upipe train ")
assert "--seq-len=%d" % m["seq_len"] in m["train_command"]
print("ok: --json upipe max S", m["seq_len"], m["limiting_tag"])
'; then
  fail "upipe plan --json (exit $rc)"
fi

# --method takes a list: those methods, in that order; an unknown or repeated name is refused.
out=$("$upipe" plan --model llama3-8b --ranks 8 --device-memory 80G --seq-len 65536 --method ring,upipe --json) &&
  [ "$(printf '%s' "$out" | /usr/bin/python3 -c 'import json,sys; print(",".join(m["method"] for m in json.load(sys.stdin)["methods"]))')" = "ring,upipe" ] ||
  fail "--method ring,upipe did not plan ring, then upipe"
expect "--method: unknown method 'rign'" --model llama3-8b --ranks 8 --device-memory 80G --seq-len 65536 --method upipe,rign
expect "--method: 'upipe' is named twice" --model llama3-8b --ranks 8 --device-memory 80G --seq-len 65536 --method upipe,upipe

# A step's work as planned is what a real step executes: the FLOPs bench model counts on 2 ranks
# (the decoder's forward and backward; ZeRO-3 and AdamW run no GEMM), every micro-step alike, and
# --peak-flops turns them into the least time a step takes; the bytes each collective sends.
"$upipe" plan --model tiny --ranks 2 --device-memory 4G --seq-len 256 --json > "$TMPDIR_PLAN/w1.json" &&
  "$upipe" plan --model tiny --ranks 2 --device-memory 4G --seq-len 256 --micro-steps 4 --peak-flops 1e12 \
    --json > "$TMPDIR_PLAN/w4.json" &&
  timeout 120 "${MPIRUN[@]}" -np 2 "$upipe" bench model --seq-len 256 --iters 1 --json > "$TMPDIR_PLAN/b.json" ||
  fail "planning or benchmarking tiny on 2 ranks"
if ! /usr/bin/python3 - "$TMPDIR_PLAN" <<'PY'; then
import json, sys
d = sys.argv[1]
w1 = json.load(open(d + "/w1.json"))["methods"][0]["step_work"]
w4 = json.load(open(d + "/w4.json"))["methods"][0]["step_work"]
b = json.load(open(d + "/b.json"))
ran = (b["executed_gemm_flops"] + b["executed_attention_flops"]) / b["ranks"]
print("planned", w1["executed_flops"], "executed by bench model per rank", ran, "comm", w1["comm"])
assert w1["executed_flops"] == ran and w1["gemm_flops"] == b["executed_gemm_flops"] / 2, (w1, ran)
assert w4["executed_flops"] == 4 * w1["executed_flops"] and w4["comm_micro_steps"] == 2, w4
assert w4["compute_seconds_at_peak"] == w4["executed_flops"] / 1e12, w4
assert w1["comm"]["all_to_all"]["bytes"] > 0 and w1["comm_bytes"] == sum(v["bytes"] for v in w1["comm"].values()), w1
PY
  fail "the planned step's work is not what a step executes"
fi

# --doc-lens plays one rank per CP rank: CP 4 x DP 2 plays 4 (it played all 8).
out=$(timeout 120 "$upipe" plan --model tiny --ranks 8 --cp-size 4 --device-memory 8G --method ring \
  --seq-len 2048 --doc-lens 700,24,1000,300,24 --json 2>&1)
classes=$(printf '%s' "$out" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["methods"][0]["rank_classes"])' 2>&1)
[ "$classes" = 4 ] && echo "ok: --doc-lens on CP 4 x DP 2 plays 4 ranks" ||
  { fail "--doc-lens rank classes: $classes"; printf '%s\n' "$out" | head -5; }
# A model whose state alone is past what the planner counts: more ranks, not a shorter S.
huge=$(mktemp -d)
printf '%s' '{"model_type":"llama","hidden_size":65536,"intermediate_size":131072,"num_hidden_layers":2,"num_attention_heads":512,"num_key_value_heads":8,"vocab_size":2147483647,"max_position_embeddings":8192,"rms_norm_eps":1e-5,"rope_theta":500000.0,"tie_word_embeddings":false}' > "$huge/config.json"
expect "does not fit any device on 1 ranks: its fp32 weights, gradients and AdamW moments alone take 4195332.00 GiB per rank (ZeRO-3 over 1 ranks), past the 16384.00 GiB the planner counts per rank; plan more ranks or a smaller model" \
  --model "$huge/config.json" --ranks 1 --seq-len 4096 --device-memory 1048576T --method upipe
rm -rf "$huge"

# expect_row WHAT REGEX ARGS...: `upipe plan ARGS` exits 0 with a table row matching REGEX.
expect_row() {
  local what=$1 regex=$2
  shift 2
  local out rc
  out=$(timeout 120 "$upipe" plan "$@" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || ! printf '%s\n' "$out" | grep -q -E -e "$regex"; then
    fail "$what (exit $rc)"
    printf '%s\n' "$out" | head -5
  else
    echo "ok: $what -> $(printf '%s\n' "$out" | grep -E -e "$regex")"
  fi
}
# Where not even 64Ki tokens fit, the longest S below them, to 1Ki tokens (it said "no method fits
# 8 ranks of 25.00 GiB even at S = 65536").
expect_row "the longest S below one granule" '^upipe +U=8 +41984 +yes +22\.98 GiB +0 B +device \(optim 7\.48 GiB\)$' \
  $L8 --device-memory 25G --max-seq-len
# Where 1G holds less than 64Ki tokens' stash, the longest S below them (it was an error).
expect_row "a host budget below one granule" '^upipe +U=8 +16384 +yes +[0-9.]+ GiB +1\.00 GiB +host \(stash 1\.00 GiB\)$' \
  $L8 --device-memory 80G --host-memory 1G --offload-stash --method upipe --max-seq-len
# One length past the host limit is an answer, not an error: fits no, limited by the host.
expect_row "a plan past the host limit" '^upipe .* no .* host \(stash' $L8 --device-memory 80G \
  --host-memory 64G --offload-stash --method upipe --seq-len 2097152
# Sizes in the table are in the unit that shows them: a tiny preset's peaks are MiB, not 0.00 GiB.
expect_row "a tiny plan's sizes" '^ring .* yes +[0-9.]+ MiB +0 B +device \(ring [0-9.]+ MiB\)$' \
  --model tiny --ranks 2 --device-memory 1G --reserve 0 --method ring --seq-len 4096

# Train's flags are taken (packed documents planned at their worst, said in the header) and the
# command printed carries them; with one rank `local` is in --method all's table; --reserve 0G.
expect_row "a train command's flags" '^  run it: mpirun -np 2 upipe train --seq-len=256 --micro-steps=2 --lr=0.001 --device-memory=4G --data-kind=files --data-path=/x.bin --documents=eos:0$' \
  --ranks 2 --device-memory 4G --documents=eos:0 --data-kind=files --data-path=/x.bin --micro-steps=2 --seq-len 256 --lr 1e-3
# The data as train opens it: too short for S is train's error; not on this machine, a warning and
# the plan; with --max-seq-len a longer S than the data holds is noted beside its command.
data=$(mktemp -d)
printf 'abcdefghij%.0s' $(seq 100) > "$data/t.txt" && "$upipe" tokenize "$data/t.txt" "$data/t.bin" > /dev/null
expect "--data-path '$data/t.bin' holds 1000 tokens in 1 file(s), fewer than --seq-len 2048" \
  --ranks 2 --device-memory 4G --data-kind=files --data-path="$data/t.bin" --seq-len 2048
printf 'abcdefghij%.0s' $(seq 500) > "$data/long.txt" && "$upipe" tokenize "$data/long.txt" "$data/long.bin" > /dev/null
expect "--val-path '$data/t.bin' holds 1000 tokens in 1 file(s), fewer than --seq-len 2048" \
  --ranks 2 --device-memory 4G --val-interval 10 --data-kind=files --data-path="$data/long.bin" \
  --val-path="$data/t.bin" --seq-len 2048
expect_row "data not on this machine" '^upipe: warning: --data-path /elsewhere/x.bin is not on this machine' \
  --ranks 2 --device-memory 4G --data-kind=files --data-path=/elsewhere/x.bin --seq-len 256
# Away from the data, what needs no file is still checked as train checks it (an end-of-text id
# past the vocabulary printed a run command train refuses).
out=$(timeout 60 "$upipe" plan --ranks 2 --device-memory 4G --seq-len 256 --data-kind=files \
  --data-path=/elsewhere/x.bin --documents=eos:256 2>&1); rc=$?
if [ $rc -eq 2 ] && printf '%s\n' "$out" | grep -q -F "upipe: error: --documents: the end-of-text id 256 is outside the vocabulary [0, 256)"; then
  echo "ok: eos id checked away from the data"
else
  fail "eos id away from the data (exit $rc)"; printf '%s\n' "$out" | head -5
fi
expect_row "a longest S past the data" '^  note: --data-path holds 1000 tokens, fewer than S = [0-9]+: train needs a --seq-len of at most 1000$' \
  --ranks 2 --device-memory 4G --method upipe --data-kind=files --data-path="$data/t.bin" --max-seq-len
rm -r "$data"
# --init-from as train checks it: another model than the run's is refused; a folder not on this
# machine is a warning, and the command keeps the typed preset (left out, the folder's model).
fixq=$(cd "$(dirname "$0")/../fixtures/hf/qwen3" && pwd)
expect "--init-from $fixq is another model than this run's: field 'architectures'" \
  --ranks 2 --device-memory 4G --seq-len 256 --model tiny --init-from "$fixq"
expect_row "init-from elsewhere" '^  run it: mpirun -np 2 upipe train --model=tiny --init-from=/elsewhere/m --seq-len=256 --device-memory=4G$' \
  --ranks 2 --device-memory 4G --seq-len 256 --model tiny --init-from /elsewhere/m
expect_row "local on one rank" '^local +- +256 +yes ' --ranks 1 --device-memory 4G --reserve 0G --method all --seq-len 256
expect_row "knobs resolved" '^upipe-fpdt +U=4 N=4 +784 +yes ' --ranks 4 --device-memory 4G --method all --seq-len 784
# The longest S stops at the longest --seq-len train takes (it answered 1633533689856, which
# plan and train refuse).
expect_row "longest S within train's range" '^ring +- +1099511627776 +yes .* the longest --seq-len \(1099511627776\)$' \
  --model tiny --ranks 65536 --device-memory 80G --max-seq-len --method ring
# The request before the data (DP = ranks / C was 0: "DP size (0) ... must be >= 1").
expect "--cp-size (65536) must divide --ranks (2)" --ranks 2 --cp-size 65536 --device-memory 80G
# --ranks-per-host: an auto Ulysses degree stays within a host, the command places the ranks so,
# and a method whose all-to-alls cross hosts is said with the degree that would not.
expect_row "auto u within a host" '^usp +u=8 +65536 +yes ' --model llama3-8b --ranks 16 --ranks-per-host 8 \
  --device-memory 80G --seq-len 65536 --method usp --ulysses-degree auto
expect_row "auto u on one host" '^usp +u=16 +65536 +yes ' --model llama3-8b --ranks 16 \
  --device-memory 80G --seq-len 65536 --method usp --ulysses-degree auto
expect_row "placed as planned" '^  run it: mpirun -np 16 --npernode 8 upipe train ' --model llama3-8b --ranks 16 \
  --ranks-per-host 8 --device-memory 80G --seq-len 65536 --method usp --ulysses-degree auto
expect_row "across hosts said" "^  note: upipe's all-to-alls span 2 hosts \\(16 ranks a group\\): every layer's all-to-alls cross the network; --method upipe-ring --ulysses-degree 8 keeps them within a host$" \
  --model llama3-8b --ranks 16 --ranks-per-host 8 --device-memory 80G --seq-len 65536 --method upipe

# A run file's plan prints the command with that file and only what differs from it (the knob
# --stage-heads auto chose); the file's own settings are not repeated as flags.
run=$(mktemp --suffix=.toml)
trap 'rm -f "$run"; rm -rf "$TMPDIR_PLAN"' EXIT
printf '[model]\nname = "llama3-8b"\n[train]\nseq_len = 65536\nsteps = 7\n[memory]\ndevice_memory = "80G"\n' > "$run"
out=$(timeout 120 "$upipe" plan "$run" --ranks 8 --stage-heads auto --json 2>&1)
cmd=$(printf '%s' "$out" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["methods"][0]["train_command"])' 2>&1)
case "$cmd" in
  "mpirun -np 8 upipe train $run --stage-heads="[0-9]*) echo "ok: run file plan -> $cmd" ;;
  *) fail "run file plan command: $cmd" ;;
esac
# --max-seq-len replaces a run file's seq_len (it was refused: "give one of seq_len in run.toml and
# --max-seq-len"); its command overrides the file's.
expect_row "a run file's longest S" "^  run it: mpirun -np 8 upipe train $run --seq-len=786432\$" "$run" --ranks 8 --max-seq-len --method upipe

# A plan that does not fit says what makes it fit: each memory setting alone (cheapest first), or
# the fewest together; each of them planned again as typed fits with the very peaks said, and its
# command is that plan's. Nothing at all: said, with what is left to try.
expect_row "fits with, alone" '^    --offload-stash=true: U=8, device peak 32\.11 GiB, host peak 64\.00 GiB \(exact: the stash in host memory\)$' \
  $L8 --device-memory 80G --seq-len 1048576
expect_row "fits with, together" '^    --dtype=bf16 --stash-dtype=bf16 --offload-stash=true: device peak [0-9.]+ GiB, host peak 128\.00 GiB \(the stash in host memory; a bf16 stash' \
  $L8 --device-memory 80G --seq-len 4194304 --method ulysses
expect_row "fits with nothing" '^  no setting that lowers memory makes it fit at this S, alone or together .*--max-seq-len finds the longest S that fits; more ranks split the sequence further; --method all plans every method$' \
  $L8 --device-memory 80G --seq-len 33554432 --method upipe
for args in "--seq-len 1048576 --method all" "--seq-len 4194304 --method ulysses" \
  "--seq-len 4194304 --method upipe-fpdt" "--seq-len 2097152 --method upipe --overlap --recompute block" \
  "--seq-len 1048576 --method upipe --stage-heads auto" "--seq-len 2097152 --method usp --ulysses-degree 8 --offload-stash --device-memory 60G" \
  "--seq-len 1048576 --method upipe --micro-steps 2"; do
  out=$(timeout 120 "$upipe" plan $L8 --device-memory 80G $args --json 2>&1)
  checked=$(printf '%s' "$out" | /usr/bin/python3 -c '
import json, subprocess, sys
upipe, base = sys.argv[1], sys.argv[2].split()
i = base.index("--method")
base = base[:i] + base[i + 2:]  # each row planned again alone
n = 0
for m in json.load(sys.stdin)["methods"]:
    if m.get("error") or m["fits"]:
        continue
    assert m["fits_with"], m["method"] + ": a plan that does not fit names nothing that fits"
    for f in m["fits_with"]:
        cmd = [upipe, "plan"] + base + ["--method", m["method"]] + f["flags"].split() + ["--json"]
        again = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["methods"][0]
        assert again["fits"], (cmd, "does not fit")
        for k in ("device_peak_bytes", "host_peak_bytes", "knobs_text"):
            assert again[k] == f[k], (cmd, k, again[k], f[k])
        assert again["train_command"] == f["train_command"], (cmd, again["train_command"], f["train_command"])
        n += 1
print(n)' "$upipe" "$L8 --device-memory 80G $args" 2>&1)
  case "$checked" in
    [1-9]*) echo "ok: $args: each of $checked settings that fit, planned as typed, fits with the peaks said" ;;
    *) fail "$args: fits_with planned again: $checked" ;;
  esac
done

# The longest S says what goes further: each memory setting alone with its longest S, and the
# exact ones together where that goes further still; each planned again as typed finds the same
# S, peaks, knobs and command.
expect_row "longer with, alone" '^    --offload-stash=true: S = 4194304, U=8, device peak 69\.63 GiB, host peak 256\.00 GiB \(exact: the stash in host memory\)$' \
  $L8 --device-memory 80G --max-seq-len --method upipe
expect_row "longer with, together" '^    --recompute=layer --offload-stash=true: S = 1048576, U=8 overlap, device peak [0-9.]+ GiB, host peak 64\.00 GiB \(exact: backward recomputes each layer; the stash in host memory\)$' \
  $L8 --device-memory 80G --max-seq-len --method upipe --recompute none --overlap --host-memory 64G
for args in "--method all" "--method upipe --recompute none --overlap --host-memory 64G" \
  "--method usp --device-memory 40G"; do
  out=$(timeout 120 "$upipe" plan $L8 --device-memory 80G --max-seq-len $args --json 2>&1)
  checked=$(printf '%s' "$out" | /usr/bin/python3 -c '
import json, subprocess, sys
upipe, base = sys.argv[1], sys.argv[2].split()
i = base.index("--method")
base = base[:i] + base[i + 2:]  # each row planned again alone
n = 0
methods = json.load(sys.stdin)["methods"]
said = [m for m in methods if "longer_with" in m]
assert len(said) == 1, ("one method says what goes further", [m["method"] for m in said])
assert said[0]["seq_len"] == max(m["seq_len"] for m in methods if m["fits"]), "the one that goes furthest"
for m in said:
    for f in m["longer_with"]:
        assert f["seq_len"] > m["seq_len"], (m["method"], f)
        cmd = [upipe, "plan"] + base + ["--method", m["method"]] + f["flags"].split() + ["--json"]
        again = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["methods"][0]
        assert again["fits"], (cmd, "does not fit")
        for k in ("seq_len", "device_peak_bytes", "host_peak_bytes", "knobs_text"):
            assert again[k] == f[k], (cmd, k, again[k], f[k])
        assert again["train_command"] == f["train_command"], (cmd, again["train_command"], f["train_command"])
        n += 1
print(n)' "$upipe" "$L8 --device-memory 80G --max-seq-len $args" 2>&1)
  case "$checked" in
    [1-9]*) echo "ok: --max-seq-len $args: each of $checked settings that go further, planned as typed, reaches the S and peaks said" ;;
    *) fail "--max-seq-len $args: longer_with planned again: $checked" ;;
  esac
done

# Under mpirun rank 0 plans and prints once; every rank exits 0.
out=$(timeout 120 "${MPIRUN[@]}" -np 2 "$upipe" plan $L8 --device-memory 80G --method ulysses --seq-len 1048576 2>&1)
rc=$?
if [ $rc -ne 0 ] || [ "$(printf '%s\n' "$out" | grep -c '^ulysses  ')" -ne 1 ]; then
  fail "upipe plan under mpirun -np 2 (exit $rc)"
  printf '%s\n' "$out" | head -10
else
  echo "ok: under mpirun one table"
fi
[ $failures -eq 0 ] && echo "all plan CLI cases passed"
exit $((failures > 0))
