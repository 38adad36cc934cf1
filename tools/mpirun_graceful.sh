#!/usr/bin/env bash
# Runs an mpirun command line so that Ctrl-C (or SIGTERM to this script) stops the job cleanly:
# mpirun is started in its own session, so a terminal's SIGINT reaches only this script, which
# forwards the first SIGINT/SIGTERM to mpirun as SIGUSR1 (mpirun passes it to every rank, the
# trainer finishes the step, checkpoints and exits 0, and so does mpirun). A second one is
# forwarded as SIGTERM: mpirun then kills the ranks at once (exit 1). docs/training-signals.md
# explains why SIGINT/SIGTERM sent to mpirun itself cannot give a clean stop.
# Usage: tools/mpirun_graceful.sh mpirun [MPIRUN ARGS...] PROGRAM [ARGS...]
set -u
setsid "$@" &
job=$!
signals=0
forward() {
  signals=$((signals + 1))
  if [ "$signals" -eq 1 ]; then
    echo "upipe: stopping after the current step (interrupt again to abort)" >&2
    kill -USR1 "$job"
  else
    kill -TERM "$job"
  fi
}
trap forward INT TERM
# wait returns early when a trapped signal arrives; wait again until mpirun has exited.
while :; do
  wait "$job"
  rc=$?
  kill -0 "$job" 2>/dev/null || break
done
exit "$rc"
