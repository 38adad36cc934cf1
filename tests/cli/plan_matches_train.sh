#!/usr/bin/env bash
# `upipe plan` against `upipe train` as a user runs them: one run file, trained for one step on N
# ranks (its JSONL metrics hold the step's device and host peaks over the ranks, with the worst
# rank's bytes per tag), and planned with `upipe plan RUN.toml --ranks N`. The peaks and every
# tag must be equal, and the peaks train's start-up plan line says, for methods, dtypes, offload, recompute modes and tile sizes off and on the
# default, stage overlap on; and the `upipe train` command a plan prints for its answer runs and peaks at the
# plan's bytes. Usage: plan_matches_train.sh UPIPE MPIRUN [MPIRUN ARGS...]
set -u
upipe=$1
shift
mpirun=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# case NAME RANKS TOML: the run file's memory, parallel and train sections.
case_() {
  local name=$1 ranks=$2 toml=$3
  local run="$tmp/$name.toml"
  printf '%b\n' "$toml" > "$run"
  if ! timeout 300 "${mpirun[@]}" -np "$ranks" "$upipe" train "$run" --steps=1 --progress=lines --device-memory=1T \
      --metrics-path="$tmp/$name.jsonl" > "$tmp/$name.train" 2>&1; then
    cat "$tmp/$name.train"
    echo "FAIL $name: upipe train failed"
    failures=$((failures + 1))
    return
  fi
  # As a user plans in a shell: no OMP_NUM_THREADS (the ranks get one thread each).
  if ! timeout 300 env -u OMP_NUM_THREADS "$upipe" plan "$run" --ranks "$ranks" --device-memory=1T --json > "$tmp/$name.plan" 2>&1; then
    cat "$tmp/$name.plan"
    echo "FAIL $name: upipe plan failed"
    failures=$((failures + 1))
    return
  fi
  if python3 - "$tmp/$name.jsonl" "$tmp/$name.plan" "$name" "$tmp/$name.train" <<'PY'; then
import json, re, sys
run = [json.loads(l) for l in open(sys.argv[1])][-1]
plan = json.load(open(sys.argv[2]))["methods"][0]
# train plans its own step at its start too: "plan: a step peaks at X (N B) ... and Y (M B) ..."
said = re.findall(r"^plan: a step peaks at .*? \((\d+) B\) of device memory per rank \(.*?\) and "
                  r"(?:no host memory|.*? \((\d+) B\) of host memory)", open(sys.argv[4]).read(), re.M)
said = [int(said[0][0]), int(said[0][1] or 0)] if len(said) == 1 else None
pairs = [("device peak", run["peak_bytes"], plan["device_peak_bytes"]),
         ("device tags", run["peak_by_tag"], plan["peak_by_tag"]),
         ("host peak", run["host_peak_bytes"], plan["host_peak_bytes"]),
         ("host tags", run["host_peak_by_tag"], plan["host_peak_by_tag"]),
         ("train's own plan line", [run["peak_bytes"], run["host_peak_bytes"]], said)]
bad = [(what, r, p) for what, r, p in pairs if r != p]
for what, r, p in bad:
    print(f"  {what}: train {r}, plan {p}")
print(f"{'ok' if not bad else 'FAIL'} {sys.argv[3]}: device {run['peak_bytes']} B, "
      f"host {run['host_peak_bytes']} B")
sys.exit(1 if bad else 0)
PY
    :
  else
    failures=$((failures + 1))
  fi
}

case_ defaults 2 '[parallel]\nmethod = "upipe"'
case_ ring_tile100 2 '[parallel]\nmethod = "ring"\n[train]\nseq_len = 512\n[memory]\ntile_tokens = 100'
case_ ulysses_bf16_offload 2 '[parallel]\nmethod = "ulysses"\n[train]\nseq_len = 512\n[memory]\ndtype = "bf16"\ntile_tokens = 128\noffload_stash = true\nstash_dtype = "bf16"'
case_ fpdt_block 2 '[parallel]\nmethod = "fpdt"\nchunks = 2\n[train]\nseq_len = 512\n[memory]\nrecompute = "block"\ntile_tokens = 48'
case_ upipe_none_bf16res 2 '[parallel]\nmethod = "upipe"\n[train]\nseq_len = 256\n[memory]\ndtype = "bf16"\nresidual_dtype = "bf16"\nrecompute = "none"\ntile_tokens = 64'
# Two micro-steps of a model whose LM head sets the peak at the second (the embedding's gradient
# still being reduce-scattered from the first): the plan played one micro-step and fell short.
mkdir -p "$tmp/v512"
printf '%s\n' '{"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": 1, "vocab_size": 512, "rms_norm_eps": 1e-06, "tie_word_embeddings": false}' \
  > "$tmp/v512/config.json"
