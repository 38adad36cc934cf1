#!/usr/bin/env bash
# Faults against `upipe` under mpirun (2 ranks), one case per call (docs/training.md, "Faults"):
#   one_rank PHASE  a failure injected on one rank (UPIPE_INJECT_FAULT) in PHASE = startup, data,
#                   init, metrics, checkpoint, resume or export ends every rank within seconds
#                   (the watchdog stays at its 600 s default), non-zero, the cause printed once;
#                   after a failed checkpoint write the last complete checkpoint resumes
#   metrics_dir     --metrics-path in a directory that does not exist (rank 0 alone opens it)
#   metrics_other   a fresh run refuses an existing --metrics-path file (it survives) and replaces
#                   it with --overwrite; --resume refuses a metrics file with a line that is not a
#                   step's (not the run's file), keeps the run's own steps; a second run naming
#                   the file a running one writes is refused
#   checkpoint_dir  a --checkpoint-dir that is a file, or cannot be created, is refused at the start
#                   (exit 2, once, before any step), the file untouched
#   val_uneven      validation of 3 held-out sequences on 2 DP replicas (one runs fewer) ends, with
#                   the validation loss logged (it hung until the watchdog before); a held-out file
#                   shorter than --val-sequences windows is said at the start
#   init_dtype      --init-from a directory whose tensor has an integer dtype: every rank refuses
#   corrupt         a flipped byte in one rank file: --resume (only that rank reads it) and export
#                   end with exit 2 naming the file; export leaves no model.safetensors; a rank
#                   file gone: both name it with the advice a corrupt one gets; a step without
#                   DONE: --resume warns once, naming it, and continues from the one before
#   other_run       a fresh run refuses a checkpoint.dir of another run; --overwrite-checkpoints
#                   (--overwrite's older name) replaces it, and --resume then continues the new run
#   other_model     --resume with a model of the same element counts but other heads is refused,
#                   naming the field
#   export_force    export refuses a non-empty directory; --force removes a stale sharded index that
#                   a reader would prefer (eval then gives the new weights' loss) and a stale
#                   tokenizer, keeps files not the model's; forced, a damaged checkpoint or a
#                   directory in a model file's place changes nothing; the checkpoint, its
#                   directory and "" are refused as the folder
#   data_differs    ranks whose --data-path names other bytes (hosts with their own copies): exit 2,
#                   said once; the same bytes in two places train
#   tokenize_self   `upipe tokenize a.txt a.txt` is refused and the text survives
#   sizes           num_hidden_layers 2^30 -> exit 2; train.seq_len 2^40 and eval --seq-len 2^40 ->
#                   exit 3 with the out-of-memory message, before any allocation; two ranks on this
#                   host each planned at 3/4 of its memory -> exit 3, naming the host, before any
#                   step
#   leftover_tmp    an empty step_N.tmp (a write that never marked it) is replaced on resume and
#                   by a fresh run; another run's step_N.tmp (or renamed step_N without DONE)
#                   makes --resume refuse, naming both ways on, as do an unreadable newer
#                   checkpoint and a step directory that is a symlink (export too); metrics
#                   lines past the resumed checkpoint are dropped and said so
#   sigint_progress SIGINT to mpirun while rank 0 prints a line per step: a complete checkpoint
#                   (rank 0 no longer blocks on the output mpirun stopped reading)
#   signal_twice    two SIGTERMs to mpirun (it returns at once): every rank is gone within 5 s and
#                   no file is written after mpirun has returned
# Each case prints the time from the start (or the fault) to the end of the job.
# Usage: faults.sh UPIPE MPIRUN... -- CASE [ARG]
set -u
upipe=$1
shift
mpirun=()
while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done
shift
case_name=$1
arg=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
fixture=$here/../fixtures/hf/llama
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL ($case_name $arg): $*"; exit 1; }
small=(--seq-len=64 --tile-tokens=64 --progress=lines --log-interval=1000)
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
within() { awk -v t="$1" -v l="$2" 'BEGIN { exit !(t < l) }'; }

# job NAME LIMIT ARGS...: runs mpirun -np 2 upipe ARGS (output in $tmp/NAME.out), sets rc and t
# (seconds); a job still running after LIMIT seconds is a hang.
job() {
  local name=$1 limit=$2
  shift 2
  local t0
  t0=$(now)
  timeout "$limit" "${mpirun[@]}" -np 2 "$upipe" "$@" > "$tmp/$name.out" 2>&1
  rc=$?
  t=$(secs "$t0" "$(now)")
  echo "$name: exit $rc after $t s"
  [ $rc -ne 124 ] || { cat "$tmp/$name.out"; fail "$name hung ($limit s)"; }
}
# once NAME TEXT: TEXT appears on exactly one line of NAME's output.
once() {
  local n
  n=$(grep -c -F -e "$2" "$tmp/$1.out")
  [ "$n" -eq 1 ] || { cat "$tmp/$1.out"; fail "'$2' printed $n times in $1, want once"; }
  grep -F -e "$2" "$tmp/$1.out"
}
# A checkpoint directory with steps 2 and 4 of a 2-rank run.
make_checkpoints() {
  job make 120 train "${small[@]}" --steps=4 --checkpoint-dir="$1" --checkpoint-interval=2
  [ $rc -eq 0 ] || { cat "$tmp/make.out"; fail "the run making checkpoints failed"; }
}
# flip FILE: one byte of FILE's first tensor flipped.
flip() {
  python3 - "$1" <<'PY'
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", bytes(b[:8]))[0]
b[8 + n + 5] ^= 0x10
open(p, "wb").write(bytes(b))
PY
}

case $case_name in
one_rank)
  phase=$arg
  rank=1
  args=(train "${small[@]}" --steps=6)
  case $phase in
  init) args+=(--model="$fixture" --init-from "$fixture") ;;
  metrics) rank=0 && args+=(--metrics-path="$tmp/m.jsonl") ;;
  checkpoint | resume)
    make_checkpoints "$tmp/ck"
    args=(train "${small[@]}" --steps=8 --checkpoint-dir="$tmp/ck" --checkpoint-interval=2
      --resume)
    ;;
  export)
    make_checkpoints "$tmp/ck"
    rank=0 && args=(export "$tmp/ck" "$tmp/hf")
    ;;
  esac
  UPIPE_INJECT_FAULT=$phase@$rank job fault 60 "${args[@]}"
  [ $rc -ne 0 ] || { cat "$tmp/fault.out"; fail "exit 0 after a fault"; }
  within "$t" 30 || fail "took $t s, want < 30 s"
  once fault "injected fault in phase '$phase' on rank $rank"
  case $phase in
  checkpoint)  # step 6's checkpoint never completed: step 4 resumes, and the run finishes
    [ -d "$tmp/ck/step_00000006" ] && fail "the failed checkpoint was completed"
    job again 120 "${args[@]}"
    [ $rc -eq 0 ] || { cat "$tmp/again.out"; fail "resume after the failed checkpoint: exit $rc"; }
    grep -q "^start: $tmp/ck/step_00000004 " "$tmp/again.out" || fail "did not resume step 4"
    [ -f "$tmp/ck/step_00000008/DONE" ] && [ ! -e "$tmp/ck/step_00000006.tmp" ] ||
      fail "no step 8, or the failed temporary left behind"
    ;;
  export) [ -e "$tmp/hf/model.safetensors" ] && fail "a failed export left model.safetensors" ;;
  esac
  ;;
