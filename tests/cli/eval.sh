#!/usr/bin/env bash
# `upipe eval` on the committed transformers fixtures (tests/fixtures/hf), as typed on 2 ranks:
#   fixture_loss      the llama fixture's loss is transformers' fp64 6.1841632 (to 7 digits)
#   fixture_loss_bin  the same tokens as an llm.c .bin give the same loss
#   tokenize_then_eval `upipe tokenize` (one process) writes a .bin that eval reads
#   loss_only         --loss-only (the forward alone) gives the same loss; --windows the mean
#                     loss and perplexity over every S-token window (the mean of the windows'
#                     losses, each window evaluated as a file of its own); a training checkpoint as
#                     --model is refused with the export command
#   save_grads_FIX    --save-grads: every tensor of the fixture's fp64 gradients, same names and
#                     shapes, within the fp32 rule, and the norms of --json (check_grads.py)
#   packed_FIX        --doc-lens doc_lens.npy (ring and upipe): the packed reference's loss
#                     (transformers on each document alone) and its gradients (check_grads.py
#                     packed); the same lengths typed as a list; lengths that do not sum to S
#                     refused naming --doc-lens
#   windows_packed    --windows --documents index --max-windows 5 over `upipe tokenize DIR`'s
#                     dataset: the loss training's validation of 5 sequences logged for it (2 ranks,
#                     fp32 export), bit for bit; without --max-windows all 7 windows; its .bin alone
#                     names the way to read it; --documents and --max-windows need --windows
# Usage: eval.sh UPIPE MPIRUN [MPIRUN ARGS...] -- CASE
set -u
upipe=$1
shift
mpirun=()
while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done
case_name=$2
here=$(cd "$(dirname "$0")" && pwd)
fix="$here/../fixtures/hf"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $case_name: $*"; exit 1; }

# eval_expect TEXT ARGS...: `upipe eval ARGS` on 2 ranks succeeds and prints TEXT.
eval_expect() {
  local text=$1 out
  shift
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" eval "$@" 2>&1) || { echo "$out"; fail "eval failed"; }
  echo "$out"
  printf '%s\n' "$out" | grep -q -F -e "$text" || fail "no '$text' in the output"
}

case $case_name in
fixture_loss)
  eval_expect "loss 6.184163" --model "$fix/llama" --tokens "$fix/llama/tokens.npy" --method upipe ;;
fixture_loss_bin)
  /usr/bin/python3 "$here/npy_to_bin.py" "$fix/llama/tokens.npy" "$tmp/t.bin" || fail "npy_to_bin"
  eval_expect "loss 6.184163" --model "$fix/llama" --tokens "$tmp/t.bin" --method upipe ;;
tokenize_then_eval)
  printf 'upipe tokenize: one token per byte. %.0s' $(seq 20) > "$tmp/in.txt"
  "$upipe" tokenize "$tmp/in.txt" "$tmp/in.bin" || fail "tokenize failed"
  eval_expect "512 tokens" --model tiny --tokens "$tmp/in.bin" --seq-len 512 --method upipe ;;
loss_only)
  eval_expect "loss 6.184163" --model "$fix/llama" --tokens "$fix/llama/tokens.npy" --method upipe --loss-only
  eval_expect "4 window(s) of 128 tokens" --model "$fix/llama" --tokens "$fix/llama/tokens.npy" \
    --method upipe --windows --seq-len 128
  eval_expect "perplexity" --model "$fix/llama" --tokens "$fix/llama/tokens.npy" --method upipe \
    --windows --seq-len 128
  # The windows' loss is the mean of the four windows' losses, each evaluated as a file of its own.
  /usr/bin/python3 - "$here" "$fix/llama/tokens.npy" "$tmp" <<'PY' || fail "cutting the windows"