case_ micro2_v512 1 "[model]\nname = \"$tmp/v512\"\nrandom_weights = true\n[train]\nseq_len = 256\nmicro_steps = 2"
case_ qwen3_usp 2 '[model]\nname = "tiny-qwen3"\n[parallel]\nmethod = "usp"\nulysses_degree = 1\n[train]\nseq_len = 512'
case_ cp2_dp2_upipe_fpdt 4 '[parallel]\ncp_size = 2\nmethod = "upipe-fpdt"\n[train]\nseq_len = 512\nmicro_steps = 2\n[memory]\noffload_stash = true'
case_ upipe_overlap_qwen3 2 '[model]\nname = "tiny-qwen3"\n[parallel]\nmethod = "upipe"\noverlap = true\n[train]\nseq_len = 512\n[memory]\nrecompute = "none"'
# One rank of tiny (H = 4, K = 2, U = 1): two KV sets, so overlap also projects the next set
# during a set's last stage (its second K/V slot and staging: the attention sets the peak at this
# S and tile); the stash offloaded.
case_ upipe_overlap_kv_sets 1 '[parallel]\nmethod = "upipe"\noverlap = true\n[train]\nseq_len = 4096\n[memory]\noffload_stash = true\ntile_tokens = 64'
case_ upipe_fpdt_overlap_bf16 2 '[parallel]\nmethod = "upipe-fpdt"\nchunks = 2\noverlap = true\n[train]\nseq_len = 512\n[memory]\ndtype = "bf16"'
case_ local_none 1 '[parallel]\nmethod = "local"\n[train]\nseq_len = 256\n[memory]\nrecompute = "none"'

# The plan prints the command that runs its answer: run it (one step) and compare again.
# round_trip NAME PLAN-ARGS...: the plan on 2 ranks, then its command.
round_trip() {
  local name=$1
  shift
  if ! env -u OMP_NUM_THREADS "$upipe" plan --ranks 2 --reserve 0 --json "$@" \
      > "$tmp/$name.plan" 2>&1; then
    cat "$tmp/$name.plan"; echo "FAIL $name: upipe plan failed"; failures=$((failures + 1))
    return
  fi
  local cmd words
  cmd=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["methods"][0]["train_command"])' "$tmp/$name.plan")
  echo "plan says: $cmd"
  # "mpirun -np 2 upipe train FLAGS": this test's mpirun and binary, one step, metrics.
  read -r -a words <<< "$cmd"
  [ "${words[0]} ${words[1]} ${words[2]} ${words[3]} ${words[4]}" = "mpirun -np 2 upipe train" ] ||
    { echo "FAIL $name: unexpected command"; failures=$((failures + 1)); }
  if timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${words[@]:5}" --steps=1 --progress=lines \
      --metrics-path="$tmp/$name.jsonl" > "$tmp/$name.train" 2>&1; then
    python3 - "$tmp/$name.jsonl" "$tmp/$name.plan" "$name" <<'PY' || failures=$((failures + 1))
import json, sys
run = [json.loads(l) for l in open(sys.argv[1])][-1]
plan = json.load(open(sys.argv[2]))["methods"][0]
ok = run["peak_bytes"] == plan["device_peak_bytes"] and run["peak_by_tag"] == plan["peak_by_tag"]
print(("ok" if ok else "FAIL") + " %s: the printed command peaks at %d B, the plan %d B"
      % (sys.argv[3], run["peak_bytes"], plan["device_peak_bytes"]))
sys.exit(0 if ok else 1)
PY
  else
    cat "$tmp/$name.train"; echo "FAIL $name: the printed command failed"; failures=$((failures + 1))
  fi
}
round_trip round_trip --model tiny-qwen3 --device-memory=64M --method upipe --stage-heads auto \
  --seq-len 512 --tile-tokens 96 --recompute block