metrics_dir)
  job m 60 train "${small[@]}" --steps=3 --metrics-path="$tmp/none/m.jsonl"
  [ $rc -eq 2 ] || fail "exit $rc, want 2"
  within "$t" 30 || fail "took $t s"
  once m "upipe: error: cannot create metrics file $tmp/none/m.jsonl"
  ;;
metrics_other)
  echo "notes the run did not write" > "$tmp/notes.txt"
  job fresh 60 train "${small[@]}" --steps=2 --metrics-path="$tmp/notes.txt"
  [ $rc -eq 2 ] || { cat "$tmp/fresh.out"; fail "a fresh run over an existing file: exit $rc, want 2"; }
  within "$t" 30 || fail "took $t s"
  once fresh "--metrics-path '$tmp/notes.txt' already exists (28 bytes)"
  [ "$(cat "$tmp/notes.txt")" = "notes the run did not write" ] || fail "the file was touched"
  # Every rank refuses it alike: the job ends cleanly, no MPI_Abort.
  grep -q MPI_ABORT "$tmp/fresh.out" && { cat "$tmp/fresh.out"; fail "the refusal aborted the job"; }
  # --overwrite replaces a metrics file, never a file of something else (a token file emptied
  # before the run failed on it).
  job over 60 train "${small[@]}" --steps=2 --metrics-path="$tmp/notes.txt" --overwrite
  [ $rc -eq 2 ] || { cat "$tmp/over.out"; fail "--overwrite of notes: exit $rc, want 2"; }
  once over "(--overwrite replaces only a metrics file)"
  [ "$(cat "$tmp/notes.txt")" = "notes the run did not write" ] || fail "--overwrite touched the notes"
  head -c 4096 /dev/urandom > "$tmp/tokens.bin" && cp "$tmp/tokens.bin" "$tmp/tokens.keep"
  job over 60 train "${small[@]}" --steps=2 --metrics-path="$tmp/tokens.bin" --overwrite
  [ $rc -eq 2 ] && cmp -s "$tmp/tokens.bin" "$tmp/tokens.keep" || fail "--overwrite of a token file: exit $rc"
  # A metrics file whose only line a crash tore (no newline) is a metrics file, as a resume takes it.
  printf '{"step":1,"run":"c9b9' > "$tmp/torn.jsonl"
  job torn 60 train "${small[@]}" --steps=1 --metrics-path="$tmp/torn.jsonl" --overwrite
  [ $rc -eq 0 ] || { cat "$tmp/torn.out"; fail "--overwrite of a torn metrics line: exit $rc"; }
  job m1 60 train "${small[@]}" --steps=1 --metrics-path="$tmp/own.jsonl"
  job over 60 train "${small[@]}" --steps=2 --metrics-path="$tmp/own.jsonl" --overwrite
  [ $rc -eq 0 ] || { cat "$tmp/over.out"; fail "--overwrite of a metrics file: exit $rc"; }
  [ "$(wc -l < "$tmp/own.jsonl")" -eq 2 ] || fail "--overwrite: $(cat "$tmp/own.jsonl")"
  # --resume: the run's own metrics file keeps its steps; a foreign line makes it not the run's.
  job a 60 train "${small[@]}" --steps=2 --checkpoint-dir="$tmp/ck" --metrics-path="$tmp/m.jsonl"
  [ $rc -eq 0 ] || { cat "$tmp/a.out"; fail "the first run: exit $rc"; }
  cp "$tmp/m.jsonl" "$tmp/theirs.jsonl" && echo "a line of someone else" >> "$tmp/theirs.jsonl"
  job r 60 train "${small[@]}" --steps=3 --checkpoint-dir="$tmp/ck" --resume \
    --metrics-path="$tmp/theirs.jsonl"
  [ $rc -eq 2 ] || { cat "$tmp/r.out"; fail "resume onto a foreign metrics file: exit $rc, want 2"; }
  once r "line 3 is not a step's metrics"
  grep -q "a line of someone else" "$tmp/theirs.jsonl" || fail "the foreign file was rewritten"
  job r2 60 train "${small[@]}" --steps=3 --checkpoint-dir="$tmp/ck" --resume \
    --metrics-path="$tmp/m.jsonl"
  [ $rc -eq 0 ] || { cat "$tmp/r2.out"; fail "resume with the run's metrics file: exit $rc"; }
  [ "$(python3 -c 'import json,sys; print([json.loads(l)["step"] for l in open(sys.argv[1])])' "$tmp/m.jsonl")" = "[1, 2, 3]" ] ||
    fail "metrics after resume: $(cat "$tmp/m.jsonl")"
  job both 60 train "${small[@]}" --steps=3 --checkpoint-dir="$tmp/ck" --resume --overwrite
  [ $rc -eq 2 ] || { cat "$tmp/both.out"; fail "--resume --overwrite: exit $rc, want 2"; }
  once both "--overwrite is for a fresh run"
  # A second run naming the metrics file a running one writes (another checkpoint.dir, or none)
  # is refused, --overwrite or not, and the first run's lines stay its own.
  timeout 120 "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --steps=100000 --checkpoint-dir= \
    --metrics-path="$tmp/busy.jsonl" > "$tmp/first.out" 2>&1 &
  first=$!
  for _ in $(seq 600); do [ -s "$tmp/busy.jsonl" ] && break; sleep 0.1; done
  [ -s "$tmp/busy.jsonl" ] || { cat "$tmp/first.out"; fail "the first run wrote no metrics"; }
  job second 60 train "${small[@]}" --steps=2 --checkpoint-dir= --metrics-path="$tmp/busy.jsonl" --overwrite
  [ $rc -eq 2 ] || { cat "$tmp/second.out"; fail "a second run of one metrics file: exit $rc, want 2"; }
  once second "is being written by another upipe run (pid "
  grep -q -E "another upipe run \(pid [0-9]+ \(upipe\) on " "$tmp/second.out" ||
    { cat "$tmp/second.out"; fail "the refusal does not name the holding process"; }
  grep -q -e "^start:" -e "MPI_ABORT" "$tmp/second.out" && { cat "$tmp/second.out"; fail "the second run was refused after its start"; }
  kill -TERM $first
  wait $first
  [ "$(python3 -c 'import json,sys; print(len({json.loads(l)["run"] for l in open(sys.argv[1])}))' "$tmp/busy.jsonl")" = 1 ] ||
    fail "the metrics file has lines of two runs"
  # A run that fails at its start (its data missing) leaves no metrics file it created.
  job nodata 60 train "${small[@]}" --steps=2 --checkpoint-dir= --data-kind=files --data-path="$tmp/none.bin" \
    --metrics-path="$tmp/fresh.jsonl"
  [ $rc -eq 2 ] && [ ! -e "$tmp/fresh.jsonl" ] || { cat "$tmp/nodata.out"; fail "a failed start: exit $rc, or its empty metrics file left"; }
  ;;
