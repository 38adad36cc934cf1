#!/usr/bin/env bash
# `upipe train` end to end under mpirun (2 ranks), one case per argument:
#   learns   the copy task: the copied half's loss falls from ~log V to below 0.5 in 600 steps
#   resume_rules  --resume continues the recorded run's settings; a finished run, or a changed
#            sequence length without --accept-changes, is refused in one line
#   resume   a run stopped by SIGUSR1 (checkpoint, exit 0) and resumed ends with rank files
#            bitwise equal to an uninterrupted run's; the metrics file has every step once;
#            meta.json names the build (`upipe --version`'s id), and the resume line does not;
#            export -> a Hugging Face folder (with the byte tokenizer) that `upipe eval` loads;
#            resume on 1 rank reshards; another build's checkpoint resumes, its start line
#            naming that build
#   kill     a rank killed with SIGKILL mid-run ends the job (non-zero) within 30 s, and the
#            newest complete checkpoint still resumes
#   init     --init-from the committed transformers fixture, one step at lr 0, export: eval of
#            the exported folder gives the fixture's loss (HF weights in, HF weights out), its
#            tokenizer files copied with --tokenizer DIR;
#            another model's weights are refused with exit 2, naming the first field that differs;
#            the run's folder moved: --resume names --model, and resumes with it; its config
#            broken: that config's error
#   hang     a rank stopped with SIGSTOP ends the job within comm.timeout + a few seconds,
#            with the watchdog naming the step
#   time_limit  --time-limit 6s: the job ends by itself (exit 0) with a checkpoint of its last
#            step, saying so, within the limit and the job's own start and end; --resume with
#            SLURM's 0:04 goes on from there; a limit that passed before the first step runs
#            none; --resume without a limit runs to its steps (a limit is the job's); a bare
#            number is refused naming the units
#   packed   a corpus of text files -> `upipe tokenize DIR` (one document per file, Megatron
#            .bin/.idx) -> training on packed documents (data.documents = "index", ring on 2
#            ranks; then DP 2): every step logs its documents; resuming from the step-3
#            checkpoint ends with rank files bitwise equal to the straight run's
# Usage: train.sh UPIPE MPIRUN... -- CASE
set -u
upipe=$1
shift
mpirun=()
while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done
shift
case_name=$1
tmp=$(mktemp -d)
trap 'pkill -KILL -f "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL ($case_name): $*"; exit 1; }
# Small, fast steps: tiny model, S = 64.
small=(--seq-len=64 --tile-tokens=64 --progress=lines --log-interval=1000)

# The value of `key` in the last line of a JSONL file.
last() { python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])[sys.argv[2]])" "$1" "$2"; }
lines() { [ -f "$1" ] && wc -l < "$1" || echo 0; }
# Waits until the JSONL file has at least n lines (at most 60 s).
wait_lines() { for _ in $(seq 600); do [ "$(lines "$1")" -ge "$2" ] && return 0; sleep 0.1; done; fail "no progress in $1"; }

# Runs a long training (name N: files $tmp/N.out, $tmp/N.jsonl; extra args after N) in the
# background, waits for `steps` logged steps, sends `sig` to one rank, and sets rc (mpirun's
# status) and took (seconds from the signal to the end of the job).
disrupt() {
  local sig=$1 steps=$2 name=$3
  shift 3
  "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --steps=100000 \
    --metrics-path="$tmp/$name.jsonl" "$@" > "$tmp/$name.out" 2>&1 &
  local job=$! victim start ranks
  wait_lines "$tmp/$name.jsonl" "$steps"
  # A rank, never mpirun (whose command line holds the same words): the rank's starts with the
  # binary. (The highest pid of both was mpirun once the pids wrapped past 32768: mpirun was
  # stopped, the ranks trained on and the job ran into the test's limit.)
  ranks="^$upipe train .*$tmp/$name.jsonl"
  victim=$(pgrep -f "$ranks" | tail -1)
  start=$(date +%s)
  kill -"$sig" "$victim"
  wait $job; rc=$?
  took=$(( $(date +%s) - start ))
  echo "rank $victim got SIG$sig: the job ended with status $rc after ${took} s"
  # A rank's launcher guard (core/launcher.h) exits the moment mpirun is gone: allow it a second.
  for _ in $(seq 10); do pgrep -f "$ranks" > /dev/null || break; sleep 0.1; done
  pgrep -f "$ranks" && fail "rank processes left behind"
}

case $case_name in
learns)
  timeout 550 "${mpirun[@]}" -np 2 "$upipe" demo --steps=600 --metrics-path="$tmp/m.jsonl" \
    --log-interval=100 > "$tmp/out" 2>&1 || { cat "$tmp/out"; fail "demo failed"; }
  cat "$tmp/out" | tail -12
  first=$(head -1 "$tmp/m.jsonl" | python3 -c "import json,sys; print(json.load(sys.stdin)['copy_loss'])")
  final=$(last "$tmp/m.jsonl" copy_loss)
  echo "copy loss: step 1 $first, step 600 $final (log 256 = 5.545)"
  python3 -c "import sys; f,l=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if f > 5.0 and l < 0.5 else 1)" \
    "$first" "$final" || fail "copy loss $first -> $final, want > 5.0 -> < 0.5"
  # The end says what the whole run did (a log line's tokens/s is its step's).
  grep -qE '^this run: 600 steps in [0-9:]+: [0-9,]+ tok/s/rank and MFU [0-9.]+% over them, device peak [0-9.]+ [KM]iB$' "$tmp/out" ||
    fail "no summary of the run: $(grep '^this run' "$tmp/out")"
  ;;
