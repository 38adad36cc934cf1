#!/usr/bin/env bash
# Asynchronous copies (Device::copy_async) waited on where they must be: with
# UPIPE_CPU_COPIES=deferred the CPU runs each copy only when it is waited on (the latest a GPU's
# copy lanes may run it, reordered across the two lanes as far as their dependencies allow), so a
# missing wait or lane dependency reads stale data (a failed check, a different loss) and
# a copy never waited on is an error at the step's sync. Through the commands as typed:
#   fpdt and upipe-fpdt (K/V chunks offloaded and fetched double-buffered), with stage overlap and
#   packed documents, on 1, 2 and 4 ranks: `upipe check` passes, with the same errors against
#   local as with immediate copies (the same bits);
#   `upipe train` with the offloaded stash (saved and fetched asynchronously), fp32 and bf16, each
#   recompute granularity, under every family of strategy (local, ring, the headwise engine with
#   and without stage overlap, usp): the same losses and gradient norms as with immediate copies.
#   An fp32 save runs beside the layer until the first write to its rows (the strategy's output
#   projection, the MLP's tiles call the stash's fence): a write before its fence would change
#   the saved residual and so the losses.
# Usage: async_copies.sh UPIPE MPIRUN [MPIRUN ARGS...]
set -u
upipe=$1
shift
mpirun=("$@")
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# `upipe check` on np ranks with each copy mode; the two JSON error objects must be equal.
check() {
  local np=$1
  shift
  local mode out errs=()
  for mode in immediate deferred; do
    rm -f "$tmp/$mode.jsonl"  # the last call's: a fresh run refuses an existing metrics file
    out=$(UPIPE_CPU_COPIES=$mode timeout 120 "${mpirun[@]}" -x UPIPE_CPU_COPIES -np "$np" \
      "$upipe" check "$@" --json 2>&1) || { echo "$out"; fail "check $* ($mode copies, $np ranks)"; }
    printf '%s\n' "$out" | grep -q '^{.*"passed":true' || { echo "$out"; fail "$* ($mode, $np ranks) did not pass"; }
    errs+=("$(printf '%s\n' "$out" | grep -o '"max_abs_err":{[^}]*}')")
  done
  [ -n "${errs[0]}" ] || fail "check $*: no max_abs_err in its JSON"
  [ "${errs[0]}" = "${errs[1]}" ] || fail "check $* on $np ranks: immediate ${errs[0]} != deferred ${errs[1]}"
  echo "check $* on $np ranks: deferred copies give the same result"
}

for np in 1 2 4; do
  check "$np" --method fpdt --seq-len 256 --chunks 4
done
check 2 --method upipe-fpdt --seq-len 256 --chunks 4 -U 2
check 2 --method upipe-fpdt --seq-len 256 --chunks 4 -U 2 --overlap --doc-lens 1,37,100,3,115
check 4 --method fpdt --seq-len 256 --chunks 2 --doc-lens 1,37,100,3,115
# MHA: a KV set per stage, so overlap projects the next set's chunk and offloads it from its slot.
check 2 --method upipe-fpdt --seq-len 256 --chunks 4 -H 8 -K 8 --overlap

# `upipe train` on np ranks: losses and gradient norms of every step, each copy mode.
train() {
  local np=$1 mode out
  shift
  for mode in immediate deferred; do
    rm -f "$tmp/$mode.jsonl"  # the last call's: a fresh run refuses an existing metrics file
    out=$(UPIPE_CPU_COPIES=$mode timeout 300 "${mpirun[@]}" -x UPIPE_CPU_COPIES -np "$np" "$upipe" \
      train --model tiny --steps 2 --seq-len 512 --progress lines \
      --metrics-path "$tmp/$mode.jsonl" "$@" 2>&1) || { echo "$out"; fail "train $* ($mode copies)"; }
    grep -o '"loss":[^,]*,\|"grad_norm":[^,]*,' "$tmp/$mode.jsonl" > "$tmp/$mode.values"
  done
  [ "$(wc -l < "$tmp/immediate.values")" -eq 4 ] || fail "train $*: expected 2 steps of metrics"
  cmp -s "$tmp/immediate.values" "$tmp/deferred.values" || {
    paste "$tmp/immediate.values" "$tmp/deferred.values"
    fail "train $*: deferred copies changed the losses"
  }
  echo "train $* on $np ranks: deferred copies give the same losses and gradient norms"
}

train 2 --method fpdt --offload-stash
train 2 --method upipe-fpdt -U 2 --offload-stash --recompute block --stash-dtype bf16
train 2 --method upipe --offload-stash --recompute none
train 1 --method local --offload-stash --recompute block
train 1 --method local --offload-stash --recompute none
train 2 --method ring --offload-stash --recompute block
train 2 --method ulysses --offload-stash
train 2 --method upipe -U 2 --overlap --offload-stash --recompute block
train 4 --method usp --ulysses-degree 2 --offload-stash
echo "PASS"