checkpoint_dir)
  echo "not a directory" > "$tmp/afile"
  job file 60 train "${small[@]}" --steps=30 --checkpoint-interval=20 --checkpoint-dir="$tmp/afile"
  [ $rc -eq 2 ] || { cat "$tmp/file.out"; fail "a file as checkpoint.dir: exit $rc, want 2"; }
  once file "checkpoint.dir = $tmp/afile exists and is not a directory"
  grep -q "^step " "$tmp/file.out" && fail "steps ran before the refusal"
  [ "$(cat "$tmp/afile")" = "not a directory" ] || fail "the file was touched"
  job proc 60 train "${small[@]}" --steps=3 --checkpoint-dir=/proc/upipe_ck
  [ $rc -eq 2 ] || { cat "$tmp/proc.out"; fail "an uncreatable checkpoint.dir: exit $rc, want 2"; }
  once proc "checkpoint.dir = /proc/upipe_ck: "
  # A disk without room for one checkpoint is refused at start (a full disk trained every step,
  # then lost them all at the first checkpoint). Needs a small tmpfs (root, mount allowed).
  mkdir "$tmp/small"
  if mount -t tmpfs -o size=256k tmpfs "$tmp/small" 2> /dev/null; then
    job full 60 train "${small[@]}" --steps=5 --checkpoint-dir="$tmp/small/ck"
    umount "$tmp/small"
    [ $rc -eq 2 ] || { cat "$tmp/full.out"; fail "a checkpoint.dir without room: exit $rc, want 2"; }
    once full "free, and one checkpoint of this run takes 1.36 MiB"
  else
    echo "skipped: cannot mount a tmpfs here (the room check)"
  fi
  ;;
val_uneven)
  job v 60 train "${small[@]}" --steps=1 --cp-size=1 --val-interval=1 --val-sequences=3 --timeout=20
  [ $rc -eq 0 ] || { cat "$tmp/v.out"; fail "validation on uneven replicas: exit $rc"; }
  within "$t" 15 || fail "took $t s"
  grep -q "| val [0-9]" "$tmp/v.out" || { cat "$tmp/v.out"; fail "no validation loss logged"; }
  # A held-out file shorter than --val-sequences windows: the start says how many each validation
  # uses (8 windows of 64 in the fixture's 512 tokens).
  job w 60 train "${small[@]}" --steps=1 --data-kind=files --data-path="$fixture/tokens.npy" \
    --val-path="$fixture/tokens.npy" --val-interval=1 --val-sequences=100 --timeout=20
  [ $rc -eq 0 ] || { cat "$tmp/w.out"; fail "validation on a short file: exit $rc"; }
  grep -q "warning: --val-path .* holds 8 sequence(s) of 64 tokens, fewer than --val-sequences 100: each validation uses 8" "$tmp/w.out" ||
    { cat "$tmp/w.out"; fail "no warning for a held-out file shorter than --val-sequences"; }
  # A held-out file without --val-interval: the run says it never validates (it was silent).
  job x 60 train "${small[@]}" --steps=1 --data-kind=files --data-path="$fixture/tokens.npy" \
    --val-path="$fixture/tokens.npy" --timeout=20
  [ $rc -eq 0 ] || { cat "$tmp/x.out"; fail "--val-path without --val-interval: exit $rc"; }
  once x "is given but --val-interval 0: the run never validates"
  ;;
diverged)
  # A step whose gradient norm is not finite ends the run (exit 1) with its metrics line written,
  # the non-finite number as null; a step that predicts nothing (every document one token: an
  # end-of-text id that is every token) is refused on every rank (exit 2), not a loss of 0.
  job d 60 train "${small[@]}" --steps=5 --lr=1e30 --warmup-steps=0 --grad-clip=0 \
    --metrics-path="$tmp/d.jsonl"
  [ $rc -eq 1 ] || { cat "$tmp/d.out"; fail "a diverged run: exit $rc, want 1"; }
  once d "the loss (" && grep -q "is not finite; lower --lr" "$tmp/d.out" || fail "no divergence line"
  # Its log line has no speed (it showed INT64_MIN tok/s: llround of a NaN).
  grep -q -e "^step  *2/5 .* -- tok/s/rank | MFU -- " "$tmp/d.out" || { cat "$tmp/d.out"; fail "the diverged step's log line"; }
  python3 - "$tmp/d.jsonl" << 'PY' || fail "the diverged step's metrics line"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
print("metrics of the diverged run:", [(j["step"], j["grad_norm"]) for j in lines])
sys.exit(0 if len(lines) == 2 and lines[1]["step"] == 2 and lines[1]["grad_norm"] is None else 1)
PY
  python3 - "$tmp/eos.npy" << 'PY'
import sys
h = "{'descr': '<i4', 'fortran_order': False, 'shape': (1000,), }"
h += " " * (63 - (10 + len(h)) % 64) + "\n"  # the header padded to a multiple of 64 bytes
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode()
                              + (5).to_bytes(4, "little") * 1000)
PY
  job e 60 train "${small[@]}" --steps=2 --data-kind=files --data-path="$tmp/eos.npy" --documents=eos:5
  [ $rc -eq 2 ] || { cat "$tmp/e.out"; fail "a step that predicts nothing: exit $rc, want 2"; }
  once e "documents are one token each, so it predicts nothing"
  ;;
init_dtype)
  mkdir "$tmp/int"
  cp "$fixture/config.json" "$tmp/int/"
  python3 - "$fixture/model.safetensors" "$tmp/int/model.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
h["model.layers.1.mlp.down_proj.weight"]["dtype"] = "I32"  # the same bytes, read by rank 1
text = json.dumps(h).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PY
  job i 60 train "${small[@]}" --steps=2 --model="$tmp/int" --init-from "$tmp/int"
  [ $rc -eq 2 ] || { cat "$tmp/i.out"; fail "exit $rc, want 2"; }
  within "$t" 30 || fail "took $t s"
  once i "dtype I32 cannot be read"
  ;;
corrupt)
  make_checkpoints "$tmp/ck"
  cp -r "$tmp/ck" "$tmp/ckm" && cp -r "$tmp/ck" "$tmp/ckd"
  flip "$tmp/ck/step_00000004/rank_00001.safetensors"
  job r 60 train "${small[@]}" --steps=6 --checkpoint-dir="$tmp/ck" --resume
  [ $rc -eq 2 ] || { cat "$tmp/r.out"; fail "resume of a corrupt checkpoint: exit $rc, want 2"; }
  within "$t" 30 || fail "took $t s"
  once r "rank_00001.safetensors: tensor unit0.master elements [0, "
  job e 60 export "$tmp/ck" "$tmp/hf"
  [ $rc -eq 2 ] || { cat "$tmp/e.out"; fail "export of a corrupt checkpoint: exit $rc, want 2"; }
  once e "rank_00001.safetensors: tensor unit0.master"
  [ -e "$tmp/hf/model.safetensors" ] && fail "export of a corrupt checkpoint wrote model.safetensors"
  # A rank file gone: the same advice as a corrupt one (it said only "cannot open ...: No such
  # file or directory").
  rm "$tmp/ckm/step_00000004/rank_00001.safetensors"
  job rm 60 train "${small[@]}" --steps=6 --checkpoint-dir="$tmp/ckm" --resume
  [ $rc -eq 2 ] || { cat "$tmp/rm.out"; fail "resume without a rank file: exit $rc, want 2"; }
  once rm "checkpoint file $tmp/ckm/step_00000004/rank_00001.safetensors is missing"
  once rm "the checkpoint is incomplete; use an older one (to resume from the one before, move this one out of its directory"
  job em 60 export "$tmp/ckm" "$tmp/hfm"
  [ $rc -eq 2 ] || { cat "$tmp/em.out"; fail "export without a rank file: exit $rc, want 2"; }
  once em "rank_00001.safetensors is missing (meta.json lists a file for each of its 2 ranks): the checkpoint is incomplete; use an older one"
  # A step directory without DONE (incomplete) is skipped for the one before, and said so once,
  # before the resume line (it continued from step 2 without a word, and replaced step 4).
  rm "$tmp/ckd/step_00000004/DONE"
  job rd 120 train "${small[@]}" --steps=6 --checkpoint-dir="$tmp/ckd" --checkpoint-interval=2 --resume
  [ $rc -eq 0 ] || { cat "$tmp/rd.out"; fail "resume beside a step without DONE: exit $rc, want 0"; }
  once rd "upipe: warning: --resume skips $tmp/ckd/step_00000004: it has no DONE marker, so it is an incomplete checkpoint"
  warned=$(grep -n -m1 -F "skips $tmp/ckd/step_00000004" "$tmp/rd.out" | cut -d: -f1)
  resumed=$(grep -n -m1 -F "resume: the run recorded in $tmp/ckd/step_00000002 continues from step 2" "$tmp/rd.out" | cut -d: -f1)
  [ -n "$resumed" ] && [ "$warned" -lt "$resumed" ] || { cat "$tmp/rd.out"; fail "the warning is not before the resume line"; }
  [ -f "$tmp/ckd/step_00000004/DONE" ] || fail "the resumed run did not replace step_00000004"
  ;;
