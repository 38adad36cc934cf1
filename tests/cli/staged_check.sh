#!/usr/bin/env bash
# The GPU's host-staged communicator (src/comm/staged/), driven on the CPU with memcpy copies
# (UPIPE_STAGED_COMM=1), through the commands as typed: every multi-rank strategy's `upipe check`
# passes on 4 ranks (y, dx, every weight gradient against local, communication counts as expected), packed
# documents on ring and upipe, upipe and upipe-fpdt with stage overlap, and `upipe eval` on the
# transformers fixture gives its loss.
# Usage: staged_check.sh UPIPE MPIRUN [MPIRUN ARGS...]
set -u
upipe=$1
shift
mpirun=("$@")
here=$(cd "$(dirname "$0")" && pwd)
fix="$here/../fixtures/hf/llama"
export UPIPE_STAGED_COMM=1
fail() { echo "FAIL: $*"; exit 1; }

for m in ulysses upipe ring usp upipe-ring fpdt upipe-fpdt; do
  out=$(timeout 120 "${mpirun[@]}" -x UPIPE_STAGED_COMM -np 4 "$upipe" check --method "$m" \
    --seq-len 256 --json 2>&1) || { echo "$out"; fail "check --method $m"; }
  printf '%s\n' "$out" | grep -q '"passed":true' || { echo "$out"; fail "$m did not pass"; }
  printf '%s\n' "$out" | grep -q '"communicator":"staged(mpi)"' || { echo "$out"; fail "$m not staged"; }
  echo "staged $m: passed"
done
for m in ring upipe; do
  out=$(timeout 120 "${mpirun[@]}" -x UPIPE_STAGED_COMM -np 4 "$upipe" check --method "$m" \
    --seq-len 256 --doc-lens 1,37,100,3,115 --json 2>&1) || { echo "$out"; fail "documents $m"; }
  printf '%s\n' "$out" | grep -q '"passed":true' || { echo "$out"; fail "documents $m"; }
  echo "staged $m with documents: passed"
done
# Stage overlap: several non-blocking all-to-alls in flight through the staging pool.
for m in upipe upipe-fpdt; do
  out=$(timeout 120 "${mpirun[@]}" -x UPIPE_STAGED_COMM -np 4 "$upipe" check --method "$m" --overlap \
    --seq-len 256 --doc-lens 1,37,100,3,115 --json 2>&1) || { echo "$out"; fail "overlap $m"; }
  printf '%s\n' "$out" | grep -q '"passed":true' || { echo "$out"; fail "overlap $m"; }
  printf '%s\n' "$out" | grep -q '"communicator":"staged(mpi)"' || { echo "$out"; fail "$m not staged"; }
  echo "staged $m with overlap and documents: passed"
done
out=$(timeout 120 "${mpirun[@]}" -x UPIPE_STAGED_COMM -np 2 "$upipe" eval --model "$fix" \
  --tokens "$fix/tokens.npy" --method upipe 2>&1) || { echo "$out"; fail "eval"; }
printf '%s\n' "$out" | grep -q "loss 6.184163" || { echo "$out"; fail "eval loss"; }
echo "PASS"
