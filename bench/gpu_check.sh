#!/usr/bin/env bash
# The CUDA backend on a GPU, in one prepared run (issue 19; README "Running on a GPU"). Made for
# the lent H200 machines (CUDA and Python there, no registry): first, here, bench/gpu_pack.sh
# builds and packs the binaries and their libraries into .gpu-pack/; then, there, from the
# repository root, with .gpu-pack carried:
#   bench/gpu_check.sh            (under 8 minutes on an H200 host; JSON and logs to $OUT)
# Steps, each with its own time limit, logged to $OUT/STEP.log, rc and seconds to
# $OUT/summary.json (one step's failure does not stop the others):
#   backend_ops   test_backend_ops: every op on cuda against the references, the meta device
#                 planning for cuda; test_cuda_math, test_cuda_attention_plan (their GPU tests)
#   strategies    `upipe check --backend cuda` for every method on 1, 2 and 4 ranks sharing the
#                 GPU (the host-staged communicator), forward and backward against local; upipe
#                 and upipe-fpdt with --overlap
#   eval          `upipe eval --backend cuda` on the transformers fixtures: the loss to 7 digits
#                 and every gradient within the fp32 rule (tests/cli/check_grads.py); bf16 loss
#   kernel        `upipe bench kernel --backend cuda`: attention TFLOP/s, bf16 (cuDNN, and the
#                 flash kernels alone) and fp32
#   attention     `upipe bench attention --backend cuda`, ulysses and upipe, S = 32K .. 256K;
#                 upipe --overlap at 128K
#   plan          `upipe plan --backend cuda` of the same block beside the run's measured peak
#   train         `upipe train --backend cuda` on 2 ranks: fpdt with the offloaded stash (every
#                 offload, fetch and store an asynchronous copy on the copy stream) against the
#                 same run without the stash offload: the same losses, bit for bit
#   copies        upipe-fpdt at 128K with asynchronous and synchronous copies
#                 (UPIPE_CUDA_COPIES=sync): what the copy stream gains
# The steps share one time budget (GPU_CHECK_BUDGET, 510 s): a step that would not fit is
# skipped and says so in summary.json, so the results always come back.
set -uo pipefail
cd "$(dirname "$0")/.."
self=$PWD/bench/gpu_check.sh
fix=tests/fixtures/hf
mpirun=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -x LD_LIBRARY_PATH -x OPAL_PREFIX
        -x UPIPE_CUDA_RESERVE -x OMPI_MCA_btl)

# ---- The steps (functions; each runs as `gpu_check.sh --step NAME` under its time limit) ----

# Every strategy against local on one GPU shared by 1, 2 and 4 ranks (each rank reserves its share
# of HBM), fp32 and bf16.
strategies() {
  local np m
  for np in 1 2 4; do
    for m in local ulysses upipe ring usp upipe-ring fpdt upipe-fpdt; do
      UPIPE_CUDA_RESERVE=24G "${mpirun[@]}" -np $np upipe check --backend cuda --method $m \
        --seq-len 4096 --heads 8 --kv-heads 2 --head-dim 128 --json || echo "FAILED np=$np $m"
      [ $np -eq 1 ] && continue  # bf16 on 2 and 4 ranks
      UPIPE_CUDA_RESERVE=24G "${mpirun[@]}" -np $np upipe check --backend cuda --method $m \
        --seq-len 4096 --dtype bf16 --head-dim 128 --json || echo "FAILED bf16 np=$np $m"
    done
  done
  # Stage overlap (--overlap: stage s+1's projection and all-to-all while stage s attends) on 2
  # and 4 ranks, bf16, against local: bitwise the same arithmetic, two stages' buffers alive.
  for np in 2 4; do
    for m in upipe upipe-fpdt; do
      UPIPE_CUDA_RESERVE=24G "${mpirun[@]}" -np $np upipe check --backend cuda --method $m \
        --overlap --stage-heads 2 --seq-len 4096 --dtype bf16 --head-dim 128 --json ||
        echo "FAILED overlap np=$np $m"
    done
  done
  # bf16 again on 2 ranks with cuDNN's fused attention off: the flash kernels alone.
  for m in local ulysses upipe ring usp upipe-ring fpdt upipe-fpdt; do
    UPIPE_CUDNN_SDPA=0 UPIPE_CUDA_RESERVE=24G "${mpirun[@]}" -x UPIPE_CUDNN_SDPA -np 2 upipe check \
      --backend cuda --method $m --seq-len 4096 --dtype bf16 --head-dim 128 --json ||
      echo "FAILED bf16 flash-only np=2 $m"
  done
}