other_run)
  make_checkpoints "$tmp/ck"
  job fresh 60 train "${small[@]}" --steps=4 --checkpoint-dir="$tmp/ck"
  [ $rc -eq 2 ] || { cat "$tmp/fresh.out"; fail "a fresh run in another run's directory: exit $rc"; }
  once fresh "holds checkpoints of another run"
  [ -f "$tmp/ck/step_00000002/DONE" ] && [ -f "$tmp/ck/step_00000004/DONE" ] ||
    fail "the other run's checkpoints were touched"
  job over 120 train "${small[@]}" --steps=3 --checkpoint-dir="$tmp/ck" \
    --checkpoint-interval=3 --overwrite-checkpoints
  [ $rc -eq 0 ] || { cat "$tmp/over.out"; fail "--overwrite-checkpoints: exit $rc"; }
  [ "$(ls "$tmp/ck")" = step_00000003 ] || fail "left: $(ls "$tmp/ck" | tr '\n' ' ')"
  # ... and said so once at the start (it removed them without a word).
  once over "upipe: note: --overwrite: $tmp/ck holds 2 checkpoint entries of another run (step_00000002 ... step_00000004), removed after this run's first complete checkpoint"
  job cont 120 train "${small[@]}" --steps=5 --checkpoint-dir="$tmp/ck" --resume
  [ $rc -eq 0 ] || { cat "$tmp/cont.out"; fail "--resume of the new run: exit $rc"; }
  grep -q "^start: $tmp/ck/step_00000003 " "$tmp/cont.out" || fail "did not continue the new run"
  # Two jobs on one directory at once: the second, fresh or resuming the same run (a requeued job
  # whose old copy still runs), is refused naming the holder (each removed the other's files).
  "${mpirun[@]}" -np 2 "$upipe" train "${small[@]}" --steps=1000000 --checkpoint-dir="$tmp/ck" \
    --resume --checkpoint-interval=1000000 > "$tmp/hold.out" 2>&1 &
  holder=$!
  for _ in $(seq 100); do grep -q "^start:" "$tmp/hold.out" && break; sleep 0.2; done
  job twice 60 train --checkpoint-dir="$tmp/ck" --resume --steps=2000000
  [ $rc -eq 2 ] || { cat "$tmp/twice.out"; fail "a second --resume of a running job: exit $rc, want 2"; }
  once twice "is in use by another upipe job (pid "
  job both 60 train "${small[@]}" --steps=4 --checkpoint-dir="$tmp/ck" --overwrite
  [ $rc -eq 2 ] || { cat "$tmp/both.out"; fail "--overwrite of a running job's directory: exit $rc, want 2"; }
  once both "is in use by another upipe job"
  kill -USR1 $holder
  wait $holder || { cat "$tmp/hold.out"; fail "the holding job did not stop cleanly"; }
  # Its lock ended with it: the directory resumes.
  newest=$(ls "$tmp/ck" | grep -v tmp | sort | tail -1)
  job after 120 train --checkpoint-dir="$tmp/ck" --resume --steps=$((10#${newest#step_} + 1))
  [ $rc -eq 0 ] || { cat "$tmp/after.out"; fail "resume after the holder ended: exit $rc"; }
  ;;
other_model)
  make_checkpoints "$tmp/ck"
  mkdir "$tmp/m2"
  # tiny with 2 heads of 32 instead of 4 of 16: every tensor has the same element count.
  cat > "$tmp/m2/config.json" <<'EOF'
{"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
 "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256,
 "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
 "tie_word_embeddings": false}
EOF
  # Another model is refused by the checkpoint's own check before loading a byte (a folder is
  # where the model lies: the same model elsewhere resumes), with --accept-changes too.
  job o 60 train "${small[@]}" --steps=6 --checkpoint-dir="$tmp/ck" --resume \
    --model="$tmp/m2" --method=ulysses
  [ $rc -eq 2 ] || { cat "$tmp/o.out"; fail "resume with another model: exit $rc, want 2"; }
  once o "was written for another model: field 'head_dim': the checkpoint has 16"
  job a 60 train "${small[@]}" --steps=6 --checkpoint-dir="$tmp/ck" --resume \
    --model="$tmp/m2" --method=ulysses --accept-changes
  [ $rc -eq 2 ] || { cat "$tmp/a.out"; fail "resume with another architecture: exit $rc, want 2"; }
  once a "was written for another model: field 'head_dim': the checkpoint has 16"
  ;;
export_force)
  make_checkpoints "$tmp/ck"
  "${mpirun[@]}" -np 1 "$upipe" export "$tmp/ck/step_00000004" "$tmp/new" --dtype fp32 > /dev/null ||
    fail "export"
  # A folder holding step 2's weights as a sharded checkpoint, which a reader prefers to
  # model.safetensors.
  "${mpirun[@]}" -np 1 "$upipe" export "$tmp/ck/step_00000002" "$tmp/out" --dtype fp32 > /dev/null ||
    fail "export"
  mv "$tmp/out/model.safetensors" "$tmp/out/model-00001-of-00001.safetensors"
  python3 - "$tmp/out" <<'PY'
