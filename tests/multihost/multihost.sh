#!/usr/bin/env bash
# A job across hosts. Two hosts are made as Linux network namespaces (iproute2), each with its own
# hostname (a UTS namespace) and a veth link to a bridge in a third namespace: traffic goes only
# between them (and each one's loopback). mpirun runs in the first host under
# tools/mpirun_graceful.sh with a hostfile of the two addresses (2 slots each) and an rsh agent that
# enters the other host's namespaces in place of ssh (OpenMPI's plm_rsh_agent); ranks talk over
# OpenMPI's TCP transport between the hosts. Ranks 0, 1 run on h1, 2, 3 on h2, so the CP group of
# all 4 ranks spans both hosts and a usp / upipe-ring grid of Ulysses degree 2 keeps each Ulysses
# group inside a host, its ring across them.
#   equal  usp and upipe-ring train 4 steps; every step's loss and gradient norm equal the same run
#          on one host (plain mpirun -np 4) exactly; upipe too, whose all-to-alls over the 4 ranks
#          cross the hosts: its start warns so, naming the Ulysses degree that keeps them within one
#   cut    training with checkpoints every 5 steps and comm.timeout = 5; h2's link is cut
#          (ip link set ... down) mid-training: the job ends non-zero within timeout + 30 s, no
#          process is left in either host, and after the link is restored the newest complete
#          checkpoint resumes across the hosts
#   daemon h2's OpenMPI daemon (orted) is killed mid-training: the job ends non-zero (mpirun's
#          status, 205 with OpenMPI 4.1) and no process is left in either host
#   after_cut, after_stop  h2 is lost after the work is done (its link cut once the run is done;
#          its daemon stopped mid-training): the run trains and checkpoints every step, then the
#          job ends non-zero within 120 s and no process is left in either host
# Without root or network namespaces the cases skip (exit 77, ctest's SKIP_RETURN_CODE) printing
# why. Usage: multihost.sh UPIPE MPIRUN_BINARY CASE
set -u
upipe=$1
mpirun_bin=$2
case_name=$3
here=$(cd "$(dirname "$0")" && pwd)
graceful=$here/../../tools/mpirun_graceful.sh
skip() { echo "SKIP ($case_name): $*"; exit 77; }
fail() { echo "FAIL ($case_name): $*"; [ -f "$tmp/multi.out" ] && tail -30 "$tmp/multi.out"; exit 1; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

[ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
command -v ip > /dev/null && command -v unshare > /dev/null || skip "no ip (iproute2) or unshare"
tmp=$(mktemp -d)
tag=uph$$
sw=${tag}s
hosts=("${tag}1" "${tag}2")
subnet_prefix=10.$((200 + $$ % 50)).$(($$ / 50 % 250))
subnet=$subnet_prefix.0/24
cleanup() {
  for ns in "${hosts[@]}" "$sw"; do
    for p in $(ip netns pids "$ns" 2> /dev/null); do kill -KILL "$p" 2> /dev/null; done
    ip netns del "$ns" 2> /dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$sw" 2> "$tmp/err" || skip "cannot create a network namespace: $(cat "$tmp/err")"
ip -n "$sw" link add br0 type bridge && ip -n "$sw" link set br0 up || fail "no bridge"
for i in 1 2; do
  ns=${hosts[$((i - 1))]}
  ip netns add "$ns" &&
    ip link add eth0 netns "$ns" type veth peer name p$i netns "$sw" &&
    ip -n "$ns" addr add "$subnet_prefix.$i/24" dev eth0 &&
    ip -n "$ns" link set eth0 up && ip -n "$ns" link set lo up &&
    ip -n "$sw" link set p$i master br0 && ip -n "$sw" link set p$i up || fail "no veth link for h$i"
done
# The rsh agent: "agent HOST COMMAND..." runs COMMAND in HOST's namespaces under its hostname.
cat > "$tmp/agent.sh" << EOF
#!/bin/sh
host=\$1
shift
i=\${host##*.}
exec ip netns exec $tag\$i unshare --uts sh -c "hostname h\$i; \$*"
EOF
chmod +x "$tmp/agent.sh"
printf '%s.1 slots=2\n%s.2 slots=2\n' "$subnet_prefix" "$subnet_prefix" > "$tmp/hostfile"
mca=(--hostfile "$tmp/hostfile" --bind-to none -x OMP_NUM_THREADS=1
  --mca plm_rsh_agent "$tmp/agent.sh" --mca oob_tcp_if_include "$subnet"
  --mca btl_tcp_if_include "$subnet" --mca btl self,vader,tcp)
# "${across_hosts[@]}" ARGS...: mpirun -np 4 ARGS in host 1, through tools/mpirun_graceful.sh.
across_hosts=(ip netns exec "${hosts[0]}" unshare --uts sh -c 'hostname h1; exec "$@"' sh
  bash "$graceful" "$mpirun_bin" -np 4 "${mca[@]}")
# The ranks' hosts, in rank order: "h1 h1 h2 h2".
placement=$(timeout 60 "${across_hosts[@]}" sh -c 'echo $OMPI_COMM_WORLD_RANK $(hostname)' | sort -n |
  awk '{ printf "%s%s", sep, $2; sep = " " }')
[ "$placement" = "h1 h1 h2 h2" ] || fail "ranks placed on '$placement', want h1 h1 h2 h2"
echo "4 ranks over the namespaces: $placement"
small=(--seq-len=64 --tile-tokens=64 --progress=lines --log-interval=1000
  --ulysses-degree=2)

# wait_steps N: until the job's metrics file has N steps (at most 120 s).
wait_steps() {
  for _ in $(seq 1200); do
    [ -f "$tmp/m.jsonl" ] && [ "$(wc -l < "$tmp/m.jsonl")" -ge "$1" ] && break
    sleep 0.1
  done
  [ "$(wc -l < "$tmp/m.jsonl")" -ge "$1" ] || fail "training across the hosts did not get going"
}
# job_ends WHAT: waits for the job (at most 120 s) after WHAT happened at t0; sets rc and took.
job_ends() {
  for _ in $(seq 1200); do kill -0 $job 2> /dev/null || break; sleep 0.1; done
  if kill -0 $job 2> /dev/null; then fail "the job still runs 120 s after $1"; fi
  wait $job
  rc=$?
  took=$(secs "$t0" "$(now)")
  echo "the job ended with status $rc $took s after $1"
}
# nothing_left: no live process in either host 10 s after the job ended.
nothing_left() {
  local left
  for _ in $(seq 100); do
    left=""
    for ns in "${hosts[@]}"; do
      for p in $(ip netns pids "$ns"); do
        case $(ps -o stat= -p "$p" 2> /dev/null) in "" | Z*) ;; *) left="$left $p" ;; esac
      done
    done
    [ -z "$left" ] && return 0
    sleep 0.1
  done
  fail "processes left in the hosts 10 s after the job ended:$(ps -o pid=,cmd= -p ${left// /,})"
}

case $case_name in
equal)
  # upipe's all-to-alls over all 4 ranks cross the hosts: a warning naming the Ulysses degree
  # that keeps them within one (never on one host, nor for u = 2 within each host).
  for method in usp upipe-ring upipe; do
    args=(train "${small[@]}" --steps=4 --method=$method)
    [ $method = upipe ] && args=(train "${small[@]/--ulysses-degree=2/}" --steps=4 --method=$method)
    rm -f "$tmp/one.jsonl" "$tmp/multi.jsonl"  # the last method's: a fresh run refuses them
    timeout 120 "$mpirun_bin" --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 \
      -np 4 "$upipe" "${args[@]}" --metrics-path="$tmp/one.jsonl" > "$tmp/one.out" 2>&1 ||
      { cat "$tmp/one.out"; fail "$method on one host failed"; }
    t0=$(now)
    timeout 120 "${across_hosts[@]}" "$upipe" "${args[@]}" --metrics-path="$tmp/multi.jsonl" > "$tmp/multi.out" 2>&1 ||
      fail "$method across the hosts failed"
    echo "$method across 2 hosts: $(secs "$t0" "$(now)") s"
    warn="warning: upipe's all-to-alls span 2 hosts (4 ranks a group): every layer's all-to-alls cross the network; --method upipe-ring --ulysses-degree 2 keeps them within a host (upipe plan --ranks-per-host plans it)"
    grep -q "all-to-alls span" "$tmp/one.out" && fail "$method on one host: a hosts warning"
    if [ $method = upipe ]; then
      grep -qxF "$warn" "$tmp/multi.out" || { cat "$tmp/multi.out"; fail "upipe across hosts: no warning"; }
    else
      grep -q "all-to-alls span" "$tmp/multi.out" && fail "$method (u = 2 within a host): a hosts warning"
    fi
    python3 - "$tmp/one.jsonl" "$tmp/multi.jsonl" "$method" << 'PY' || fail "$method: the losses differ"
import json, sys
one, multi = ([(j["loss"], j["grad_norm"]) for j in map(json.loads, open(p))] for p in sys.argv[1:3])
print(sys.argv[3], "one host:", [l for l, _ in one])
print(sys.argv[3], "2 hosts: ", [l for l, _ in multi])
sys.exit(0 if len(one) == 4 and one == multi else 1)
PY
  done
  ;;
cut)
  timeout_s=5
  "${across_hosts[@]}" "$upipe" train "${small[@]}" --method=usp --steps=100000 \
    --checkpoint-dir="$tmp/ck" --checkpoint-interval=5 --checkpoint-keep=2 \
    --metrics-path="$tmp/m.jsonl" --timeout=$timeout_s > "$tmp/multi.out" 2>&1 &
  job=$!
  wait_steps 12
  t0=$(now)
  ip -n "${hosts[1]}" link set eth0 down
  echo "cut h2's link after $(wc -l < "$tmp/m.jsonl") steps"
  job_ends "the cut"
  echo "(limit: comm.timeout + 30 = $((timeout_s + 30)) s)"
  grep -E "no progress for|launcher" "$tmp/multi.out" | head -4
  [ $rc -ne 0 ] || fail "status 0 after a cut link"
  awk -v t="$took" -v l=$((timeout_s + 30)) 'BEGIN { exit !(t <= l) }' || fail "took $took s"
  nothing_left
  newest=$(ls "$tmp/ck" | grep -v tmp | sort | tail -1)
  [ -f "$tmp/ck/$newest/DONE" ] || fail "no complete checkpoint"
  n=$((10#${newest#step_}))
  ip -n "${hosts[1]}" link set eth0 up
  timeout 120 "${across_hosts[@]}" "$upipe" train "${small[@]}" --method=usp --steps=$((n + 2)) \
    --checkpoint-dir="$tmp/ck" --resume > "$tmp/multi.out" 2>&1 || fail "resume after the cut failed"
  grep "^start:" "$tmp/multi.out"
  grep -q "^start: $tmp/ck/$newest " "$tmp/multi.out" || fail "did not resume $newest"
  [ -f "$tmp/ck/step_$(printf %08d $((n + 2)))/DONE" ] || fail "no checkpoint after resuming"
  ;;
daemon)
  # OpenMPI's daemon on h2 (orted, or prted under PRRTE) killed: its ranks lose their launcher.
  "${across_hosts[@]}" "$upipe" train "${small[@]}" --method=usp --steps=100000 \
    --metrics-path="$tmp/m.jsonl" --timeout=5 > "$tmp/multi.out" 2>&1 &
  job=$!
  wait_steps 5
  daemons=""
  for p in $(ip netns pids "${hosts[1]}"); do
    case $(ps -o comm= -p "$p" 2> /dev/null) in orted | prted) daemons="$daemons $p" ;; esac
  done
  [ -n "$daemons" ] || fail "no orted or prted in h2: $(ip netns pids "${hosts[1]}" | xargs -r ps -o comm= -p)"
  t0=$(now)
  kill -KILL $daemons
  echo "killed h2's daemon ($daemons) after $(wc -l < "$tmp/m.jsonl") steps"
  job_ends "the daemon was killed"
  tail -5 "$tmp/multi.out"
  [ $rc -ne 0 ] || fail "status 0 after a daemon was killed"
  nothing_left
  ;;