# The model against transformers: the loss to 7 digits and every gradient within the fp32 rule.
evals() {
  local fx
  for fx in llama qwen3; do
    upipe eval --backend cuda --model $fix/$fx --tokens $fix/$fx/tokens.npy --method upipe --json \
      --save-grads "$out/g_$fx.safetensors" > "$out/eval_$fx.json" || echo "FAILED eval $fx"
    cat "$out/eval_$fx.json"
    python3 tests/cli/check_grads.py "$out/g_$fx.safetensors" $fix/$fx "$out/eval_$fx.json" ||
      echo "FAILED grads $fx"
    rm -f "$out/g_$fx.safetensors"
    upipe eval --backend cuda --model $fix/$fx --tokens $fix/$fx/tokens.npy --method upipe \
      --dtype bf16 --json --loss-only || echo "FAILED bf16 eval $fx"
  done
}

# The attention kernels' TFLOP/s (against the H200's ~989 dense bf16 peak) beside cuBLASLt's:
# bf16 on cuDNN (forward whole, backward in blocks), bf16 on the flash kernels alone
# (UPIPE_CUDNN_SDPA=0), fp32 (flash kernels).
kernels() {
  local t
  for t in bf16 fp32; do
    upipe bench kernel --backend cuda --seq-len 16384 --heads 32 --kv-heads 8 --head-dim 128 \
      --dtype $t --iters 5 --json || echo "FAILED kernel $t"
  done
  UPIPE_CUDNN_SDPA=0 upipe bench kernel --backend cuda --seq-len 16384 --heads 32 --kv-heads 8 \
    --head-dim 128 --dtype bf16 --iters 5 --json || echo "FAILED kernel bf16 flash-only"
}

# Attention speed and memory on one rank (ulysses and upipe on C = 1 still differ in what they
# keep), and the plan of the same block (--meta-ranks 1) beside the measured peak.
attention() {
  local s m
  for s in 32768 65536 131072 262144; do
    for m in ulysses upipe; do
      upipe bench attention --backend cuda --method $m --seq-len $s --heads 32 --kv-heads 8 \
        --head-dim 128 --dtype bf16 --iters 3 --json || echo "FAILED $m S=$s"
      upipe bench attention --backend cuda --method $m --seq-len $s --heads 32 --kv-heads 8 \
        --head-dim 128 --dtype bf16 --meta-ranks 1 --json || echo "FAILED plan $m S=$s"
    done
  done
  # upipe with stage overlap at one S: its time and peak beside the plain row's, and its plan.
  upipe bench attention --backend cuda --method upipe --overlap --seq-len 131072 --heads 32 \
    --kv-heads 8 --head-dim 128 --dtype bf16 --iters 3 --json || echo "FAILED upipe overlap"
  upipe bench attention --backend cuda --method upipe --overlap --seq-len 131072 --heads 32 \
    --kv-heads 8 --head-dim 128 --dtype bf16 --meta-ranks 1 --json || echo "FAILED plan overlap"
}

# upipe-fpdt (K/V chunks offloaded to pinned host memory) at one S, its copies on the copy stream
# and, UPIPE_CUDA_COPIES=sync, on the compute stream: what the asynchronous copies gain.
copies() {
  local c
  for c in async sync; do
    UPIPE_CUDA_COPIES=$c upipe bench attention --backend cuda --method upipe-fpdt --chunks 4 \
      --seq-len 131072 --heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 --iters 3 --json ||
      echo "FAILED upipe-fpdt copies=$c"
  done
}

# Asynchronous copies on the GPU: the offloaded stash changes no bit of any step's loss (fpdt's K/V
# offload runs in both).
trains() {
  local o
  for o in none stash; do
    UPIPE_CUDA_RESERVE=24G "${mpirun[@]}" -np 2 upipe train --backend cuda --model tiny --steps 3 \
      --seq-len 4096 --method fpdt --progress lines --metrics-path "$out/train_$o.jsonl" \
      $([ $o = stash ] && echo --offload-stash) || echo "FAILED train offload=$o"
    grep -o '"loss":[^,]*' "$out/train_$o.jsonl" > "$out/loss_$o.txt"
  done
  cat "$out/loss_none.txt"
  if [ -s "$out/loss_none.txt" ] && cmp -s "$out/loss_none.txt" "$out/loss_stash.txt"; then
    echo "train: the offloaded stash gives the same losses"
  else
    echo "FAILED train: losses differ with the offloaded stash"
    paste "$out/loss_none.txt" "$out/loss_stash.txt"
  fi
}