import json, struct, sys
d = sys.argv[1]
raw = open(d + "/model-00001-of-00001.safetensors", "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
json.dump({"weight_map": {k: "model-00001-of-00001.safetensors" for k in h if k != "__metadata__"}},
          open(d + "/model.safetensors.index.json", "w"))
PY
  echo tokenizer > "$tmp/out/tokenizer.json"
  job x 60 export "$tmp/ck/step_00000004" "$tmp/out" --dtype fp32
  [ $rc -eq 2 ] || { cat "$tmp/x.out"; fail "export into a non-empty directory: exit $rc, want 2"; }
  once x "is not empty"
  job f 60 export "$tmp/ck/step_00000004" "$tmp/out" --dtype fp32 --force
  [ $rc -eq 0 ] || { cat "$tmp/f.out"; fail "export --force: exit $rc"; }
  [ -e "$tmp/out/model.safetensors.index.json" ] && fail "the stale index is still there"
  [ -f "$tmp/out/tokenizer.json" ] && [ "$(cat "$tmp/out/tokenizer.json")" != tokenizer ] ||
    fail "export --force left the old tokenizer.json (or wrote none)"
  loss() { "${mpirun[@]}" -np 2 "$upipe" eval --model "$1" --seq-len 64 --method ulysses --json |
    python3 -c "import json,sys; print(json.load(sys.stdin)['loss'])"; }
  a=$(loss "$tmp/new") b=$(loss "$tmp/out")
  echo "eval loss: fresh export $a, forced export $b"
  [ "$a" = "$b" ] || fail "the forced export does not give step 4's weights ($b, want $a)"
  # Files that are not the model's stay; a damaged checkpoint, forced, changes nothing in the
  # folder; a model file's name held by a directory is refused before anything is removed.
  echo adapter > "$tmp/out/adapter_model.safetensors"
  echo notes > "$tmp/out/notes.txt"
  cp -r "$tmp/ck" "$tmp/bad"
  flip "$tmp/bad/step_00000004/rank_00001.safetensors"
  (cd "$tmp/out" && find . -type f -exec sha256sum {} + | sort) > "$tmp/before"
  job d 60 export "$tmp/bad/step_00000004" "$tmp/out" --force
  [ $rc -eq 2 ] || { cat "$tmp/d.out"; fail "export --force of a damaged checkpoint: exit $rc"; }
  once d "do not match their checksum"
  (cd "$tmp/out" && find . -type f -exec sha256sum {} + | sort) > "$tmp/after"
  cmp -s "$tmp/before" "$tmp/after" || fail "a failed export --force changed the folder: $(diff "$tmp/before" "$tmp/after")"
  [ "$(ls -A "$tmp/out" | grep -c upipe-export)" -eq 0 ] || fail "staging left in the folder"
  mkdir "$tmp/out/pytorch_model.bin"
  job g 60 export "$tmp/ck/step_00000004" "$tmp/out" --force
  [ $rc -eq 2 ] || { cat "$tmp/g.out"; fail "a directory named pytorch_model.bin: exit $rc, want 2"; }
  once g "is not a regular file"
  (cd "$tmp/out" && find . -type f -exec sha256sum {} + | sort) > "$tmp/after"
  cmp -s "$tmp/before" "$tmp/after" || fail "a refused export --force changed the folder"
  rmdir "$tmp/out/pytorch_model.bin"
  job h 60 export "$tmp/ck/step_00000004" "$tmp/out" --force
  [ $rc -eq 0 ] || { cat "$tmp/h.out"; fail "export --force: exit $rc"; }
  [ "$(cat "$tmp/out/adapter_model.safetensors") $(cat "$tmp/out/notes.txt")" = "adapter notes" ] ||
    fail "export --force touched files that are not the model's"
  # The checkpoint itself, and its checkpoint directory, are never an export's folder.
  (cd "$tmp/ck" && find . -type f -exec sha256sum {} + | sort) > "$tmp/ck_before"
  for o in "$tmp/ck/step_00000004" "$tmp/ck/step_00000004/hf" "$tmp/ck" "$tmp/ck/"; do
    job s 60 export "$tmp/ck/step_00000004/" "$o" --force
    [ $rc -eq 2 ] || { cat "$tmp/s.out"; fail "export into $o: exit $rc, want 2"; }
    once s "choose another directory"
  done
  # Nor a folder inside a step directory of it (a step to come, one being written) or inside any
  # other checkpoint: a run's pruning removed the exported model with that checkpoint.
  mkdir -p "$tmp/other" && cp -r "$tmp/ck/step_00000004" "$tmp/other/"
  for o in "$tmp/ck/step_00000099/hf" "$tmp/ck/step_00000099.tmp/hf" "$tmp/other/step_00000004/hf"; do
    job s 60 export "$tmp/ck/step_00000004/" "$o"
    [ $rc -eq 2 ] || { cat "$tmp/s.out"; fail "export into $o: exit $rc, want 2"; }
    once s "a checkpoint's directory, which a run prunes and replaces"
    [ ! -e "$o" ] || fail "a refused export made $o"
  done
  (cd "$tmp/ck" && find . -type f -exec sha256sum {} + | sort) > "$tmp/ck_after"
  cmp -s "$tmp/ck_before" "$tmp/ck_after" || fail "an export changed the checkpoint"
  # An interrupted export's staging directory does not make a folder non-empty and goes with the
  # next export into it.
  mkdir -p "$tmp/left/.upipe-export.AbC123" && echo partial > "$tmp/left/.upipe-export.AbC123/model.safetensors"
  job l 60 export "$tmp/ck/step_00000004" "$tmp/left"
  [ $rc -eq 0 ] || { cat "$tmp/l.out"; fail "export into a folder holding only a leftover: exit $rc"; }
  [ -z "$(ls -A "$tmp/left" | grep upipe-export)" ] || fail "the leftover staging directory stayed"
  job e 60 export "$tmp/ck/step_00000004" ""
  [ $rc -eq 2 ] || { cat "$tmp/e.out"; fail "export to \"\": exit $rc, want 2"; }
  once e "the output directory is empty"
  # A folder that cannot be made (a symlink loop on its way) is bad input named as such, not a
  # "fatal: filesystem error" with exit 1.
  ln -s loop "$tmp/loop"
  job y 60 export "$tmp/ck/step_00000004" "$tmp/loop/hf"
  [ $rc -eq 2 ] || { cat "$tmp/y.out"; fail "export through a symlink loop: exit $rc, want 2"; }
  once y "export: cannot create the directory $tmp/loop/hf: Too many levels of symbolic links"
  ;;
data_differs)
  # Two hosts whose copies of the data differ: the same --data-path names other files on each
  # rank (each started in its own working directory: the path is relative), fresh or resumed.
  mkdir -p "$tmp/A" "$tmp/B"
  python3 -c 'import sys; open(sys.argv[1], "wb").write(bytes(range(256)) * 20); open(sys.argv[2], "wb").write(bytes(reversed(range(256))) * 20)' \
    "$tmp/A/d.txt" "$tmp/B/d.txt"
  "$upipe" tokenize "$tmp/A/d.txt" "$tmp/A/d.bin" > /dev/null && "$upipe" tokenize "$tmp/B/d.txt" "$tmp/B/d.bin" > /dev/null ||
    fail "tokenize"
  args=(train "${small[@]}" --data-kind=files --data-path=d.bin --steps=2 --checkpoint-dir= --metrics-path=)
  t0=$(now)
  out=$(timeout 120 "${mpirun[@]}" -np 1 -wdir "$tmp/A" "$upipe" "${args[@]}" : -np 1 -wdir "$tmp/B" "$upipe" "${args[@]}" 2>&1); rc=$?
  echo "$out" > "$tmp/differs.out"
  echo "differs: exit $rc after $(secs "$t0" "$(now)") s"
  [ $rc -eq 2 ] || { echo "$out"; fail "ranks reading other data: exit $rc, want 2"; }
  once differs "rank 1 (host $(hostname)) read other training data than rank 0"
  # The same bytes in both places: the same data, the run trains.
  cp "$tmp/A/d.bin" "$tmp/B/d.bin"
  timeout 120 "${mpirun[@]}" -np 1 -wdir "$tmp/A" "$upipe" "${args[@]}" : -np 1 -wdir "$tmp/B" "$upipe" "${args[@]}" > "$tmp/same.out" 2>&1 ||
    { cat "$tmp/same.out"; fail "ranks reading the same data in two places failed"; }
  # two: the command on both ranks, each in its own directory; its output in $tmp/$1.out, rc.
  two() {
    local name=$1
    shift
    timeout 120 "${mpirun[@]}" -np 1 -wdir "$tmp/A" "$upipe" "$@" : -np 1 -wdir "$tmp/B" "$upipe" "$@" > "$tmp/$name.out" 2>&1; rc=$?
  }
  # The held-out data differs (the training data is the same): refused as well.
  "$upipe" tokenize "$tmp/A/d.txt" "$tmp/A/v.bin" > /dev/null && "$upipe" tokenize "$tmp/B/d.txt" "$tmp/B/v.bin" > /dev/null ||
    fail "tokenize"
  two val "${args[@]}" --val-path=v.bin --val-interval=1
  [ $rc -eq 2 ] || { cat "$tmp/val.out"; fail "ranks reading other held-out data: exit $rc, want 2"; }
  once val "rank 1 (host $(hostname)) read other validation data than rank 0"
  # A checkpoint.dir each host sees as its own directory: refused at the start (before, the first
  # checkpoint failed steps later, or a leftover there let the run mark one complete without
  # half its files), fresh or resumed.
  two fresh "${args[@]}" --checkpoint-dir=ck --checkpoint-interval=1
  [ $rc -eq 2 ] || { cat "$tmp/fresh.out"; fail "a checkpoint.dir each rank sees apart: exit $rc, want 2"; }
  once fresh "rank 1 (host $(hostname)) does not see the file .upipe-view-"
  once fresh "wrote in --checkpoint-dir $tmp/A/ck (rank 1 reads the path as $tmp/B/ck)"
  grep -q "^step 1" "$tmp/fresh.out" && fail "a step ran before the checkpoint.dir was refused"
  [ -z "$(ls -A "$tmp/A/ck" | grep -v '^.upipe-lock$')" ] || fail "the probe stayed: $(ls -A "$tmp/A/ck")"
  # Resumed over copies: host B's older copy would have loaded step 1 beside A's step 2.
  "${mpirun[@]}" -np 2 -wdir "$tmp/A" "$upipe" "${args[@]}" --checkpoint-dir=ck --checkpoint-interval=1 > "$tmp/ck.out" 2>&1 ||
    { cat "$tmp/ck.out"; fail "the run to resume"; }
  cp -a "$tmp/A/ck" "$tmp/B/ck" && rm -r "$tmp/B/ck/step_00000002"
  two resumed "${args[@]}" --checkpoint-dir=ck --resume --steps=3
  [ $rc -eq 2 ] || { cat "$tmp/resumed.out"; fail "resume over copies of checkpoint.dir: exit $rc, want 2"; }
  once resumed "rank 1 (host $(hostname)) does not see the file .upipe-view-"
  # One directory whose newest step one rank cannot see (a mount over it in that rank's own mount
  # namespace, as a file system showing hosts other listings): each rank would load its own.
  mkdir "$tmp/empty"
  if unshare -m --propagation private true 2> /dev/null; then
    ck=$tmp/A/ck
    out=$(timeout 120 "${mpirun[@]}" -np 1 "$upipe" "${args[@]}" --data-path="$tmp/A/d.bin" --checkpoint-dir="$ck" --resume --steps=3 : \
      -np 1 unshare -m --propagation private sh -c 'mount --bind "$1" "$2/step_00000002" && shift 2 && exec "$@"' sh "$tmp/empty" "$ck" \
      "$upipe" "${args[@]}" --data-path="$tmp/A/d.bin" --checkpoint-dir="$ck" --resume --steps=3 2>&1); rc=$?
    echo "$out" > "$tmp/hidden.out"
    [ $rc -eq 2 ] || { echo "$out"; fail "ranks seeing other newest checkpoints: exit $rc, want 2"; }
    once hidden "rank 1 (host $(hostname)) finds step_00000001 the newest complete checkpoint in --checkpoint-dir $ck, rank 0 (host $(hostname)) finds step_00000002"
    # A directory whose new files one rank keeps to itself (an overlay over it in that rank's mount
    # namespace: it reads what rank 0 writes, the start's probe passes, but rank 0 never sees
    # rank 1's file): rank 0 refuses to mark the checkpoint complete.
    ck=$tmp/ov/ck
    mkdir -p "$ck" "$tmp/ov/upper" "$tmp/ov/work"
    if unshare -m --propagation private sh -c 'mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$1"' sh "$ck" "$tmp/ov/upper" "$tmp/ov/work" 2> /dev/null; then
      out=$(timeout 120 "${mpirun[@]}" -np 1 "$upipe" "${args[@]}" --data-path="$tmp/A/d.bin" --checkpoint-dir="$ck" : \
        -np 1 unshare -m --propagation private sh -c 'mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$1" && shift 3 && exec "$@"' sh "$ck" "$tmp/ov/upper" "$tmp/ov/work" \
        "$upipe" "${args[@]}" --data-path="$tmp/A/d.bin" --checkpoint-dir="$ck" 2>&1); rc=$?
      echo "$out" > "$tmp/apart.out"
      [ $rc -eq 2 ] || { echo "$out"; fail "a rank file rank 0 does not see: exit $rc, want 2"; }
      once apart "checkpoint $ck/step_00000002.tmp: rank 1 wrote its file rank_00001.safetensors ("
      once apart "which rank 0 does not find there: every host must see one --checkpoint-dir (a shared file system); the checkpoint is not marked complete"
      [ -z "$(ls "$ck" | grep -v '\.tmp$')" ] || fail "a checkpoint without rank 1's file was marked complete: $(ls "$ck")"
    else
      echo "no overlay mounts here: the case of a rank file rank 0 does not see is not run"
    fi
  else
    echo "no mount namespaces here (unshare -m): the cases of one directory listed apart are not run"
  fi
  ;;
