#!/usr/bin/env bash
# How the job ends on bad input and out-of-memory, as the user meets it under mpirun: bad input ->
# one error line (rank 0) naming what to change, exit status 2 from every rank; an arena budget
# too small, or a request beyond the machine's memory -> the out-of-memory message naming the tag
# and the request, and the whole job ends with status 3 (not by the timeout).
# Usage: job_errors.sh UPIPE MPIRUN [MPIRUN ARGS...] -- CASE
set -u
upipe=$1
shift
mpirun=()
while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done
case_name=$2

# expect RC PATTERN COUNT NP ARGS...: upipe ARGS on NP ranks exits RC, its output has COUNT lines
# matching PATTERN (grep -E; COUNT "any": at least one).
expect() {
  local rc_want=$1 pattern=$2 count=$3 np=$4
  shift 4
  local out rc n
  out=$(timeout 60 "${mpirun[@]}" -np "$np" "$upipe" "$@" 2>&1)
  rc=$?
  echo "$out"
  n=$(printf '%s\n' "$out" | grep -c -E -e "$pattern")
  if [ "$rc" -ne "$rc_want" ] || { [ "$count" = any ] && [ "$n" -lt 1 ]; } ||
    { [ "$count" != any ] && [ "$n" -ne "$count" ]; }; then
    echo "FAIL: upipe $* -> exit $rc and $n line(s) matching '$pattern'; want $rc_want and $count"
    exit 1
  fi
  echo "PASS $case_name"
}

case $case_name in
bad_config_every_rank)  # three ranks, one error line
  expect 2 'must be divisible by --kv-heads \(3\); try --kv-heads 2' 1 3 check --method upipe \
    --heads 8 --kv-heads 3 ;;
seq_len_hint_even)  # the suggested length is even too (129 was suggested, then refused as odd);
  # ring on 3 ranks: the tiny model's 4 heads split over no all-to-all group of 3, said first
  expect 2 'must be divisible by 6 \(twice the number of ranks: zigzag cuts the sequence into 2C chunks\); try --seq-len 126 or 132$' 1 3 train --steps=1 \
    --method=ring --seq-len=128 --checkpoint-dir= --metrics-path= ;;
model_heads_in_train)  # train's heads are the model's field, not a flag it has; a model's heads
  # are not the user's to change: group sizes that divide them, and ring, come first
  expect 2 '^upipe: error: num_attention_heads of preset tiny \(4\) must be divisible by the number of ranks in the all-to-all group \(3\); run on a group of 1, 2, 4 ranks \(fewer ranks, or --cp-size for a CP group of them\), or --method ring \(any rank count\)' \
    1 3 train --steps=1 --seq-len=1020 ;;
usp_default_degree)  # the default degree is all ranks, not a value the user typed
  expect 2 '^upipe: error: --ulysses-degree 0 \(all 3 ranks\): num_attention_heads of preset tiny \(4\) is not divisible by it; valid degrees on 3 ranks: 1$' \
    1 3 train --steps=1 --seq-len=1020 --method=usp ;;
overlap_without_stages)  # a knob of the methods with head stages only, named with its takers
  expect 2 "--overlap is a knob of upipe, upipe-ring, upipe-fpdt; method 'ring' does not take it" 1 \
    2 check --method ring --overlap --seq-len 256 ;;
out_of_memory)
  expect 3 "out of memory in device arena: tag 'act' requested" any 2 check --method upipe \
    --seq-len 2048 --device-memory 3M
  # A command without a budget setting names only what it takes (bench kernel said "raise the
  # memory budget (--device-memory)", which it refuses).
  expect 3 "in use \(nothing\); choose a configuration with a smaller peak \(a shorter --seq-len, fewer --heads / --kv-heads, or --dtype bf16\)$" \
    1 1 bench kernel --seq-len 1099511627776
  # train plans its step before it loads anything: a run over its budget ends at once, naming
  # the plan of the very run; that command runs, plans the run's peak (the arena's budget is the
  # run's whole device memory: no reserve) and says it does not fit.
  expect 3 "out of memory in device arena, found before anything is loaded .*: rank 0's step requests .* for tag '[a-z_]+' with .* in use, over --device-memory 3M; raise --device-memory or .*says what fits$" \
    1 2 train --steps=1 --seq-len=2048 --device-memory=3M --method=ring --progress=lines
  # (micro-steps change the plan: the command carries them)
  plan=$(timeout 60 "${mpirun[@]}" -np 2 "$upipe" train --steps=1 --seq-len=2048 --device-memory=3M \
    --method=ring --micro-steps=2 --progress=lines 2>&1 | sed -n 's/.*: `upipe plan \(.*\)` says what fits$/\1/p' | head -1)
  [ "$plan" = "--ranks 2 --method=ring --seq-len=2048 --micro-steps=2 --device-memory=3M --reserve 0" ] ||
    { echo "FAIL: train's plan command: '$plan'"; exit 1; }
  expect 0 "^ring +- +2048 +no " 1 1 plan $plan
  echo "PASS $case_name (its plan)" ;;
beyond_machine_memory)  # 2^34 tokens x 512 columns: 32 TiB, within a 1 EiB budget
  expect 3 "out of memory in device arena: tag '.*this machine has" any 2 check --method upipe \
    --seq-len 17179869184 --device-memory 1048576T ;;
*) echo "unknown case $case_name"; exit 2 ;;
esac
