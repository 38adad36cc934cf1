#!/usr/bin/env bash
# `upipe --version`, as a user (or a bug report) runs it: exit 0; the first line names the version
# and the git commit the binary was built from (the checkout's HEAD, when the source is one); then
# the CPU path the kernels run on (UPIPE_CPU_ISA=avx2 shows as avx2), the CUDA backend (with the
# versions of the CUDA libraries it loaded) and the MPI library; under mpirun, printed once, not
# once per rank.
# Usage: version.sh UPIPE SOURCE_DIR MPIRUN...
set -u
upipe=$1 src=$2
shift 2
fail() { echo "$out"; echo "FAIL: $*"; exit 1; }
out=$(UPIPE_CPU_ISA=avx2 timeout 60 "$upipe" --version 2>&1) || fail "--version exited $?"
echo "$out"
first=$(printf '%s\n' "$out" | head -1)
printf '%s\n' "$first" | grep -Eq '^upipe [0-9]+\.[0-9]+\.[0-9]+ \(git ([0-9a-f]{12}(, modified)?|unknown)\)$' ||
  fail "first line is not 'upipe X.Y.Z (git COMMIT)'"
if head=$(git -C "$src" rev-parse --short=12 HEAD 2>/dev/null); then
  printf '%s\n' "$first" | grep -q "(git $head" ||
    fail "the commit is not the checkout's HEAD $head (rebuild after committing)"
fi
printf '%s\n' "$out" | grep -Eq '^cpu: .*kernels on avx2 \(this CPU has: avx2' || fail "no cpu line on avx2"
printf '%s\n' "$out" | grep -Eq '^cuda: (built; .*; driver [^,]+, runtime [0-9]+\.[0-9]+, cuBLASLt [0-9]+\.[0-9]+\.[0-9]+, cuDNN [^,]+, NCCL [0-9]+\.[0-9]+\.[0-9]+$|not built)' ||
  fail "no cuda line (built: with the driver, runtime, cuBLASLt, cuDNN and NCCL versions)"
printf '%s\n' "$out" | grep -Eq '^mpi: Open MPI' || fail "no mpi line"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 4 ] || fail "want 4 lines"
out=$(timeout 60 "$@" -np 2 "$upipe" --version 2>&1) || fail "--version on 2 ranks exited $?"
[ "$(printf '%s\n' "$out" | grep -c '^upipe ')" -eq 1 ] || fail "2 ranks: printed $(printf '%s\n' "$out" | grep -c '^upipe ') times"
echo "PASS"