# A budget the plan fills to 79%: nothing the run allocates beyond the plan (MFU's reference GEMM
# included) may push it over.
round_trip tight_budget --model tiny --device-memory=10M --method upipe --seq-len 4096
# ... and its start line says MFU's rate was timed on smaller operands than 1024 x 1024.
if ! grep -q "measured now on [0-9]* x [0-9]* operands (1024 x 1024 do not fit" "$tmp/tight_budget.train"; then
  grep "^start:" "$tmp/tight_budget.train"
  echo "FAIL tight_budget: the start line does not say MFU's GEMM was timed smaller"
  failures=$((failures + 1))
fi

# Documents the data decides (data.documents): the plan of the run file is their worst case, so
# the run fits the plan's peak as its budget, and peaks at or below it (tag docs included).
fixture_tokens="$(cd "$(dirname "$0")/../fixtures/hf/llama" && pwd)/tokens.npy"
eos=$(python3 -c 'import collections,struct,sys; b=open(sys.argv[1],"rb").read(); h=struct.unpack_from("<H",b,8)[0]; ids=struct.unpack_from("<%di" % ((len(b)-10-h)//4), b, 10+h); print(collections.Counter(ids).most_common(1)[0][0])' "$fixture_tokens")
printf '[data]\nkind = "files"\npath = "%s"\ndocuments = "eos:%s"\n[parallel]\nmethod = "ring"\n[train]\nseq_len = 256\n' \
  "$fixture_tokens" "$eos" > "$tmp/docs.toml"
if env -u OMP_NUM_THREADS "$upipe" plan "$tmp/docs.toml" --ranks 2 --device-memory=1T --json > "$tmp/docs.plan" 2>&1; then
  budget=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["documents_worst_case"]; print(j["methods"][0]["device_peak_bytes"])' "$tmp/docs.plan")
  if timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "$tmp/docs.toml" --steps=2 --progress=lines \
      --device-memory="$budget" --metrics-path="$tmp/docs.jsonl" > "$tmp/docs.train" 2>&1; then
    python3 - "$tmp/docs.jsonl" "$tmp/docs.plan" <<'PY' || failures=$((failures + 1))
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
plan = json.load(open(sys.argv[2]))["methods"][0]
docs = [s["documents"] for s in steps]
ok = (all(s["peak_bytes"] <= plan["device_peak_bytes"] for s in steps) and
      all(s["peak_by_tag"].get("docs", 0) <= plan["peak_by_tag"].get("docs", 0) for s in steps) and
      max(docs) > 2)
print(("ok" if ok else "FAIL") + " documents: %s documents a step, peaks %s B within the plan's %d B"
      % (docs, [s["peak_bytes"] for s in steps], plan["device_peak_bytes"]))
sys.exit(0 if ok else 1)
PY
  else
    cat "$tmp/docs.train"; echo "FAIL documents: the run failed in the plan's budget"; failures=$((failures + 1))
  fi
  # Below the worst case, above what the data's documents need: train's own plan warns (its bound
  # does not fit) and the run goes on within its budget.
  actual=$(python3 -c 'import json,sys; print(max(json.loads(l)["peak_bytes"] for l in open(sys.argv[1])))' "$tmp/docs.jsonl")
  if [ -n "$actual" ] && [ "$actual" -lt "$budget" ] &&
      timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "$tmp/docs.toml" --steps=2 --progress=lines \
        --device-memory="$actual" > "$tmp/docs2.train" 2>&1 &&
      [ "$(grep -c "^upipe: warning: with its packed documents at their worst (a document per token), this run's step does not fit its device arena" "$tmp/docs2.train")" -eq 1 ] &&
      grep -q "^upipe train: done, 2 steps" "$tmp/docs2.train"; then
    echo "ok documents: at $actual B, below the worst case's $budget B, warned and ran"
  else
    cat "$tmp/docs2.train"; echo "FAIL documents: a budget below the worst case (${actual:-?} B)"; failures=$((failures + 1))
  fi
else
  cat "$tmp/docs.plan"; echo "FAIL documents: upipe plan failed"; failures=$((failures + 1))
fi

[ "$failures" -eq 0 ] || { echo "$failures case(s) failed"; exit 1; }
echo "PASS: plan = train on every case"