resume)
  args=("${small[@]}" --steps=300 --checkpoint-keep=2)
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${args[@]}" --checkpoint-dir="$tmp/a" \
    > "$tmp/a.out" 2>&1 || { cat "$tmp/a.out"; fail "straight run failed"; }
  # In the background without `timeout`, so that $! is mpirun (ctest's TIMEOUT bounds the test).
  "${mpirun[@]}" -np 2 "$upipe" train "${args[@]}" --checkpoint-dir="$tmp/b" \
    --metrics-path="$tmp/b.jsonl" > "$tmp/b.out" 2>&1 &
  job=$!
  wait_lines "$tmp/b.jsonl" 20
  kill -USR1 $job
  wait $job; rc=$?
  [ $rc -eq 0 ] || { cat "$tmp/b.out"; fail "stopped run exited $rc, want 0"; }
  grep -q "stopped by signal" "$tmp/b.out" || { cat "$tmp/b.out"; fail "no clean-stop message"; }
  stopped=$(ls "$tmp/b" | grep -c step_) ; [ "$stopped" -ge 1 ] || fail "no checkpoint at the stop"
  [ -d "$tmp/b/step_00000300" ] && fail "the run finished before the signal; cannot test resume"
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${args[@]}" --checkpoint-dir="$tmp/b" \
    --metrics-path="$tmp/b.jsonl" --resume > "$tmp/c.out" 2>&1 || { cat "$tmp/c.out"; fail "resume failed"; }
  grep "^start:" "$tmp/c.out"
  # The checkpoint names the build that wrote it, as `upipe --version` does; the same build
  # resuming says nothing about it.
  id=$("$upipe" --version | head -1 | sed 's/^upipe //')
  python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["upipe"] != sys.argv[2])' \
    "$tmp/b/step_00000300/meta.json" "$id" || fail "meta.json does not record upipe $id"
  grep "^start:" "$tmp/c.out" | grep -q ", by upipe" && fail "the same build's checkpoint named as another's"
  # The same tensors bitwise; only the run identity in the metadata differs (two runs).
  for f in rank_00000.safetensors rank_00001.safetensors; do
    python3 "$(dirname "$0")/same_tensors.py" --ignore run_id "$tmp/a/step_00000300/$f" \
      "$tmp/b/step_00000300/$f" || fail "$f differs after resume"
  done
  python3 - "$tmp/b.jsonl" <<'PY' || fail "metrics file after resume"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
sys.exit(0 if steps == list(range(1, 301)) else 1)
PY
  echo "stopped at $(grep -o 'after step [0-9]*' "$tmp/b.out"), resumed to 300: rank files identical"
  # Export, then evaluate the exported folder.
  "${mpirun[@]}" -np 1 "$upipe" export "$tmp/b" "$tmp/hf" --dtype fp32 || fail "export failed"
  [ -f "$tmp/hf/config.json" ] && [ -f "$tmp/hf/model.safetensors" ] || fail "export wrote no folder"
  # The tiny preset's 256 ids are bytes: the export carries the byte tokenizer.
  python3 "$(dirname "$0")/byte_tokenizer.py" "$tmp/hf" || fail "the export's tokenizer"
  "${mpirun[@]}" -np 2 "$upipe" eval --model "$tmp/hf" --seq-len 64 --method ulysses --json \
    > "$tmp/eval.json" || fail "eval of the exported folder failed"
  # Resharding: the 2-rank checkpoint continues on 1 rank.
  timeout 300 "${mpirun[@]}" -np 1 "$upipe" train "${small[@]}" --steps=302 \
    --checkpoint-dir="$tmp/b" --resume > "$tmp/d.out" 2>&1 || { cat "$tmp/d.out"; fail "1-rank resume failed"; }
  grep -q "resharded" "$tmp/d.out" || { cat "$tmp/d.out"; fail "no resharding on 1 rank"; }
  [ -f "$tmp/b/step_00000302/DONE" ] || fail "the resharded run wrote no checkpoint"
  # Another build's checkpoint (its meta.json names another upipe, DONE's checksum re-made to
  # match) is read all the same, and the start line says who wrote it.
  mkdir "$tmp/e" && cp -r "$tmp/b/step_00000302" "$tmp/e/"
  python3 - "$tmp/e/step_00000302" <<'PY' || fail "could not rewrite the checkpoint's build"
import ctypes, json, sys
d = sys.argv[1]
meta = json.load(open(d + "/meta.json"))
meta["upipe"] = "0.0.0-elsewhere"
text = json.dumps(meta).encode()
open(d + "/meta.json", "wb").write(text)
xxh = ctypes.CDLL("libxxhash.so.0")
xxh.XXH3_64bits.restype = ctypes.c_uint64
xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
done = open(d + "/DONE").read().splitlines()
line = "meta.json xxh3-64 %016x" % xxh.XXH3_64bits(text, len(text))
new = [line if l.startswith("meta.json ") else l for l in done]
if new == done:
    sys.exit("DONE has no meta.json line")
open(d + "/DONE", "w").write("\n".join(new) + "\n")
PY
  timeout 300 "${mpirun[@]}" -np 1 "$upipe" train "${small[@]}" --steps=303 \
    --checkpoint-dir="$tmp/e" --resume > "$tmp/e.out" 2>&1 || { cat "$tmp/e.out"; fail "resume of another build's checkpoint failed"; }
  grep "^start:" "$tmp/e.out"
  grep "^start:" "$tmp/e.out" | grep -q ", by upipe 0.0.0-elsewhere)" || { cat "$tmp/e.out"; fail "the start line does not name the other build"; }
  ;;
