#!/usr/bin/env bash
# bench comm on one rank (no mpirun) times a copy within the process: it says so on stderr and in
# its JSON ("one_rank": true), where a sendrecv to itself was reported as 50 GB/s of busbw; on two
# ranks it says nothing of the kind.
# Usage: bench_comm_ranks.sh UPIPE_BINARY MPIRUN [MPIRUN ARGS...]
set -u
upipe=$1
shift
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check() {  # check NAME RANKS_WANT ONE_RANK_WANT WARNINGS_WANT
  local name=$1 ranks=$2 one=$3 warned=$4 got
  got=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["ranks"], j["one_rank"])' "$tmp/$name.json" 2>&1)
  local n
  n=$(grep -c "^upipe bench comm: warning: one rank: nothing crosses a link" "$tmp/$name.err")
  if [ "$got" = "$ranks $one" ] && [ "$n" -eq "$warned" ]; then
    echo "ok $name: ranks, one_rank = $got; $n warning line(s)"
  else
    echo "FAIL $name: ranks, one_rank = '$got' (want '$ranks $one'), $n warning line(s) (want $warned):"
    cat "$tmp/$name.err"
    failures=$((failures + 1))
  fi
}

"$upipe" bench comm --op sendrecv --iters 3 --json > "$tmp/one.json" 2> "$tmp/one.err"
check one 1 True 1
"$upipe" bench comm --iters 3 > /dev/null 2> "$tmp/one_text.err"
if [ "$(grep -c "nothing crosses a link" "$tmp/one_text.err")" -ne 1 ]; then
  echo "FAIL one_text: no warning beside the table"; failures=$((failures + 1))
fi
"$@" -np 2 "$upipe" bench comm --op sendrecv --iters 3 --json > "$tmp/two.json" 2> "$tmp/two.err"
check two 2 False 0
exit $((failures > 0))