tokenize_self)
  printf 'keep this text' > "$tmp/a.txt"
  out=$("$upipe" tokenize "$tmp/a.txt" "$tmp/a.txt" 2>&1); rc=$?
  echo "$out"
  [ $rc -eq 2 ] || fail "exit $rc, want 2"
  [ "$(cat "$tmp/a.txt")" = "keep this text" ] || fail "the input was changed"
  ln -s "$tmp/a.txt" "$tmp/link.bin"
  "$upipe" tokenize "$tmp/a.txt" "$tmp/link.bin" > /dev/null 2>&1 && fail "wrote through a symlink"
  [ "$(cat "$tmp/a.txt")" = "keep this text" ] || fail "the input was changed through the symlink"
  # An existing output is someone's file (a corpus another tool wrote, a text named .bin): replaced
  # only with --force, in both modes.
  printf 'my notes' > "$tmp/notes.bin"
  out=$("$upipe" tokenize "$tmp/a.txt" "$tmp/notes.bin" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "notes.bin already exists; tokenize does not replace" ||
    fail "tokenize over an existing file: exit $rc: $out"
  [ "$(cat "$tmp/notes.bin")" = "my notes" ] || fail "tokenize replaced an existing file"
  "$upipe" tokenize "$tmp/a.txt" "$tmp/notes.bin" --force > /dev/null || fail "tokenize --force"
  [ "$(stat -c %s "$tmp/notes.bin")" -eq $((1024 + 28)) ] || fail "--force did not write the tokens"
  mkdir "$tmp/docs" && cp "$tmp/a.txt" "$tmp/docs/" && printf 'corpus' > "$tmp/corpus.idx"
  out=$("$upipe" tokenize "$tmp/docs" "$tmp/corpus" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "corpus.idx already exists" || fail "tokenize DIR over an existing .idx: exit $rc: $out"
  [ "$(cat "$tmp/corpus.idx")" = "corpus" ] && [ ! -e "$tmp/corpus.bin" ] || fail "tokenize DIR changed files when refused"
  ;;
sizes)
  mkdir "$tmp/deep"
  python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['num_hidden_layers']=2**30; json.dump(c, open(sys.argv[2],'w'))" \
    "$fixture/config.json" "$tmp/deep/config.json"
  job l 60 train "${small[@]}" --model="$tmp/deep" --steps=1
  [ $rc -eq 2 ] || { cat "$tmp/l.out"; fail "2^30 layers: exit $rc, want 2"; }
  once l "field 'num_hidden_layers' must be in [1, 65536]"
  job s 60 train --seq-len=1099511627776 --steps=1 --progress=lines
  [ $rc -eq 3 ] || { cat "$tmp/s.out"; fail "train.seq_len 2^40: exit $rc, want 3"; }
  once s "out of memory in device arena: this configuration needs at least"
  job b 60 train --seq-len=1099511627776 --steps=1 --device-memory=1048576T
  [ $rc -eq 3 ] || { cat "$tmp/b.out"; fail "train.seq_len 2^40 in 1 EiB: exit $rc, want 3"; }
  once b "within the budget, but this machine has"
  job v 60 eval --model tiny --seq-len 1099511627776
  [ $rc -eq 3 ] || { cat "$tmp/v.out"; fail "eval --seq-len 2^40: exit $rc, want 3"; }
  once v "out of memory in device arena"
  # The ranks of one host share its memory: two ranks each planned at 3/4 of it (S found by the
  # planner for this machine) are refused before anything loads (each passed its own process's
  # check, and the kernel killed one mid-step).
  mem=$(awk '/^MemTotal:/ { printf "%.0f", $2 * 1024 }' /proc/meminfo)
  s=$("$upipe" plan --ranks 2 --device-memory "$((mem / 4 * 3))B" --reserve 0 --method upipe \
    --max-seq-len --json | python3 -c "import json,sys; print(json.load(sys.stdin)['methods'][0]['seq_len'])") ||
    fail "planning 3/4 of the machine's memory a rank"
  job h 120 train --seq-len="$s" --steps=1 --progress=lines
  [ $rc -eq 3 ] || { cat "$tmp/h.out"; fail "two ranks of 3/4 of the memory each: exit $rc, want 3"; }
  once h "out of memory on host $(hostname), found before anything is loaded"
  grep -q "^step" "$tmp/h.out" && fail "a step ran"
  ;;
leftover_tmp)
  # A checkpoint write that ended before it marked its directory (a full disk, a crash) leaves an
  # empty step_N.tmp: nobody's data, so the resumed run replaces it (it refused at step N forever).
  make_checkpoints "$tmp/ck"
  mkdir "$tmp/ck/step_00000006.tmp" && touch "$tmp/ck/step_00000006.tmp/run_id.tmp.AbCdEf"
  job r 120 train --checkpoint-dir="$tmp/ck" --resume --steps=6 --checkpoint-interval=2
  [ $rc -eq 0 ] && [ -f "$tmp/ck/step_00000006/DONE" ] || { cat "$tmp/r.out"; fail "resume over an unmarked leftover: exit $rc"; }
  # Another run's incomplete checkpoint beside this run's (a run started over it with
  # --overwrite that ended before its first checkpoint): --resume refuses to continue the older
  # run silently and says both ways on.
  mkdir "$tmp/ck/step_00000008.tmp" && echo 0123456789abcdef0123456789abcdef > "$tmp/ck/step_00000008.tmp/run_id"
  job o 120 train --checkpoint-dir="$tmp/ck" --resume --steps=10
  [ $rc -eq 2 ] || { cat "$tmp/o.out"; fail "resume beside another run's incomplete checkpoint: exit $rc, want 2"; }
  once o "an incomplete checkpoint of another run (run 0123456789abcdef0123456789abcdef)"
  # Resumed from an earlier checkpoint than the metrics file reached: the lines past it are
  # dropped (the steps run again) and the start says so.
  job m 120 train "${small[@]}" --steps=4 --checkpoint-dir="$tmp/cm" --checkpoint-interval=2 --metrics-path="$tmp/m.jsonl"
  rm -r "$tmp/cm/step_00000004"
  job n 120 train --checkpoint-dir="$tmp/cm" --resume
  [ $rc -eq 0 ] || { cat "$tmp/n.out"; fail "resume: exit $rc"; }
  once n "held steps up to 4; its 2 line(s) after step 2 are dropped"
  [ "$(wc -l < "$tmp/m.jsonl")" -eq 4 ] || fail "metrics lines: $(wc -l < "$tmp/m.jsonl"), want 4"
  # A directory named like a checkpoint that no run wrote, holding a user's file: a fresh run,
  # --overwrite or not, neither replaces nor removes it (--overwrite deleted it).
  mkdir -p "$tmp/cu/step_5" && echo notes > "$tmp/cu/step_5/important.txt"
  job u 60 train "${small[@]}" --steps=2 --checkpoint-dir="$tmp/cu" --overwrite
  [ $rc -eq 2 ] || { cat "$tmp/u.out"; fail "--overwrite over a directory that is not a checkpoint: exit $rc, want 2"; }
  once u "$tmp/cu/step_5 is not a checkpoint (no run id, no meta.json) and holds files"
  [ "$(cat "$tmp/cu/step_5/important.txt")" = notes ] || fail "the user's file in step_5 is gone"
  # ... and a resumed run says so at its start, not when it reaches that step.
  mkdir -p "$tmp/ck/step_00000007" && echo notes > "$tmp/ck/step_00000007/important.txt"
  job ru 60 train --checkpoint-dir="$tmp/ck" --resume --steps=10
  [ $rc -eq 2 ] || { cat "$tmp/ru.out"; fail "--resume beside a directory that is not a checkpoint: exit $rc, want 2"; }
  once ru "$tmp/ck/step_00000007 is not a checkpoint"
  grep -q "^step " "$tmp/ru.out" && fail "the resumed run trained before refusing"
  rm -r "$tmp/ck/step_00000007"
  # Another run's renamed checkpoint without DONE (as an older build left it when the disk filled
  # at DONE) is an incomplete checkpoint of another run too, not something to continue past.
  cp -r "$tmp/ck/step_00000006" "$tmp/ck/step_00000007" && rm "$tmp/ck/step_00000007/DONE"
  python3 -c 'import json,sys; p=sys.argv[1]; j=json.load(open(p)); j["run_id"]="f"*32; json.dump(j, open(p,"w"))' \
    "$tmp/ck/step_00000007/meta.json"
  job rn 60 train --checkpoint-dir="$tmp/ck" --resume --steps=10
  [ $rc -eq 2 ] || { cat "$tmp/rn.out"; fail "resume beside another run's renamed incomplete checkpoint: exit $rc, want 2"; }
  once rn "step_00000007, an incomplete checkpoint of another run (run ffffffffffffffffffffffffffffffff)"
  # A newer checkpoint that cannot be read (meta.json gone) at a step the run writes (every 2nd):
  # said at the start, not after the steps up to it were trained.
  rm "$tmp/ck/step_00000007/meta.json" && mv "$tmp/ck/step_00000007" "$tmp/ck/step_00000008"
  job rd 60 train --checkpoint-dir="$tmp/ck" --resume --steps=10
  [ $rc -eq 2 ] || { cat "$tmp/rd.out"; fail "resume beside an unreadable newer checkpoint: exit $rc, want 2"; }
  once rd "step_00000008, a checkpoint that cannot be read (its meta.json is missing or damaged)"
  grep -q "^step " "$tmp/rd.out" && fail "the resumed run trained before refusing"
  rm -r "$tmp/ck/step_00000008"
  # A step directory that is a symbolic link: refused by resume and export, never skipped for an
  # older checkpoint.
  cp -r "$tmp/ck/step_00000006" "$tmp/elsewhere" && ln -s "$tmp/elsewhere" "$tmp/ck/step_00000007"
  job rl 60 train --checkpoint-dir="$tmp/ck" --resume --steps=10
  [ $rc -eq 2 ] || { cat "$tmp/rl.out"; fail "resume beside a linked checkpoint: exit $rc, want 2"; }
  once rl "step_00000007 is a symbolic link (to $tmp/elsewhere)"
  out=$("$upipe" export "$tmp/ck" "$tmp/ex" 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "step_00000007 is a symbolic link" || { echo "$out"; fail "export beside a linked checkpoint: exit $rc, want 2"; }
  rm "$tmp/ck/step_00000007"
  # A fresh run in a directory holding only an empty, unmarked temporary (a write killed before it
  # marked it): nobody's data, the run starts.
  mkdir -p "$tmp/ce/step_00000001.tmp"
  job ce 60 train "${small[@]}" --steps=1 --checkpoint-dir="$tmp/ce"
  [ $rc -eq 0 ] && [ -f "$tmp/ce/step_00000001/DONE" ] || { cat "$tmp/ce.out"; fail "fresh run over an empty unmarked temporary: exit $rc"; }
  # A checkpoint renamed to a later step is refused, not resumed as the newest (each later resume
  # went back to it, dropping the steps after).
  mv "$tmp/ck/step_00000006" "$tmp/ck/step_00000009"
  rm -r "$tmp/ck/step_00000008.tmp"
  job s 60 train --checkpoint-dir="$tmp/ck" --resume --steps=10
  [ $rc -eq 2 ] || { cat "$tmp/s.out"; fail "resume of a renamed checkpoint: exit $rc, want 2"; }
  once s "holds step 6 (meta.json), not the step its name says (9)"
  mv "$tmp/ck/step_00000009" "$tmp/ck/step_00000006"
  # meta.json's integers are never narrowed: a world of 2^32 + 2 (DONE's checksum made to match,
  # as anyone can) is refused, not read as 2.
  python3 - "$tmp/ck/step_00000006" <<'PY'
import ctypes, json, os, sys
xxh = ctypes.CDLL("libxxhash.so.0")  # the library upipe links
xxh.XXH3_64bits.restype = ctypes.c_uint64
xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
d = sys.argv[1]
m = json.load(open(os.path.join(d, "meta.json")))
m["world"] = 2**32 + 2
text = (json.dumps(m, indent=1) + "\n").encode()
open(os.path.join(d, "meta.json"), "wb").write(text)
open(os.path.join(d, "DONE"), "w").write("step 6\nmeta.json xxh3-64 %016x\n" % xxh.XXH3_64bits(text, len(text)))
PY
  if [ $? -eq 0 ]; then
    job w 60 train --checkpoint-dir="$tmp/ck" --resume --steps=10
    [ $rc -eq 2 ] || { cat "$tmp/w.out"; fail "resume of a world of 2^32 + 2: exit $rc, want 2"; }
    once w "world = 4294967298 is not an integer in [1, 2147483647]"
  else
    fail "could not forge meta.json (python3 with libxxhash.so.0)"
  fi
  ;;
sigint_progress)
  # Ctrl-C to a plain mpirun while rank 0 prints a line every step: mpirun stops reading the
  # ranks' output (a pty) at once; rank 0 must not block on it, so every rank finishes its step
  # and writes a complete checkpoint before mpirun's SIGKILL (5 s here, for a loaded machine).
  "${mpirun[@]}" --mca odls_base_sigkill_timeout 5 -np 2 "$upipe" train "${small[@]}" \
    --log-interval=1 --steps=1000000 --checkpoint-dir="$tmp/ck" --checkpoint-interval=1000000 \
    --metrics-path="$tmp/m.jsonl" > "$tmp/p.out" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [ -f "$tmp/m.jsonl" ] && [ "$(wc -l < "$tmp/m.jsonl")" -ge 200 ] && break; sleep 0.1; done
  t0=$(now)
  kill -INT $pid
  wait $pid
  echo "mpirun exited $? $(secs "$t0" "$(now)") s after SIGINT"
  ls "$tmp/ck"/step_*/DONE > /dev/null 2>&1 || { tail -3 "$tmp/p.out"; fail "no complete checkpoint after SIGINT"; }
  echo "checkpoint: $(ls "$tmp/ck")"
  ;;