import struct, sys
sys.path.insert(0, sys.argv[1])
from npy_to_bin import read_npy
ids = read_npy(sys.argv[2])
for w in range(4):
    part = ids[128 * w:128 * (w + 1)]
    with open(f"{sys.argv[3]}/w{w}.bin", "wb") as f:
        f.write(struct.pack("<256i", *([20240520, 1, len(part)] + [0] * 253)))
        f.write(struct.pack(f"<{len(part)}H", *part))
PY
  for f in "$fix/llama/tokens.npy" "$tmp"/w0.bin "$tmp"/w1.bin "$tmp"/w2.bin "$tmp"/w3.bin; do
    windows=; [ "$f" = "$fix/llama/tokens.npy" ] && windows=--windows
    timeout 120 "${mpirun[@]}" -np 2 "$upipe" eval --model "$fix/llama" --tokens "$f" --method upipe \
      $windows --seq-len 128 --json > "$tmp/$(basename "$f").json" || fail "eval of $f failed"
  done
  /usr/bin/python3 - "$tmp" <<'PY' || fail "the windows' loss is not the mean of the windows"
import json, sys
d = sys.argv[1]
whole = json.load(open(f"{d}/tokens.npy.json"))
parts = [json.load(open(f"{d}/w{w}.bin.json"))["loss"] for w in range(4)]
mean = sum(parts) / 4
print(f"--windows loss {whole['loss']!r}, windows {parts}, their mean {mean!r}")
assert whole["windows"] == 4 and abs(whole["loss"] - mean) <= 1e-12 * abs(mean), (whole, mean)
PY
  mkdir -p "$tmp/ck/step_00000001" && echo '{}' > "$tmp/ck/step_00000001/meta.json" && touch "$tmp/ck/step_00000001/DONE"
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" eval --model "$tmp/ck" --seq-len 64 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q "is a training checkpoint, not a Hugging Face model; export it first" ||
    { echo "$out"; fail "a training checkpoint as --model: exit $rc"; } ;;
