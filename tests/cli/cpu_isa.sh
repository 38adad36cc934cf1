#!/usr/bin/env bash
# UPIPE_CPU_ISA, as a user sets it: an unknown path is one error line and exit 2; avx2 (every
# x86-64-v3 CPU has it) is the path the JSON output names; amx (bf16 attention on AMX tiles)
# either runs and is named, or, on a CPU without it, is one line naming what the CPU has, exit 2.
# Usage: cpu_isa.sh UPIPE
set -u
upipe=$1
out=$(UPIPE_CPU_ISA=avx3 timeout 60 "$upipe" bench kernel --seq-len 64 2>&1)
rc=$?
echo "$out"
[ "$rc" -eq 2 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] &&
  printf '%s\n' "$out" | grep -q 'UPIPE_CPU_ISA=avx3 is not a CPU path' ||
  { echo "FAIL: UPIPE_CPU_ISA=avx3 -> exit $rc, want 2 and one line"; exit 1; }
out=$(UPIPE_CPU_ISA=avx2 timeout 60 "$upipe" bench kernel --seq-len 256 --heads 2 --kv-heads 1 \
  --iters 1 --json) || { echo "FAIL: bench kernel on avx2"; exit 1; }
printf '%s\n' "$out" | grep -q '"isa":"avx2"' || { echo "$out"; echo "FAIL: no \"isa\":\"avx2\""; exit 1; }
out=$(UPIPE_CPU_ISA=amx timeout 60 "$upipe" bench kernel --seq-len 512 --heads 2 --kv-heads 1 \
  --head-dim 64 --dtype bf16 --iters 1 --json 2>&1)
rc=$?
if [ "$rc" -eq 0 ]; then
  printf '%s\n' "$out" | grep -q '"isa":"amx"' || { echo "$out"; echo "FAIL: no \"isa\":\"amx\""; exit 1; }
else
  echo "$out"
  [ "$rc" -eq 2 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] &&
    printf '%s\n' "$out" | grep -q 'UPIPE_CPU_ISA=amx: this CPU lacks it' ||
    { echo "FAIL: UPIPE_CPU_ISA=amx -> exit $rc, want 0 or 2 and one line"; exit 1; }
fi
echo "PASS"
