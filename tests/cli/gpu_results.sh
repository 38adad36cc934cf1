#!/usr/bin/env bash
# bench/gpu_results.py on the files bench/gpu_check.sh brings back, made here from the same
# commands on the CPU backend (so the fields are the real ones): the GPU section has every table,
# the plan of the attention block equals its run, the env of a run shows, the page's other
# sections are kept and a second run replaces the section instead of adding one.
# Usage: gpu_results.sh UPIPE
set -u
upipe=$1
here=$(cd "$(dirname "$0")" && pwd)
root=$here/../..
fix=$root/tests/fixtures/hf/llama
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
d=$tmp/out
mkdir -p "$d"
shape=(--heads 4 --kv-heads 2 --head-dim 32)

printf 'name, memory.total [MiB], driver_version\nNVIDIA H200, 143771 MiB, 570.00\ncommit abc1234\n' \
  > "$d/gpu.txt"
echo '[{"step": "backend_ops", "rc": 0, "seconds": 12.5}, {"step": "train", "rc": 125, "seconds": 0, "skipped": "out of time"}]' \
  > "$d/summary.json"
echo '{"tests": 44, "failures": 0, "disabled": 0, "testsuites": []}' > "$d/backend_ops.json"
"$upipe" bench kernel --seq-len 512 "${shape[@]}" --iters 1 --json > "$d/kernel.jsonl" ||
  fail "bench kernel"
UPIPE_CUDNN_SDPA=0 "$upipe" bench kernel --seq-len 512 "${shape[@]}" --iters 1 --json \
  >> "$d/kernel.jsonl" || fail "bench kernel with an env"
for m in ulysses upipe; do
  "$upipe" bench attention --method $m --seq-len 1024 "${shape[@]}" --iters 1 --json \
    >> "$d/attention.jsonl" || fail "bench attention $m"
  "$upipe" bench attention --method $m --seq-len 1024 "${shape[@]}" --meta-ranks 1 --json \
    >> "$d/attention.jsonl" || fail "bench attention $m --meta-ranks 1"
done
# UPIPE_CUDA_RESERVE (as bench/gpu_check.sh sets it) sizes the arena only: the row's env says default.
UPIPE_CUDA_RESERVE=6G "$upipe" check --method upipe --seq-len 256 "${shape[@]}" --json \
  > "$d/strategies.jsonl" ||
  fail "check"
"$upipe" eval --model "$fix" --tokens "$fix/tokens.npy" --method upipe --json > "$d/eval.jsonl" ||
  fail "eval"
"$upipe" eval --model "$fix" --tokens "$fix/tokens.npy" --method upipe --dtype bf16 --loss-only \
  --json >> "$d/eval.jsonl" || fail "eval bf16"
# A broken kernel's row: nlohmann::json writes NaN as null; the page says nan, not a crash.
echo '{"dtype": "bf16", "seq_len": 16, "heads": 1, "kv_heads": 1, "head_dim": 8, "fwd_tflops": null, "bwd_tflops": 1.0, "gemm_tflops": 2.0}' \
  >> "$d/kernel.jsonl"

page=$tmp/results.md
printf '# Results\n\nintro\n\n## An older section\nkept\n' > "$page"
python3 "$root/bench/gpu_results.py" "$d" --out "$page" || fail "gpu_results.py"
python3 "$root/bench/gpu_results.py" "$d" --out "$page" || fail "gpu_results.py, second run"
cat "$page"
has() { grep -q -F -e "$1" "$page" || fail "the page lacks: $1"; }
has "## An older section"
has "(commit abc1234)"
has "Against a dense bf16 peak of 989 TFLOP/s."
has "| backend_ops | 0 | 12.5 | passed |"
has "| train | 125 | 0 | out of time |"
has "test_backend_ops: 44 tests, 0 failed, 0 disabled."
has "| fp32 | UPIPE_CUDNN_SDPA=0 | 512 | 4/2 | 32 |"
has "| fp32 | default | 512 | 4/2 | 32 |"
has "| upipe | default | 1024 |"
has "| ulysses | default | 1024 |"
has "(= run)"
has "| upipe | 1 | fp32 |  | default | passed |"
has "passed"
has "| bf16 | default | 16 | 1/1 | 8 | nan | 1.0 | 2.0 |"
grep -q "| llama | upipe | 1 | bf16 | " "$page" || fail "no bf16 eval row"
grep -q "| llama | upipe | 1 | fp32 | " "$page" || fail "no fp32 eval row"
grep -q "| upipe | default | 1024 |.*x \(met\|not met\) |$" "$page" || fail "no ulysses/upipe ratio"
[ "$(grep -c '^## GPU: NVIDIA H200' "$page")" -eq 1 ] || fail "the GPU section is not there exactly once"
echo "PASS gpu_results"
