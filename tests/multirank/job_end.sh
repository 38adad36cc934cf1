#!/usr/bin/env bash
# How a job ends (tests/multirank/job_end.cpp under mpirun), one case per call:
#   stop   a rank SIGSTOPs itself; the watchdog (3 s) ends the job: non-zero status within 15 s,
#          the message names the all-reduce and the step, and no rank process is left behind.
#   sleep  a rank hangs outside any collective; the same, the message naming step 3.
#   kill   a rank SIGKILLs itself, no watchdog: mpirun ends the job, non-zero, within 30 s.
#   usr1   SIGUSR1 to mpirun: every rank stops cleanly after the same step, mpirun exits 0.
#   term   SIGTERM to one rank only: the all-reduced flag stops every rank after the same step,
#          mpirun exits 0.
#   int    SIGINT to mpirun (Ctrl-C) with --mca odls_base_sigkill_timeout 10: every rank still
#          stops cleanly (mpirun's own status is 1 by OpenMPI's design; printed, not asserted).
#   ctrlc  tools/mpirun_graceful.sh runs mpirun; SIGINT to the script's whole process group (what
#          a terminal's Ctrl-C does): every rank stops cleanly and the script exits 0.
# Usage: job_end.sh CASE JOB_BINARY MPIRUN [MPIRUN ARGS...]
set -u
case_=$1
bin=$2
shift 2
MPIRUN=("$@")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() {
  echo "FAIL ($case_): $*"
  cat "$out"
  exit 1
}
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
pids() { awk '/ ready$/ { print $4 }' "$out"; }
# Every rank process of the job must be gone (a stopped one included); a zombie waiting for the
# container's init to reap it counts as gone.
no_leftovers() {
  for p in $(pids); do
    for _ in $(seq 50); do
      st=$(ps -o stat= -p "$p" 2>/dev/null)
      case $st in "" | Z*) continue 2 ;; esac
      sleep 0.1
    done
    kill -KILL "$p"
    fail "rank process $p is still alive (state $st) 5 s after mpirun exited"
  done
}
# Waits until all $1 ranks printed their ready line.
wait_ready() {
  for _ in $(seq 300); do
    [ "$(pids | wc -l)" -eq "$1" ] && return 0
    sleep 0.1
  done
  fail "the ranks did not start"
}

case $case_ in
stop | sleep | kill)
  np=3
  args=("$case_" 3)
  limit=15
  [ "$case_" = kill ] && args=(kill) && limit=30
  t0=$(now)
  timeout 120 "${MPIRUN[@]}" -np $np "$bin" "${args[@]}" >"$out" 2>&1
  rc=$?
  t=$(secs "$t0" "$(now)")
  echo "$case_: mpirun exit $rc after $t s (limit $limit s)"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "exit status $rc, want non-zero (124: hung)"
  awk -v t="$t" -v l="$limit" 'BEGIN { exit !(t < l) }' || fail "took $t s, want < $limit s"
  case $case_ in
  stop) want='no progress for 3 s in all_reduce \(step 3\)' ;;
  sleep) want='no progress for 3 s in (all_reduce \()?step 3' ;;
  kill) want='' ;;
  esac
  if [ -n "$want" ]; then
    grep -E "^upipe: rank [0-9] \(host [^)]*\): $want" "$out" || fail "no watchdog message matching '$want'"
  fi
  no_leftovers
  ;;
usr1 | term | int | ctrlc)
  np=3
  extra=()
  [ "$case_" = int ] && extra=(--mca odls_base_sigkill_timeout 10)
  if [ "$case_" = ctrlc ]; then
    # Job control on: the script runs in its own process group, as a terminal's foreground job.
    set -m
    bash "$(dirname "$0")/../../tools/mpirun_graceful.sh" "${MPIRUN[@]}" -np $np "$bin" signal \
      >"$out" 2>&1 &
    job=$!
    set +m
  else
    timeout 120 "${MPIRUN[@]}" "${extra[@]}" -np $np "$bin" signal >"$out" 2>&1 &
    job=$!
  fi
  wait_ready $np
  sleep 0.5
  mpirun_pid=$(pgrep -P $job | head -1)
  [ -n "$mpirun_pid" ] || fail "no mpirun under timeout"
  t0=$(now)
  case $case_ in
  usr1) kill -USR1 "$mpirun_pid" ;;
  term) kill -TERM "$(pids | sed -n 2p)" ;;
  int) kill -INT "$mpirun_pid" ;;
  ctrlc) kill -INT -- -"$job" ;;
  esac
  wait $job
  rc=$?
  echo "$case_: mpirun exit $rc, $(secs "$t0" "$(now)") s after the signal"
  [ "$rc" -ne 124 ] || fail "hung"
  stops=$(grep -c 'clean stop after step' "$out")
  steps=$(grep -o 'clean stop after step [0-9]*' "$out" | sort -u | wc -l)
  grep 'clean stop' "$out"
  [ "$stops" -eq $np ] || fail "$stops of $np ranks stopped cleanly"
  [ "$steps" -eq 1 ] || fail "the ranks stopped after different steps"
  [ "$case_" = int ] || [ "$rc" -eq 0 ] || fail "exit status $rc, want 0"
  no_leftovers
  ;;
*)
  echo "unknown case $case_"
  exit 2
  ;;
esac
echo "ok: $case_"