packed)
  mkdir -p "$tmp/corpus"
  for i in $(seq 1 30); do
    python3 -c "import random,sys; random.seed(int(sys.argv[1])); print(' '.join(random.choice(['the','cat','sat','on','a','mat']) for _ in range(random.randint(1, 8))))" "$i" \
      > "$tmp/corpus/doc$(printf %02d "$i").txt"
  done
  "$upipe" tokenize "$tmp/corpus" "$tmp/corpus_tok" | grep -q "30 documents" || fail "tokenize DIR"
  # The prefix (or its .bin) without --documents=index says how it is read.
  for p in "$tmp/corpus_tok" "$tmp/corpus_tok.bin"; do
    out=$("$upipe" train "${small[@]}" --steps=1 --data-kind=files --data-path="$p" 2>&1); rc=$?
    [ $rc -eq 2 ] && echo "$out" | grep -q "Megatron .*--documents index" ||
      { echo "$out"; fail "--data-path $p without --documents=index: exit $rc"; }
  done
  args=("${small[@]}" --data-kind=files --data-path="$tmp/corpus_tok" --documents=index --steps=6
        --method=ring --checkpoint-interval=3 --checkpoint-keep=3)
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${args[@]}" --checkpoint-dir="$tmp/a" \
    --metrics-path="$tmp/a.jsonl" --log-interval=1 > "$tmp/a.out" 2>&1 || { cat "$tmp/a.out"; fail "packed run failed"; }
  grep -q "docs |" "$tmp/a.out" || { cat "$tmp/a.out"; fail "no documents in the log"; }
  python3 - "$tmp/a.jsonl" <<'PY' || fail "documents in the metrics"
import json, sys
docs = [json.loads(l)["documents"] for l in open(sys.argv[1])]
print("documents per step:", docs)
sys.exit(0 if len(docs) == 6 and all(d >= 2 for d in docs) else 1)
PY
  mkdir -p "$tmp/b" && cp -r "$tmp/a/step_00000003" "$tmp/b/"
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${args[@]}" --checkpoint-dir="$tmp/b" --resume \
    > "$tmp/b.out" 2>&1 || { cat "$tmp/b.out"; fail "packed resume failed"; }
  for f in rank_00000.safetensors rank_00001.safetensors; do
    python3 "$(dirname "$0")/same_tensors.py" "$tmp/a/step_00000006/$f" "$tmp/b/step_00000006/$f" ||
      fail "$f differs after resume"
  done
  # --documents typed again alone on --resume is checked on top of the recorded run (it was
  # refused before, checked alone: 'needs data.kind = "files"'); another value is a change.
  mkdir -p "$tmp/c" && cp -r "$tmp/a/step_00000003" "$tmp/c/"
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" train --checkpoint-dir="$tmp/c" --resume \
    --documents=eos:0 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q -e '--documents index -> eos:0 would change' ||
    { echo "$out"; fail "a changed --documents on --resume: exit $rc"; }
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train --checkpoint-dir="$tmp/c" --resume \
    --documents=index > "$tmp/c.out" 2>&1 || { cat "$tmp/c.out"; fail "--resume --documents=index failed"; }
  grep -q "continues from step 3" "$tmp/c.out" || { cat "$tmp/c.out"; fail "no resume line"; }
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --data-kind=files \
    --data-path="$tmp/corpus_tok" --documents=index --steps=2 --cp-size=1 > "$tmp/dp.out" 2>&1 ||
    { cat "$tmp/dp.out"; fail "packed DP 2 run failed"; }
  # The user's data and no --checkpoint-dir: said at the start and at the end (the end alone said
  # it only when stopped).
  grep -q "^warning: no --checkpoint-dir is set: the trained weights are not saved" "$tmp/dp.out" &&
    grep -q "^upipe train: done, 2 steps; no checkpoint.dir was set, so nothing was saved" "$tmp/dp.out" &&
    grep -q "^stop cleanly (finish the step, exit 0): kill -USR1" "$tmp/dp.out" ||
    { cat "$tmp/dp.out"; fail "a run that saves nothing does not say so"; }
  ! grep -q "no --checkpoint-dir is set" "$tmp/c.out" || { cat "$tmp/c.out"; fail "a run with a checkpoint dir warned"; }
  # The data moved (the same bytes under another path): the same run, checked by its content.
  mkdir -p "$tmp/moved" "$tmp/m" && cp "$tmp"/corpus_tok.bin "$tmp"/corpus_tok.idx "$tmp/moved/" &&
    cp -r "$tmp/a/step_00000003" "$tmp/m/"
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train --checkpoint-dir="$tmp/m" --resume \
    --data-path="$tmp/moved/corpus_tok" > "$tmp/m.out" 2>&1 || { cat "$tmp/m.out"; fail "resume from moved data failed"; }
  grep -q "corpus_tok: the data read there must be the run's" "$tmp/m.out" || { cat "$tmp/m.out"; fail "no moved-data line"; }
  for f in rank_00000.safetensors rank_00001.safetensors; do
    python3 "$(dirname "$0")/same_tensors.py" "$tmp/a/step_00000006/$f" "$tmp/m/step_00000006/$f" ||
      fail "$f differs after resuming from the moved data"
  done
  # The data changed under the checkpoint (a document edited, the corpus tokenized again): the
  # remaining steps would read other sequences, so --resume is refused unless accepted.
  echo "the cat sat on the mat again" > "$tmp/corpus/doc07.txt"
  "$upipe" tokenize --force "$tmp/corpus" "$tmp/corpus_tok" > /dev/null || fail "tokenize again"
  mkdir -p "$tmp/d" && cp -r "$tmp/a/step_00000003" "$tmp/d/"
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" train --checkpoint-dir="$tmp/d" --resume 2>&1); rc=$?
  [ $rc -eq 2 ] && [ "$(echo "$out" | grep -c 'is not the data the run read when')" -eq 1 ] ||
    { echo "$out"; fail "resume onto changed data: exit $rc"; }
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train --checkpoint-dir="$tmp/d" --resume --accept-changes \
    > "$tmp/d.out" 2>&1 || { cat "$tmp/d.out"; fail "resume onto changed data, accepted, failed"; }
  grep -q "its data changed, accepted" "$tmp/d.out" || { cat "$tmp/d.out"; fail "no accepted data change"; }
  echo "packed: resumed from step 3 to 6, rank files identical (moved data too); changed data refused unless accepted"
  ;;
