#!/usr/bin/env bash
# The CUDA backend on a GPU, in one prepared run (issue 19; README "Running on a GPU"). Made for
# the lent H200 and H100 machines (CUDA, PyTorch and Python there; no OpenMPI, no registry): first, here,
# bench/gpu_pack.sh builds and packs the binaries and their libraries into .gpu-pack/; then, there,
# from the repository root, with .gpu-pack carried:
#   bench/gpu_check.sh                       (about 7 minutes at most; files to $OUT)
#   GPU_CHECK_STEPS="kernel attention" bench/gpu_check.sh   (a retry of some steps only)
# Steps, most telling first, each with its own time limit (and every run inside it with one),
# logged to STEP.log; rc and seconds to summary.json. One step's failure does not stop the
# others, and $OUT is rewritten after every step, so what ran comes back even if the device
# tool's own limit ends the script:
#   backend_ops   test_backend_ops: every op on cuda against the references, the meta device
#                 planning for cuda
#   comm          test_nccl_comm on 1 rank (every collective check on device memory, ordering with
#                 the compute stream) and on 2 sharing the GPU (refused, on every rank, not hung;
#                 the staged communicator with its CUDA copier on both); test_staged_comm on 4
#   cuda_math, cuda_attention   the GPU halves of test_cuda_math, test_cuda_attention_plan
#                 (kernels against their host emulations, cuDNN's blocks within the bf16 rule)
#   kernel        `upipe bench kernel --backend cuda`: attention TFLOP/s, bf16 (cuDNN, and the
#                 flash kernels alone) and fp32
#   attention     `upipe bench attention --backend cuda`, ulysses and upipe, S = 32K .. 256K, each
#                 beside its plan (--meta-ranks 1); upipe --overlap at 128K
#   strategies    `upipe check --backend cuda` for every method on 1, 2 and 4 ranks sharing the
#                 GPU (the host-staged communicator) against local, fp32 and bf16; upipe and
#                 upipe-fpdt with --overlap; bf16 with cuDNN off (the flash kernels alone). Four
#                 runs at a time (16 cores); S = 1024, since rank 0's fp64 oracle is host code
#   eval          `upipe eval --backend cuda` on the transformers fixtures: the loss to 7 digits
#                 and every gradient within the fp32 rule (tests/cli/check_grads.py); bf16 loss
#   train         `upipe train --backend cuda` on 2 ranks: fpdt with the offloaded stash (every
#                 offload, fetch and store an asynchronous copy) against the same run without it:
#                 the same losses, bit for bit
#   copies        upipe-fpdt at 128K with asynchronous and synchronous copies
#                 (UPIPE_CUDA_COPIES=sync): what the copy lanes gain
# The steps share one time budget (GPU_CHECK_BUDGET seconds, default 420): a step gets at most
# what is left and is skipped, saying so in summary.json, when nothing is.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
self=$PWD/bench/gpu_check.sh
fix=tests/fixtures/hf

# ---- The steps (functions; each runs as `gpu_check.sh --step NAME` under its time limit) ----

