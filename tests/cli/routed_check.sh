#!/usr/bin/env bash
# The routed communicator (src/comm/routed/: calls on device buffers to one communicator, NCCL on
# GPUs; calls with a host buffer to the staged one), driven on the CPU (UPIPE_STAGED_COMM=routed:
# an MPI group stands in for NCCL, the device arena's blocks for device memory) through the
# commands as typed. Every call site must route alike on every rank, or the ranks wait in two
# different communicators (a hang, ended by the timeouts here): every multi-rank strategy's
# `upipe check` passes on 4 ranks through it, with documents and stage overlap; `upipe eval` gives
# the transformers fixture's loss; `upipe train` (ZeRO-3 over DP 2 x CP 2) logs the same losses,
# gradient norms and device peaks, bit for bit, as the same run on plain MPI.
# Usage: routed_check.sh UPIPE MPIRUN [MPIRUN ARGS...]
set -u
upipe=$1
shift
mpirun=("$@")
here=$(cd "$(dirname "$0")" && pwd)
fix="$here/../fixtures/hf/llama"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
routed=(-x UPIPE_STAGED_COMM=routed)

for m in ulysses upipe ring usp upipe-ring fpdt upipe-fpdt; do
  out=$(timeout 120 "${mpirun[@]}" "${routed[@]}" -np 4 "$upipe" check --method "$m" \
    --seq-len 256 --json 2>&1) || { echo "$out"; fail "check --method $m"; }
  printf '%s\n' "$out" | grep -q '"passed":true' || { echo "$out"; fail "$m did not pass"; }
  printf '%s\n' "$out" | grep -q '"communicator":"routed(mpi, staged(mpi))"' ||
    { echo "$out"; fail "$m not routed"; }
  echo "routed $m: passed"
done
for m in ring "upipe --overlap"; do
  # shellcheck disable=SC2086  # the method's flags split on purpose
  out=$(timeout 120 "${mpirun[@]}" "${routed[@]}" -np 4 "$upipe" check --method $m \
    --seq-len 256 --doc-lens 1,37,100,3,115 --json 2>&1) || { echo "$out"; fail "documents $m"; }
  printf '%s\n' "$out" | grep -q '"passed":true' || { echo "$out"; fail "documents $m"; }
  echo "routed $m with documents: passed"
done
out=$(timeout 120 "${mpirun[@]}" "${routed[@]}" -np 2 "$upipe" eval --model "$fix" \
  --tokens "$fix/tokens.npy" --method upipe 2>&1) || { echo "$out"; fail "eval"; }
printf '%s\n' "$out" | grep -q "loss 6.184163" || { echo "$out"; fail "eval loss"; }
echo "routed eval: loss 6.184163"

args=(--seq-len=64 --tile-tokens=64 --steps=12 --cp-size=2 --progress=lines --log-interval=1000)
timeout 300 "${mpirun[@]}" -np 4 "$upipe" train "${args[@]}" --metrics-path="$tmp/mpi.jsonl" \
  > "$tmp/mpi.out" 2>&1 || { cat "$tmp/mpi.out"; fail "train on mpi"; }
timeout 300 "${mpirun[@]}" "${routed[@]}" -np 4 "$upipe" train "${args[@]}" \
  --metrics-path="$tmp/routed.jsonl" > "$tmp/routed.out" 2>&1 ||
  { cat "$tmp/routed.out"; fail "train routed"; }
python3 - "$tmp/mpi.jsonl" "$tmp/routed.jsonl" <<'PY' || fail "routed training differs from mpi"
import json, sys
def steps(path):
    return [(r["step"], r["loss"], r["grad_norm"], r["peak_bytes"]) for r in map(json.loads, open(path).read().splitlines())]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert len(a) == 12, f"{len(a)} steps logged"
assert a == b, f"mpi {a}\nrouted {b}"
print(f"routed train: {len(a)} steps, losses, gradient norms and peaks equal to mpi's bit for bit (last loss {a[-1][1]})")
PY
echo "PASS"