kill)
  disrupt KILL 50 k --checkpoint-dir="$tmp/k" --checkpoint-interval=20
  [ $rc -ne 0 ] || fail "status 0 after a killed rank"
  [ $took -le 30 ] || fail "took ${took} s (> 30 s)"
  # The newest complete checkpoint resumes and trains two more steps.
  newest=$(ls "$tmp/k" | grep -v tmp | sort | tail -1)
  n=$((10#${newest#step_}))
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --steps=$((n + 2)) \
    --checkpoint-dir="$tmp/k" --resume > "$tmp/r.out" 2>&1 || { cat "$tmp/r.out"; fail "resume after the kill failed"; }
  grep "^start:" "$tmp/r.out"
  [ -f "$tmp/k/step_$(printf %08d $((n + 2)))/DONE" ] || fail "no checkpoint after resuming from $newest"
  # A stop signal while the process is still starting (MPI_Init, before the handlers) waits for
  # them: the run stops after its first step with a checkpoint, exit 0 (it died of the signal at
  # 0.1, 0.2 and 0.3 s, seen). Before main (the shared libraries loading, ~40 ms) it still kills.
  "$upipe" train "${small[@]}" --steps=1000 --checkpoint-dir="$tmp/early" > "$tmp/early.out" 2>&1 &
  pid=$!
  sleep 0.2
  kill -USR1 $pid
  wait $pid
  rc=$?
  [ $rc -eq 0 ] && grep -q "stopped by signal 10 after step" "$tmp/early.out" || { cat "$tmp/early.out"; fail "an early SIGUSR1: exit $rc"; }
  ;;
init)
  fixture=$(dirname "$0")/../fixtures/hf/llama
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --init-from "$fixture" \
    --model="$fixture" --steps=1 --lr=0 --checkpoint-dir="$tmp/i" \
    > "$tmp/i.out" 2>&1 || { cat "$tmp/i.out"; fail "training from the fixture failed"; }
  grep "^start:" "$tmp/i.out"
  grep -q "Hugging Face weights from" "$tmp/i.out" || fail "not started from the fixture"
  # The fixture is tied: its head takes the embedding's gradient again at each micro-step (a
  # second micro-step failed a CHECK). DP 1 x 2 micro-steps and DP 2 x 1 give the same losses.
  for split in "--cp-size=2 --micro-steps=2" "--cp-size=1 --micro-steps=1"; do
    # shellcheck disable=SC2086
    timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --init-from "$fixture" --model="$fixture" \
      --data-kind=random --steps=3 $split --checkpoint-dir= --metrics-path="$tmp/tied$(echo $split | tr -dc 0-9).jsonl" \
      > "$tmp/tied.out" 2>&1 || { cat "$tmp/tied.out"; fail "tied model, $split"; }
  done
  python3 - "$tmp/tied22.jsonl" "$tmp/tied11.jsonl" <<'PY' || fail "tied model: micro-steps and DP disagree"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
print("tied, DP 1 x 2 micro-steps:", a, "DP 2 x 1:", b)
assert len(a) == len(b) == 3 and all(abs(x - y) <= 1e-6 * abs(y) for x, y in zip(a, b))
PY
  "${mpirun[@]}" -np 1 "$upipe" export "$tmp/i" "$tmp/hf" --dtype fp32 || fail "export failed"
  out=$("${mpirun[@]}" -np 2 "$upipe" eval --model "$tmp/hf" --tokens "$fixture/tokens.npy" \
    --method ulysses 2>&1) || { echo "$out"; fail "eval of the export failed"; }
  echo "$out" | grep loss
  echo "$out" | grep -q -F "loss 6.184163" || fail "the exported weights do not give the fixture's loss 6.184163"
  # Sharded as save_pretrained shards (model-0000K-of-0000N.safetensors + the index): the same.
  "${mpirun[@]}" -np 1 "$upipe" export "$tmp/i" "$tmp/hfs" --dtype fp32 --max-shard-size 64K |
    grep -q "shards, bound 64.0 KiB" || fail "no sharded export"
  [ -f "$tmp/hfs/model.safetensors.index.json" ] && [ ! -e "$tmp/hfs/model.safetensors" ] &&
    ls "$tmp/hfs" | grep -q -E '^model-00001-of-0000[2-9]\.safetensors$' || { ls "$tmp/hfs"; fail "sharded export files"; }
  out=$("${mpirun[@]}" -np 2 "$upipe" eval --model "$tmp/hfs" --tokens "$fixture/tokens.npy" \
    --method ulysses 2>&1) || { echo "$out"; fail "eval of the sharded export failed"; }
  echo "$out" | grep -q -F "loss 6.184163" || fail "the sharded export does not give the fixture's loss"
  # --tokenizer DIR copies a Hugging Face folder's tokenizer files, byte for byte; a folder
  # without any is refused before anything is written.
  mkdir "$tmp/tok" && echo '{"tokenizer_class": "PreTrainedTokenizerFast"}' > "$tmp/tok/tokenizer_config.json" &&
    printf 'a b\n' > "$tmp/tok/merges.txt" && echo '{}' > "$tmp/tok/unrelated.json"
  "${mpirun[@]}" -np 1 "$upipe" export "$tmp/i" "$tmp/hf2" --tokenizer "$tmp/tok" || fail "export --tokenizer DIR failed"
  cmp "$tmp/tok/tokenizer_config.json" "$tmp/hf2/tokenizer_config.json" && cmp "$tmp/tok/merges.txt" "$tmp/hf2/merges.txt" ||
    fail "the tokenizer files were not copied"
  [ -e "$tmp/hf2/unrelated.json" ] && fail "a file that is not a tokenizer's was copied"
  out=$("${mpirun[@]}" -np 1 "$upipe" export "$tmp/i" "$tmp/hf3" --tokenizer "$fixture" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "holds no tokenizer files" && [ ! -e "$tmp/hf3" ] ||
    { echo "$out"; fail "--tokenizer of a folder without one: exit $rc"; }
  # A tokenizer whose ids reach past the model's vocabulary (the fixture's 256) is refused: its
  # tokens would index past the embedding.
  mkdir "$tmp/tokbig" && python3 -c 'import json,sys; json.dump({"model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(1000)}}, "added_tokens": [{"id": 1000, "content": "<x>"}]}, open(sys.argv[1], "w"))' \
    "$tmp/tokbig/tokenizer.json"
  out=$("${mpirun[@]}" -np 1 "$upipe" export "$tmp/i" "$tmp/hf4" --tokenizer "$tmp/tokbig" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "has token ids up to 1000, past the model's vocabulary of 256" && [ ! -e "$tmp/hf4" ] ||
    { echo "$out"; fail "--tokenizer with more ids than the vocabulary: exit $rc"; }
  # Ids that are no ids: negative (and 2^63 - 1, whose + 1 overflowed), or fractional.
  for bad in '-7' '9223372036854775807' '1.5'; do
    echo "{\"model\": {\"vocab\": {\"a\": 0, \"b\": $bad}}}" > "$tmp/tokbig/tokenizer.json"
    out=$("${mpirun[@]}" -np 1 "$upipe" export "$tmp/i" "$tmp/hf4" --tokenizer "$tmp/tokbig" 2>&1); rc=$?
    [ $rc -eq 2 ] && echo "$out" | grep -q -e "has the token id $bad, which is no id" -e "has token ids up to $bad, past" &&
      [ ! -e "$tmp/hf4" ] || { echo "$out"; fail "--tokenizer with the id $bad: exit $rc"; }
  done
  # The run's own --init-from folder is never an export's folder, even forced (a copy of the
  # fixture: a broken refusal must not damage the source tree).
  cp -r "$fixture" "$tmp/fx"
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --init-from "$tmp/fx" \
    --model="$tmp/fx" --steps=1 --lr=0 --checkpoint-dir="$tmp/ifx" > "$tmp/ifx.out" 2>&1 ||
    { cat "$tmp/ifx.out"; fail "training from the fixture's copy failed"; }
  out=$("${mpirun[@]}" -np 1 "$upipe" export "$tmp/ifx" "$tmp/fx" --force 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "is the run's --init-from directory" &&
    diff -r "$fixture" "$tmp/fx" > /dev/null ||
    { echo "$out"; fail "export --force into the run's --init-from folder: exit $rc"; }
  # The export carries the model config's special token ids and, beside the tokenizer, the
  # generation config of the run's folder.
  echo '{"tokenizer_class": "PreTrainedTokenizerFast"}' > "$tmp/fx/tokenizer_config.json"
  echo '{"eos_token_id": 1, "max_new_tokens": 7}' > "$tmp/fx/generation_config.json"
  "${mpirun[@]}" -np 1 "$upipe" export "$tmp/ifx" "$tmp/hfx" > "$tmp/hfx.out" 2>&1 || { cat "$tmp/hfx.out"; fail "export"; }
  python3 -c "import json,sys; c=json.load(open(sys.argv[1])); assert (c['bos_token_id'], c['eos_token_id']) == (0, 1), c" \
    "$tmp/hfx/config.json" || fail "the exported config.json lacks the fixture's bos/eos ids"
  cmp "$tmp/fx/generation_config.json" "$tmp/hfx/generation_config.json" || fail "generation_config.json not carried"
  # The run's --init-from folder gone (moved): its tokenizer is not guessed (the byte tokenizer
  # was exported in its place); --tokenizer says where it is now.
  mv "$tmp/fx" "$tmp/fx_moved"
  out=$("${mpirun[@]}" -np 1 "$upipe" export "$tmp/ifx" "$tmp/hfgone" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "the run's --init-from directory $tmp/fx is not there any more" &&
    [ ! -e "$tmp/hfgone" ] || { echo "$out"; fail "export with the --init-from folder gone: exit $rc"; }
  "${mpirun[@]}" -np 1 "$upipe" export "$tmp/ifx" "$tmp/hfgone" --tokenizer "$tmp/fx_moved" > /dev/null ||
    fail "export --tokenizer of the moved folder"
  # ... and --resume: the recorded folder gone names the checkpoint and --model (it said only that
  # the path was neither a config.json, a directory nor a preset); --model where it is now resumes
  # (it was refused as another model), said in the resume lines.
  cp -r "$tmp/ifx" "$tmp/ifx2"
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --checkpoint-dir="$tmp/ifx2" \
    --resume --steps=2 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q -F "the run in $tmp/ifx2/step_00000001 was recorded with --model $tmp/fx; give --model DIR where that model's folder is now" ||
    { echo "$out"; fail "--resume with the model's folder gone: exit $rc"; }
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --checkpoint-dir="$tmp/ifx2" \
    --resume --steps=2 --model="$tmp/fx_moved" > "$tmp/mv.out" 2>&1 || { cat "$tmp/mv.out"; fail "--resume --model MOVED failed"; }
  grep -q -F -- "--model $tmp/fx -> $tmp/fx_moved: the model there must be the run's" "$tmp/mv.out" ||
    { cat "$tmp/mv.out"; fail "the moved model is not said"; }
  mv "$tmp/fx_moved" "$tmp/fx"
  # The recorded folder there but its config unreadable: that config's own error, not "moved".
  mkdir "$tmp/fx_moved" && echo '{"hidden_size": ' > "$tmp/fx_moved/config.json"
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --checkpoint-dir="$tmp/ifx2" \
    --resume --steps=3 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q -F "$tmp/fx_moved/config.json" &&
    ! echo "$out" | grep -q "where that model's folder is now" ||
    { echo "$out"; fail "--resume with the model's config broken: exit $rc"; }
  rm -r "$tmp/fx_moved"
  # A checkpoint given where a Hugging Face folder belongs says to export it first.
  out=$("$upipe" train "${small[@]}" --init-from "$tmp/ifx" --steps=1 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "is a training checkpoint, not a Hugging Face model; export it first: .*then --init-from OUT_DIR" ||
    { echo "$out"; fail "train --init-from CHECKPOINT: exit $rc"; }
  # A preset trained from a folder (--model tiny --init-from DIR) takes the folder's special
  # token ids into its checkpoints and export (a preset names none).
  "$upipe" train "${small[@]}" --model=tiny --steps=1 --checkpoint-dir="$tmp/t0" > /dev/null 2>&1 &&
    "$upipe" export "$tmp/t0" "$tmp/tinyhf" > /dev/null || fail "a tiny folder"
  python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c.update(bos_token_id=0, eos_token_id=[1, 2]); json.dump(c, open(p, 'w'))" "$tmp/tinyhf/config.json"
  "$upipe" train "${small[@]}" --model=tiny --init-from "$tmp/tinyhf" --steps=1 --checkpoint-dir="$tmp/t1" > /dev/null 2>&1 &&
    "$upipe" export "$tmp/t1" "$tmp/tinyhf2" > /dev/null || fail "tiny from its folder"
  python3 -c "import json,sys; c=json.load(open(sys.argv[1])); assert (c['bos_token_id'], c['eos_token_id']) == (0, [1, 2]), c" \
    "$tmp/tinyhf2/config.json" || fail "--model tiny --init-from DIR lost the folder's token ids"
  # Byte ids for a model of a larger vocabulary whose folder holds its own tokenizer: warned once
  # (the export would carry a tokenizer that reads other text as those ids); not for tiny's bytes.
  mkdir "$tmp/v300" && python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c.update(vocab_size=300, tie_word_embeddings=False); json.dump(c, open(sys.argv[2], 'w'))" \
    "$fixture/config.json" "$tmp/v300/config.json" && echo '{}' > "$tmp/v300/tokenizer.json"
  printf 'bytes, not the tokenizer%.0s ' $(seq 40) > "$tmp/v300.txt" && "$upipe" tokenize "$tmp/v300.txt" "$tmp/v300.bin" > /dev/null
  out=$("$upipe" train "${small[@]}" --model="$tmp/v300" --data-kind=files --data-path="$tmp/v300.bin" \
    --steps=1 --checkpoint-dir= --metrics-path= 2>&1) || { echo "$out"; fail "bytes for a larger vocabulary"; }
  [ "$(echo "$out" | grep -c -F "every id of --data-path is below 256 (byte ids, as upipe tokenize writes them), but the model's vocabulary is 300 and $tmp/v300 holds its own tokenizer")" -eq 1 ] ||
    { echo "$out"; fail "no warning for byte ids and a model's own tokenizer"; }
  out=$("$upipe" train "${small[@]}" --model=tiny --data-kind=files --data-path="$tmp/v300.bin" \
    --steps=1 --checkpoint-dir= --metrics-path= 2>&1) || { echo "$out"; fail "bytes for tiny"; }
  echo "$out" | grep -q "below 256" && { echo "$out"; fail "tiny's bytes warned about"; }
  # --init-from alone fine-tunes that directory's model; --model DIR alone starts from random
  # weights and says that DIR's weights are not loaded.
  out=$(timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --init-from "$tmp/fx" --steps=1 \
    --checkpoint-dir= --metrics-path= 2>&1) || { echo "$out"; fail "train --init-from DIR alone failed"; }
  echo "$out" | grep -q "^start: Hugging Face weights from $tmp/fx" || { echo "$out"; fail "--init-from alone"; }
  out=$(timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --model="$tmp/fx" --steps=1 \
    --checkpoint-dir= --metrics-path= 2>&1) || { echo "$out"; fail "train --model=DIR failed"; }
  [ "$(echo "$out" | grep -c -E "^warning: --model[ =]$tmp/fx holds weights, which this run does not load")" -eq 1 ] ||
    { echo "$out"; fail "--model DIR with weights and no --init-from: no warning"; }
  # Another model's weights (the Llama fixture for the Qwen3 preset): its config.json is compared
  # with the run's model field by field before any weights are opened, one line, exit 2.
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --init-from "$fixture" \
    --model=tiny-qwen3 --steps=1 2>&1); rc=$?
  [ $rc -eq 2 ] && [ "$(echo "$out" | grep -c "another model than this run's: field 'architectures'")" -eq 1 ] || { echo "$out"; fail "another model's --init-from: exit $rc"; }
  # ... before the run reserves memory: an 8B run over the small fixture said out-of-memory first.
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --init-from "$fixture" \
    --model=llama3-8b --steps=1 2>&1); rc=$?
  [ $rc -eq 2 ] && [ "$(echo "$out" | grep -c "another model than this run's: field 'head_dim'")" -eq 1 ] || { echo "$out"; fail "8B run over a small --init-from: exit $rc"; }
  ;;
resume_rules)
  # --resume continues the recorded run: its settings, none typed again; a finished run is an
  # error (--print-config still prints it); a changed sequence length is refused unless accepted;
  # a longer run is reported.
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --steps=3 --data-kind=random \
    --lr=1e-3 --checkpoint-dir="$tmp/r" > "$tmp/r0.out" 2>&1 || { cat "$tmp/r0.out"; fail "first run failed"; }
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" train --checkpoint-dir="$tmp/r" --resume 2>&1); rc=$?
  [ $rc -eq 2 ] && [ "$(echo "$out" | grep -c 'has done 3 steps, and --steps 3 leaves none')" -eq 1 ] ||
    { echo "$out"; fail "resuming a finished run: exit $rc"; }
  # --print-config of it still prints the recorded run file (exit 0), the refusal a note on stderr.
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" train --checkpoint-dir="$tmp/r" --resume --print-config 2> "$tmp/pc.err"); rc=$?
  [ $rc -eq 0 ] && echo "$out" | grep -q '^lr = 0.001 ' && echo "$out" | grep -q '^steps = 3 ' &&
    [ "$(grep -c 'note: as given, --resume would be refused: .*leaves none' "$tmp/pc.err")" -eq 1 ] ||
    { echo "$out"; cat "$tmp/pc.err"; fail "--print-config of a finished run: exit $rc"; }
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" train --checkpoint-dir="$tmp/r" --resume --steps=5 --seq-len=128 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q -e '--seq-len 64 -> 128 would change what the remaining steps' ||
    { echo "$out"; fail "a changed --seq-len: exit $rc"; }
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train --checkpoint-dir="$tmp/r" --resume --steps=5 \
    --metrics-path="$tmp/r.jsonl" > "$tmp/r1.out" 2>&1 || { cat "$tmp/r1.out"; fail "resume failed"; }
  grep -q "continues from step 3" "$tmp/r1.out" && grep -q -e "--steps 3 -> 5: the schedule" "$tmp/r1.out" ||
    { cat "$tmp/r1.out"; fail "the resume was not reported"; }
  grep -q '^kind = "random"' "$tmp/r1.out" && grep -q '^lr = 0.001' "$tmp/r1.out" ||
    { cat "$tmp/r1.out"; fail "the recorded run's data and lr were not continued"; }
  [ "$(last "$tmp/r.jsonl" step)" = 5 ] || fail "did not train to step 5"
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train --checkpoint-dir="$tmp/r" --resume --steps=6 \
    --seq-len=128 --accept-changes > "$tmp/r2.out" 2>&1 || { cat "$tmp/r2.out"; fail "accepted change failed"; }
  grep -q "accepted (--accept-changes): --seq-len 64 -> 128" "$tmp/r2.out" || { cat "$tmp/r2.out"; fail "no accepted line"; }
  # Another method: the recorded run's knobs it does not take are dropped and reported (they were
  # refused as if typed: "--overlap is a knob of upipe ...; leave it false").
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --steps=2 --method=upipe-ring --overlap \
    --checkpoint-dir="$tmp/k" > "$tmp/k0.out" 2>&1 || { cat "$tmp/k0.out"; fail "the upipe-ring --overlap run failed"; }
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train --checkpoint-dir="$tmp/k" --resume --steps=3 --method=fpdt \
    --accept-changes > "$tmp/k1.out" 2>&1 || { cat "$tmp/k1.out"; fail "resuming with another method failed"; }
  grep -q -e "--overlap true -> false" "$tmp/k1.out" || { cat "$tmp/k1.out"; fail "the dropped knob was not reported"; }
  # The same global batch cut otherwise (DP 1 x 2 micro-steps -> DP 2 x 1) reads the same data:
  # continued without --accept-changes, the losses those of the run never stopped (to rounding).
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --steps=4 --data-kind=random --micro-steps=2 \
    --checkpoint-dir="$tmp/g" --checkpoint-interval=2 --metrics-path="$tmp/g.jsonl" > "$tmp/g0.out" 2>&1 ||
    { cat "$tmp/g0.out"; fail "the DP 1 x 2 run failed"; }
  rm -r "$tmp/g/step_00000004"
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train --checkpoint-dir="$tmp/g" --resume --cp-size=1 --micro-steps=1 \
    --metrics-path="$tmp/g2.jsonl" > "$tmp/g1.out" 2>&1 || { cat "$tmp/g1.out"; fail "DP 2 x 1 over DP 1 x 2 refused"; }
  grep -q "DP 1 x 2 micro-steps -> DP 2 x 1 on 2 ranks: the same global batch of 2" "$tmp/g1.out" ||
    { cat "$tmp/g1.out"; fail "no line for the batch cut otherwise"; }
  python3 - "$tmp/g.jsonl" "$tmp/g2.jsonl" <<'PY' || fail "the recut batch's losses differ from the run never stopped"
import json, sys
a = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[1])}
b = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[2])}
for s in (3, 4):
    print(f"step {s}: {a[s]!r} uninterrupted, {b[s]!r} recut")
    assert abs(a[s] - b[s]) <= 1e-6 * abs(a[s]), s
PY
  # A stopped demo is continued as its stop line says (--resume; --overwrite to start afresh):
  # demo took neither ("unknown option '--resume'").
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" demo --steps=2 --checkpoint-dir="$tmp/d" > "$tmp/d0.out" 2>&1 ||
    { cat "$tmp/d0.out"; fail "the demo run failed"; }
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" demo --checkpoint-dir="$tmp/d" --resume --steps=3 \
    --metrics-path="$tmp/d.jsonl" > "$tmp/d1.out" 2>&1 || { cat "$tmp/d1.out"; fail "demo --resume failed"; }
  grep -q "continues from step 2" "$tmp/d1.out" && [ "$(last "$tmp/d.jsonl" step)" = 3 ] ||
    { cat "$tmp/d1.out"; fail "demo --resume did not continue the demo's run"; }
  grep -q '^seq_len = 128' "$tmp/d1.out" || { cat "$tmp/d1.out"; fail "the resumed demo lost its own settings"; }
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" demo --checkpoint-dir="$tmp/d" --steps=1 --overwrite > "$tmp/d2.out" 2>&1 ||
    { cat "$tmp/d2.out"; fail "demo --overwrite failed"; }
  ;;
hang)
  disrupt STOP 20 h --timeout=3
  grep "no progress" "$tmp/h.out" | head -3
  [ $rc -ne 0 ] || fail "status 0 after a stopped rank"
  [ $took -le 20 ] || fail "took ${took} s (> 20 s with a 3 s timeout)"
  grep -q "no progress for .* (step [0-9]*" "$tmp/h.out" || { cat "$tmp/h.out"; fail "no watchdog message naming the step"; }
  ;;
time_limit)
  start=$(date +%s.%N)
  timeout 120 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --steps=100000 --time-limit=6s \
    --checkpoint-dir="$tmp/ck" --checkpoint-interval=100 > "$tmp/t1.out" 2>&1 ||
    { cat "$tmp/t1.out"; fail "the run with a time limit failed"; }
  took=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
  line=$(grep "^upipe train: stopped by --time-limit 6s after step" "$tmp/t1.out") ||
    { cat "$tmp/t1.out"; fail "no time-limit stop line"; }
  echo "$line (the job took $took s)"
  n=$(echo "$line" | sed -E 's/.*after step ([0-9]+).*/\1/')
  [ -f "$tmp/ck/step_$(printf %08d "$n")/DONE" ] || fail "no checkpoint of step $n"
  # Within the limit, with a margin for mpirun's start and the job's end outside it.
  python3 -c "import sys; sys.exit(float(sys.argv[1]) > 6 + 4)" "$took" || fail "the job took $took s with --time-limit 6s"
  timeout 120 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --checkpoint-dir="$tmp/ck" --resume \
    --time-limit=0:04 > "$tmp/t2.out" 2>&1 || { cat "$tmp/t2.out"; fail "the resumed run failed"; }
  m=$(grep "^upipe train: stopped by --time-limit 4s after step" "$tmp/t2.out" | sed -E 's/.*after step ([0-9]+).*/\1/')
  [ -n "$m" ] && [ "$m" -gt "$n" ] || { cat "$tmp/t2.out"; fail "the resumed run did not go on from step $n"; }
  # The launch counts: each rank process sleeps 2 s before it becomes upipe (exec: the same process).
  timeout 120 "${mpirun[@]}" -np 2 bash -c 'sleep 2; exec "$0" "$@"' "$upipe" train "${small[@]}" \
    --checkpoint-dir="$tmp/ck" --resume --time-limit=1s > "$tmp/t3.out" 2>&1 ||
    { cat "$tmp/t3.out"; fail "a passed limit failed"; }
  [ ! -e "$tmp/ck/step_$(printf %08d "$((m + 1))")" ] || fail "a step ran past a passed limit"
  grep -q "^upipe train: --time-limit 1s had passed before the first step" "$tmp/t3.out" ||
    { cat "$tmp/t3.out"; fail "a limit passed before the first step is not said"; }
  # A limit is the job's: a resumed run without one does not inherit it (it ran to its steps).
  timeout 120 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --checkpoint-dir="$tmp/ck" --resume \
    --steps=$((m + 3)) > "$tmp/t4.out" 2>&1 || { cat "$tmp/t4.out"; fail "the resumed run without a limit failed"; }
  grep -q "^upipe train: done, $((m + 3)) steps" "$tmp/t4.out" || { cat "$tmp/t4.out"; fail "the recorded limit was kept"; }
  out=$("$upipe" train --time-limit=240 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q -F -- "--time-limit: '240' has no unit: write 240s, 240m or 240h" ||
    { echo "$out"; fail "a bare number: exit $rc"; }
  ;;
*) fail "unknown case" ;;
esac
echo "PASS $case_name"