save_grads_llama | save_grads_qwen3)
  fx=${case_name#save_grads_}
  timeout 120 "${mpirun[@]}" -np 2 "$upipe" eval --model "$fix/$fx" --tokens "$fix/$fx/tokens.npy" \
    --method upipe --json --save-grads "$tmp/g.safetensors" > "$tmp/eval.json" || fail "eval failed"
  /usr/bin/python3 "$here/check_grads.py" "$tmp/g.safetensors" "$fix/$fx" "$tmp/eval.json" ||
    fail "gradients differ" ;;
packed_llama | packed_qwen3)
  fx=${case_name#packed_}
  want=$(/usr/bin/python3 -c "import json; print('%.6f' % json.load(open('$fix/$fx/reference.json'))['packed']['loss_fp64'])")
  eval_expect "loss ${want:0:8}" --model "$fix/$fx" --tokens "$fix/$fx/tokens.npy" --method ring \
    --doc-lens "$fix/$fx/doc_lens.npy"
  eval_expect "in 7 documents" --model "$fix/$fx" --tokens "$fix/$fx/tokens.npy" --method ring \
    --doc-lens 1,63,100,1,211,37,99 --loss-only
  timeout 120 "${mpirun[@]}" -np 2 "$upipe" eval --model "$fix/$fx" --tokens "$fix/$fx/tokens.npy" \
    --method upipe --doc-lens "$fix/$fx/doc_lens.npy" --json --save-grads "$tmp/g.safetensors" \
    > "$tmp/eval.json" || fail "eval failed"
  /usr/bin/python3 "$here/check_grads.py" "$tmp/g.safetensors" "$fix/$fx" "$tmp/eval.json" packed ||
    fail "gradients differ"
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" eval --model "$fix/$fx" \
    --tokens "$fix/$fx/tokens.npy" --doc-lens 1,63,100 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q -e "--doc-lens: the 3 lengths sum to 164, not the sequence length 512" ||
    { echo "$out"; fail "bad lengths: exit $rc"; } ;;
windows_packed)
  # Documents of 5 to 60 words, a training set and a held-out one, as `upipe tokenize DIR` writes
  # them (a Megatron dataset): eval could not read it (newcomer pass).
  mkdir -p "$tmp/trd" "$tmp/vad"
  for i in $(seq 1 60); do
    d=trd; [ "$i" -gt 40 ] && d=vad
    /usr/bin/python3 -c "import random,sys; random.seed(int(sys.argv[1])); print(' '.join(random.choice(['the','cat','sat','on','a','mat']) for _ in range(random.randint(5, 60))))" \
      "$i" > "$tmp/$d/d$i.txt"
  done
  "$upipe" tokenize "$tmp/trd" "$tmp/tr" > /dev/null && "$upipe" tokenize "$tmp/vad" "$tmp/va" > /dev/null ||
    fail "tokenize"
  timeout 300 "${mpirun[@]}" -np 2 "$upipe" train --data-kind=files --data-path="$tmp/tr" \
    --val-path="$tmp/va" --documents=index --seq-len=256 --tile-tokens=256 --steps=2 \
    --val-interval=2 --val-sequences=5 --checkpoint-dir="$tmp/ck" --metrics-path="$tmp/m.jsonl" \
    > "$tmp/train.out" 2>&1 || { cat "$tmp/train.out"; fail "train failed"; }
  "$upipe" export "$tmp/ck" "$tmp/hf" --dtype fp32 > /dev/null || fail "export failed"
  timeout 120 "${mpirun[@]}" -np 2 "$upipe" eval --model "$tmp/hf" --tokens "$tmp/va" --seq-len 256 \
    --tile-tokens 256 --windows --documents index --max-windows 5 --json > "$tmp/eval.json" ||
    fail "eval failed"
  timeout 120 "${mpirun[@]}" -np 2 "$upipe" eval --model "$tmp/hf" --tokens "$tmp/va" --seq-len 256 \
    --tile-tokens 256 --windows --documents index --json > "$tmp/all.json" || fail "eval failed"
  /usr/bin/python3 - "$tmp" <<'PY' || fail "eval's loss is not the validation loss"
import json, sys
d = sys.argv[1]
val = [json.loads(l)["val_loss"] for l in open(f"{d}/m.jsonl") if "val_loss" in l][-1]
e = json.load(open(f"{d}/eval.json"))
a = json.load(open(f"{d}/all.json"))
print(f"validation loss {val!r}, eval --windows --documents index --max-windows 5 {e['loss']!r} ({e['windows']} of {e['windows_in_data']} windows, {e['documents']} documents); every window {a['loss']!r} ({a['windows']})")
assert e["loss"] == val and e["windows"] == 5 and e["windows_in_data"] == 7 and e["documents"] > e["windows"], (val, e)
assert a["windows"] == 7 and a["windows_in_data"] == 7 and a["loss"] != val, a
PY
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" eval --model "$tmp/hf" --tokens "$tmp/va.bin" --seq-len 256 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q -e "has a Megatron .idx beside it: read that dataset's windows with --windows --seq-len S --documents index" ||
    { echo "$out"; fail "a Megatron .bin as one sequence: exit $rc"; }
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" eval --model "$tmp/hf" --tokens "$tmp/va" --seq-len 256 --documents index 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q -e "--documents says where the documents of --windows' data end: add --windows" ||
    { echo "$out"; fail "--documents without --windows: exit $rc"; }
  out=$(timeout 120 "${mpirun[@]}" -np 2 "$upipe" eval --model "$tmp/hf" --tokens "$tmp/va" --seq-len 256 --max-windows 5 2>&1); rc=$?
  [ $rc -eq 2 ] && echo "$out" | grep -q -e "--max-windows counts --windows' windows: add --windows" ||
    { echo "$out"; fail "--max-windows without --windows: exit $rc"; } ;;
*) echo "unknown case $case_name"; exit 2 ;;
esac
echo "PASS $case_name"