signal_twice)
  "${mpirun[@]}" -np 2 "$upipe" train --seq-len=4096 --tile-tokens=1024 \
    --progress=lines --steps=100000 --metrics-path="$tmp/m.jsonl" \
    --checkpoint-dir="$tmp/ck" --checkpoint-interval=1 --checkpoint-keep=1000 > "$tmp/s.out" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [ -f "$tmp/m.jsonl" ] && [ "$(wc -l < "$tmp/m.jsonl")" -ge 2 ] && break; sleep 0.1; done
  ranks=$(pgrep -P $pid -d ' ')
  [ -n "$ranks" ] || fail "no rank processes"
  t0=$(now)
  kill -TERM $pid
  sleep 0.3
  kill -TERM $pid
  wait $pid
  rc=$?
  touch "$tmp/returned"
  echo "mpirun exited $rc $(secs "$t0" "$(now)") s after the first SIGTERM"
  # mpirun's exit sends each rank the SIGKILL it asked for (PR_SET_PDEATHSIG, core/launcher.cpp):
  # a rank runs no more of its own code from then on, but the kernel may still be tearing down its
  # memory for a moment. So each must be gone within 5 s, and nothing written after the return.
  alive=$ranks
  for _ in $(seq 50); do
    still=""
    for p in $alive; do
      case $(ps -o stat= -p "$p" 2>/dev/null) in "" | Z*) ;; *) still="$still $p" ;; esac
    done
    alive=$still
    [ -z "$alive" ] && break
    sleep 0.1
  done
  echo "ranks gone $(secs "$t0" "$(now)") s after the first SIGTERM"
  [ -z "$alive" ] || { kill -KILL $alive; fail "rank processes$alive alive 5 s after mpirun returned"; }
  sleep 2
  late=$(find "$tmp/ck" "$tmp/m.jsonl" -newer "$tmp/returned" | head -3)
  [ -z "$late" ] || fail "written after mpirun returned: $late"
  ;;
*) fail "unknown case" ;;
esac
echo "PASS $case_name $arg"