# run LIMIT COMMAND...: one run under its own limit (a hung rank cannot eat the step: SIGKILL 5 s
# after the SIGTERM); its seconds and rc go to the log, a failure to the step's rc.
fails=0
run() {
  local limit=$1 t0 rc
  shift
  t0=$(date +%s.%N)
  timeout -k 5 "$limit" "$@"
  rc=$?
  echo "gpu_check run: rc=$rc $(python3 -c "print(round($(date +%s.%N) - $t0, 1))")s: $*" >&2
  [ $rc -eq 0 ] || { echo "FAILED (rc $rc): $*" >&2; fails=$((fails + 1)); }
  return $rc
}
# Every strategy against local on one GPU shared by 1, 2 and 4 ranks, GPU_CHECK_JOBS (4) runs at a
# time (16 ranks on 16 cores), each logging to strategies.d/N.log. Each rank reserves an equal share
# of the GPU less 1.5 GiB for what a process keeps outside its arena (the CUDA context, cuBLASLt's
# and cuDNN's handles), at most 6 GiB: 6 GiB on the H200's 139, 3.4 GiB on an H100's 80 (a check at
# S = 1024 needs well under 1 GiB); 6 GiB everywhere would not fit 16 ranks on an H100.
strategies_reserve_mib() {
  local total ranks=$((4 * ${GPU_CHECK_JOBS:-4})) per
  total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  [[ "$total" =~ ^[0-9]+$ ]] || { echo 6144; return; }  # no nvidia-smi: a CPU try of the script
  per=$((total / ranks - 1536))
  [ "$per" -gt 6144 ] && per=6144
  [ "$per" -lt 1024 ] && per=1024
  echo "$per"
}
strategies() {
  local np m t jobs=() i=0
  local shape=(--seq-len 1024 --heads 8 --kv-heads 2 --head-dim 128 --json)
  local all=(ulysses upipe ring usp upipe-ring fpdt upipe-fpdt)
  UPIPE_CUDA_RESERVE=$(strategies_reserve_mib)M
  export UPIPE_CUDA_RESERVE
  echo "strategies: each rank reserves $UPIPE_CUDA_RESERVE of the GPU"
  for m in local "${all[@]}"; do jobs+=("1 $m fp32"); done
  for np in 2 4; do
    for t in bf16 fp32; do
      for m in "${all[@]}"; do jobs+=("$np $m $t"); done
    done
  done
  for np in 2 4; do jobs+=("$np upipe bf16 --overlap --stage-heads $np"); done
  jobs+=("2 upipe-fpdt bf16 --overlap --stage-heads 2")
  for m in ulysses ring fpdt; do jobs+=("2 $m bf16 flash"); done
  mkdir -p "$out/strategies.d"
  for j in "${jobs[@]}"; do
    set -- $j
    local np=$1 m=$2 t=$3 extra=() env=()
    shift 3
    if [ "${1:-}" = flash ]; then env=(-x UPIPE_CUDNN_SDPA=0); else extra=("$@"); fi
    while [ "$(jobs -rp | wc -l)" -ge "${GPU_CHECK_JOBS:-4}" ]; do wait -n; done
    ( run 60 "${mpirun[@]}" "${env[@]}" -np "$np" upipe check --backend "$backend" --method "$m" \
        --dtype "$t" "${extra[@]}" "${shape[@]}" ) > "$out/strategies.d/$(printf %02d $i).log" 2>&1 &
    i=$((i + 1))
  done
  wait
  ! grep -q '^FAILED' "$out"/strategies.d/*.log
}

# NCCL on the one GPU (one rank, with NCCL's pointer checks: one rank's collectives are plain
# copies, which would take a host pointer silently; two ranks sharing a GPU are refused, which np 2
# checks) and the host-staged communicator the multi-rank runs below use, with its CUDA copier
# (StagedCudaComm, on 1 and 2 ranks) and with host copies on 4.
comms() {
  run 25 "${mpirun[@]}" -x NCCL_CHECK_POINTERS=1 -np 1 test_nccl_comm
  run 25 "${mpirun[@]}" -np 2 test_nccl_comm
  run 20 "${mpirun[@]}" -np 4 test_staged_comm
  return $((fails > 0))
}

# The model against transformers: the loss to 7 digits and every gradient within the fp32 rule.
evals() {
  local fx
  for fx in llama qwen3; do
    run 40 upipe eval --backend "$backend" --model $fix/$fx --tokens $fix/$fx/tokens.npy --method upipe \
      --json --save-grads "$out/g_$fx.safetensors" > "$out/eval_$fx.json"
    cat "$out/eval_$fx.json"
    run 60 python3 tests/cli/check_grads.py "$out/g_$fx.safetensors" $fix/$fx "$out/eval_$fx.json"
    rm -f "$out/g_$fx.safetensors"
    run 40 upipe eval --backend "$backend" --model $fix/$fx --tokens $fix/$fx/tokens.npy --method upipe \
      --dtype bf16 --json --loss-only > "$out/eval_${fx}_bf16.json"
    cat "$out/eval_${fx}_bf16.json"
  done
  return $((fails > 0))
}

# The attention kernels' TFLOP/s (against the GPU's dense bf16 peak: ~989 on an H200 or H100 SXM) beside cuBLASLt's:
# bf16 on cuDNN (forward whole, backward in blocks), bf16 on the flash kernels alone
# (UPIPE_CUDNN_SDPA=0), fp32 (flash kernels).
kernels() {
  local k=(upipe bench kernel --backend "$backend" --seq-len 16384 --heads 32 --kv-heads 8 --head-dim 128
           --iters 5 --json)
  run 30 "${k[@]}" --dtype bf16
  run 40 env UPIPE_CUDNN_SDPA=0 "${k[@]}" --dtype bf16
  run 40 "${k[@]}" --dtype fp32
  return $((fails > 0))
}

# Attention speed and memory on one rank (ulysses and upipe on C = 1 still differ in what they
# keep), each beside the plan of the same block (--meta-ranks 1); S ascending, so a slow kernel
# costs the longest runs first.
attention() {
  local s m a=(upipe bench attention --backend "$backend" --heads 32 --kv-heads 8 --head-dim 128
               --dtype bf16 --json)
  for s in 32768 65536 131072 262144; do
    for m in ulysses upipe; do
      run 60 "${a[@]}" --method $m --seq-len $s --iters 3
      run 20 "${a[@]}" --method $m --seq-len $s --meta-ranks 1
    done
  done
  # upipe with stage overlap at one S: its time and peak beside the plain row's, and its plan.
  run 40 "${a[@]}" --method upipe --overlap --seq-len 131072 --iters 3
  run 20 "${a[@]}" --method upipe --overlap --seq-len 131072 --meta-ranks 1
  return $((fails > 0))
}

# upipe-fpdt (K/V chunks offloaded to pinned host memory) at one S, its copies on the copy lanes
# and, UPIPE_CUDA_COPIES=sync, on the compute stream: what the asynchronous copies gain.
copies() {
  local c
  for c in async sync; do
    run 40 env UPIPE_CUDA_COPIES=$c upipe bench attention --backend "$backend" --method upipe-fpdt \
      --chunks 4 --seq-len 131072 --heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 --iters 3 \
      --json
  done
  return $((fails > 0))
}

# Asynchronous copies on the GPU: the offloaded stash changes no bit of any step's loss (fpdt's K/V
# offload runs in both).
trains() {
  local o
  for o in none stash; do
    rm -f "$out/train_$o.jsonl"  # a fresh run refuses an existing metrics file
    UPIPE_CUDA_RESERVE=24G run 40 "${mpirun[@]}" -np 2 upipe train --backend "$backend" --model tiny \
      --steps 3 --seq-len 4096 --method fpdt --progress lines \
      --metrics-path "$out/train_$o.jsonl" $([ $o = stash ] && echo --offload-stash)
    grep -o '"loss":[^,]*' "$out/train_$o.jsonl" > "$out/loss_$o.txt"
  done
  cat "$out/loss_none.txt"
  if [ -s "$out/loss_none.txt" ] && cmp -s "$out/loss_none.txt" "$out/loss_stash.txt"; then
    echo "train: the offloaded stash gives the same losses"
  else
    echo "FAILED train: losses differ with the offloaded stash"
    paste "$out/loss_none.txt" "$out/loss_stash.txt"
    fails=$((fails + 1))
  fi
  return $((fails > 0))
}

# OpenMPI from the pack (mpirun is a Debian alternatives link, so the pack also has orterun).
mpirun_bin=$(command -v mpirun || command -v mpirun.openmpi || command -v orterun || echo mpirun)
mpirun=("$mpirun_bin" --oversubscribe --bind-to none -x OMP_NUM_THREADS -x LD_LIBRARY_PATH
        -x UPIPE_CUDA_RESERVE)
[ -n "${OPAL_PREFIX:-}" ] && mpirun+=(-x OPAL_PREFIX)

backend=${GPU_CHECK_BACKEND:-cuda}
if [ "${1:-}" = "--step" ]; then
  out=$GPU_CHECK_WORK
  "$2"
  exit $?
fi

# ---- The run ----

# The device tool returns at most 8 files: logs go to a work folder, packed as one logs.tar.gz;
# $OUT gets gpu.txt, summary.json, backend_ops.json, strategies.jsonl, kernel.jsonl,
# attention.jsonl, eval.jsonl and logs.tar.gz, rewritten after every step.
start_s=$(date +%s)  # the budget below counts from here
final=${OUT:-$PWD/gpu-check-out}
mkdir -p "$final"
out=$(mktemp -d)
export GPU_CHECK_WORK=$out
if [ -n "${GPU_CHECK_BIN:-}" ]; then
  # A try of this script itself where there is no GPU: the binaries of a build folder and the
  # machine's OpenMPI (with GPU_CHECK_BACKEND=cpu the steps run on the CPU backend).
  bin=$(realpath "$GPU_CHECK_BIN")
  export PATH=$bin:$bin/tests:$PATH
  pack=$bin
else
  [ -f .gpu-pack/pack.tar.xz ] || { echo "no .gpu-pack/pack.tar.xz: run bench/gpu_pack.sh here first"; exit 2; }
  pack=/tmp/upipe-pack
  rm -rf "$pack" && mkdir -p "$pack"
  if command -v xz > /dev/null; then
    tar -C "$pack" -xJf .gpu-pack/pack.tar.xz
  else  # an image without xz: Python's tarfile reads it (links and modes kept)
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      .gpu-pack/pack.tar.xz "$pack"
  fi
  export OPAL_PREFIX=$pack/usr
  export PATH=$pack/usr/bin:$pack/bin:$PATH
  # /etc/openmpi's settings do not follow OPAL_PREFIX: PMIx's plugins are named here.
  export PMIX_MCA_mca_base_component_path=$pack/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
fi
# CUDA's libraries: the toolkit's, or those of the Python wheels (nvidia-*-cu13).
cuda_dirs=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/lib /usr/lib/x86_64-linux-gnu \
  $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
  \( -name 'libcublasLt.so.13*' -o -name 'libcudart.so.13*' -o -name 'libnccl.so.2*' \
     -o -name 'libcudnn.so.9*' -o -name 'libnvrtc.so.13*' -o -name 'libnvJitLink.so.13*' \) \
  -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH=$pack/usr/lib/x86_64-linux-gnu:$pack/usr/lib/x86_64-linux-gnu/openmpi/lib:${cuda_dirs}${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 GTEST_COLOR=no
# One host: shared memory only, no UCX/OFI probing, no cross-process memory reads (a VM may
# refuse them).
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
# Re-resolved now that the pack is on PATH.
mpirun_bin=$(command -v mpirun || command -v mpirun.openmpi || command -v orterun || echo mpirun)
mpirun[0]=$mpirun_bin
summary=()

budget=${GPU_CHECK_BUDGET:-420}
steps_wanted=${GPU_CHECK_STEPS:-}

# What has come out so far, into $final (the device tool's $OUT): called after every step.
collect() {
  local s f
  for s in kernel attention; do
    grep -h '^{' "$out/$s.log" > "$out/$s.jsonl" 2>/dev/null
  done
  grep -h '^{' "$out"/strategies.d/*.log > "$out/strategies.jsonl" 2>/dev/null
  grep -h '^{' "$out/copies.log" >> "$out/attention.jsonl" 2>/dev/null  # fpdt async vs sync copies
  cat "$out"/eval_*.json > "$out/eval.jsonl" 2>/dev/null
  ( IFS=,; echo "[${summary[*]}]" ) > "$out/summary.json"
  for f in gpu.txt summary.json backend_ops.json strategies.jsonl attention.jsonl eval.jsonl \
    kernel.jsonl; do
    [ -s "$out/$f" ] && cp "$out/$f" "$final/"
  done
  tar -C "$out" -czf "$final/logs.tar.gz" $(cd "$out" && ls ./*.log ./strategies.d/*.log 2>/dev/null) \
    2>/dev/null
}

# step NAME LIMIT_S COMMAND...: runs it, logs to $out/NAME.log, records rc and seconds; a
# COMMAND that is one of the functions above runs as `gpu_check.sh --step FUNCTION`.
step() {
  local name=$1 limit=$2 t0 rc dt left
  shift 2
  if [ -n "$steps_wanted" ] && ! [[ " $steps_wanted " == *" $name "* ]]; then return; fi
  left=$((budget - ($(date +%s) - start_s) - 10))
  if [ "$left" -lt 10 ]; then
    summary+=("{\"step\": \"$name\", \"rc\": 125, \"seconds\": 0, \"skipped\": \"out of time\"}")
    echo "gpu_check: $name skipped (out of time)"
    collect
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  t0=$(date +%s.%N)
  if [ "$(type -t "$1")" = function ]; then set -- "$self" --step "$1"; fi
  timeout -k 5 "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  dt=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
  summary+=("{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $dt}")
  echo "gpu_check: $name rc=$rc ${dt}s"
  collect
}

# What the run stands on: the GPU, the commit, the libraries the binaries find (a missing one shows
# as "not found"), the versions of the CUDA libraries the machine has (PyTorch's wheels).
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  echo "commit $(cat .gpu-pack/commit 2>/dev/null)"
  ldd --version 2>&1 | head -1
  python3 -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version())' 2>&1 | tail -1
  upipe --version 2>&1
  echo "mpirun: $mpirun_bin"
  for b in $(command -v upipe test_backend_ops test_cuda_math test_cuda_attention_plan test_nccl_comm); do
    ldd "$b" 2>&1 | grep -i 'not found' | sed "s|^|$(basename "$b"): |"
  done
  echo "libraries: $(ldd "$(command -v upipe)" 2>/dev/null | grep -E -o '/[^ ]*(cudnn|cublasLt|nccl|cudart|nvrtc)[^ ]*' | sort -u | tr '\n' ' ')"
} > "$out/gpu.txt"
cat "$out/gpu.txt"

step backend_ops 60 test_backend_ops --gtest_output=json:"$out/backend_ops.json"
step comm 70 comms
step cuda_math 20 test_cuda_math
step cuda_attention 40 test_cuda_attention_plan
step kernel 45 kernels
step attention 100 attention
step strategies 150 strategies
step eval 50 evals
step train 40 trains
step copies 45 copies
collect
cat "$final/summary.json"
