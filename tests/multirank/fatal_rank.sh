#!/usr/bin/env bash
# A failing rank (tests/multirank/fatal_rank.cpp) ends the whole 4-rank job with a non-zero status
# instead of hanging the others (124 would be the timeout's).
# Usage: fatal_rank.sh FATAL_RANK_BINARY MPIRUN [MPIRUN ARGS...]
set -u
bin=$1
shift
timeout 60 "$@" -np 4 "$bin"
rc=$?
echo "exit=$rc"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]