after_cut | after_stop)
  # A host lost after the work is done (its link cut once the run has said it is done; its daemon
  # stopped mid-training, which training does not need): mpirun and MPI_Finalize wait for that
  # host's daemon forever. Finalize runs under the watchdog (at least 60 s) and every rank leaves
  # a launcher guard (60 s after a normal end), so the job ends and nothing is left.
  "${across_hosts[@]}" "$upipe" train "${small[@]}" --method=usp --steps=6 \
    --checkpoint-dir="$tmp/ck" --metrics-path="$tmp/m.jsonl" --timeout=5 > "$tmp/multi.out" 2>&1 &
  job=$!
  if [ "$case_name" = after_cut ]; then
    for _ in $(seq 1200); do grep -q "^upipe train: done" "$tmp/multi.out" && break; sleep 0.1; done
    grep -q "^upipe train: done" "$tmp/multi.out" || fail "the run did not finish"
    t0=$(now)
    ip -n "${hosts[1]}" link set eth0 down
    what="h2's link was cut after the run was done"
  else
    wait_steps 2
    daemons=""
    for p in $(ip netns pids "${hosts[1]}"); do
      case $(ps -o comm= -p "$p" 2> /dev/null) in orted | prted) daemons="$daemons $p" ;; esac
    done
    [ -n "$daemons" ] || fail "no orted or prted in h2"
    t0=$(now)
    kill -STOP $daemons
    what="h2's daemon was stopped"
  fi
  job_ends "$what"
  grep -E "no progress for|launcher|^upipe train: done" "$tmp/multi.out" | head -4
  [ $rc -ne 0 ] || fail "status 0 with a host gone before the job ended"
  [ "$(wc -l < "$tmp/m.jsonl")" -eq 6 ] || fail "the run did not train its 6 steps"
  [ -f "$tmp/ck/step_00000006/DONE" ] || fail "no final checkpoint"
  nothing_left
  ;;
*) fail "unknown case" ;;
esac
echo "PASS $case_name"