if [ "${1:-}" = "--step" ]; then
  out=$GPU_CHECK_WORK
  "$2"
  exit $?
fi

# ---- The run ----

# The device tool returns at most 8 files: logs go to a work folder, packed as one logs.tar.gz;
# $OUT gets gpu.txt, summary.json, backend_ops.json, strategies.jsonl, kernel.jsonl,
# attention.jsonl, eval.jsonl and logs.tar.gz.
start_s=$(date +%s)  # the budget below counts from here
final=${OUT:-$PWD/gpu-check-out}
mkdir -p "$final"
out=$(mktemp -d)
export GPU_CHECK_WORK=$out
[ -f .gpu-pack/pack.tar.xz ] || { echo "no .gpu-pack/pack.tar.xz: run bench/gpu_pack.sh here first"; exit 2; }
pack=/tmp/upipe-pack
rm -rf "$pack" && mkdir -p "$pack" && tar -C "$pack" -xJf .gpu-pack/pack.tar.xz
# CUDA's libraries: the toolkit's, or those of the Python wheels (nvidia-*-cu13).
cuda_dirs=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/lib /usr/lib/x86_64-linux-gnu \
  $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
  \( -name 'libcublasLt.so.13*' -o -name 'libcudart.so.13*' -o -name 'libnccl.so.2*' \
     -o -name 'libcudnn.so.9*' \) -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
export OPAL_PREFIX=$pack/usr
export PATH=$pack/usr/bin:$pack/bin:$PATH
export LD_LIBRARY_PATH=$pack/usr/lib/x86_64-linux-gnu:$pack/usr/lib/x86_64-linux-gnu/openmpi/lib:${cuda_dirs}${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export OMPI_MCA_btl=self,vader  # one host: shared memory only
summary=()

# The whole run's budget (GPU_CHECK_BUDGET seconds, default 510: the device tool's 540 less the
# packing): a step gets at most what is left of it less 15 s, and is skipped (rc 125) below 10 s,
# so the results are always packed and come back.
budget=${GPU_CHECK_BUDGET:-510}

# step NAME LIMIT_S COMMAND...: runs it, logs to $out/NAME.log, records rc and seconds; a
# COMMAND that is one of the functions above runs as `gpu_check.sh --step FUNCTION`.
step() {
  local name=$1 limit=$2 t0 rc dt left
  shift 2
  left=$((budget - ($(date +%s) - start_s) - 15))
  if [ "$left" -lt 10 ]; then
    summary+=("{\"step\": \"$name\", \"rc\": 125, \"seconds\": 0, \"skipped\": \"out of time\"}")
    echo "gpu_check: $name skipped (out of time)"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  t0=$(date +%s.%N)
  if [ "$(type -t "$1")" = function ]; then set -- "$self" --step "$1"; fi
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  dt=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
  summary+=("{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $dt}")
  echo "gpu_check: $name rc=$rc ${dt}s"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  echo "commit $(cat .gpu-pack/commit 2>/dev/null)"; } > "$out/gpu.txt"
cat "$out/gpu.txt"

step backend_ops 90 test_backend_ops --gtest_output=json:"$out/backend_ops.json"
step cuda_math 30 test_cuda_math
step cuda_attention 60 test_cuda_attention_plan
step strategies 200 strategies
step eval 60 evals
step kernel 45 kernels
step attention 90 attention
step train 30 trains
step copies 40 copies
for s in strategies kernel attention; do grep '^{' "$out/$s.log" > "$out/$s.jsonl" 2>/dev/null; done
grep '^{' "$out/copies.log" >> "$out/attention.jsonl" 2>/dev/null  # fpdt async vs sync copies
cat "$out"/eval_*.json > "$out/eval.jsonl" 2>/dev/null

( IFS=,; echo "[${summary[*]}]" ) > "$out/summary.json"
for f in gpu.txt summary.json backend_ops.json strategies.jsonl attention.jsonl eval.jsonl \
  kernel.jsonl; do
  [ -f "$out/$f" ] && cp "$out/$f" "$final/"
done
tar -C "$out" -czf "$final/logs.tar.gz" $(cd "$out" && ls ./*.log)
cat "$final/summary.json"
