#!/usr/bin/env bash
# The run files of examples/ work as their comments say: each parses and validates; the copy
# task and the text corpus train two steps on 2 ranks (the corpus made by `upipe tokenize`, with
# validation) and the corpus run exports with the byte tokenizer; the Llama-3-8B file plans to
# fit 8 ranks of 80 GB at its sequence length, and the plan's command is the file itself.
# Usage: examples.sh UPIPE SOURCE_DIR MPIRUN...
set -u
upipe=$(realpath "$1") src=$(realpath "$2")
shift 2
mpirun=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ex=$src/examples
for f in "$ex"/*.toml; do
  "$upipe" train "$f" --print-config > /dev/null || fail "$f does not parse"
  echo "ok: $(basename "$f") parses"
done
cd "$tmp" || exit 1
short=(--steps=2 --seq-len=256 --progress=lines)
timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "$ex/copy-task.toml" "${short[@]}" --val-interval=1 \
  > copy.out 2>&1 || { cat copy.out; fail "copy-task.toml"; }
grep -q '"val_loss"' copy.jsonl && [ -f ckpt-copy/step_00000002/DONE ] || fail "copy-task: no validation or checkpoint"
"$upipe" tokenize "$src/README.md" corpus.bin > /dev/null && "$upipe" tokenize "$src/docs/training.md" val.bin > /dev/null ||
  fail "tokenize"
timeout 300 "${mpirun[@]}" -np 2 "$upipe" train "$ex/text-corpus.toml" "${short[@]}" --val-interval=2 \
  > text.out 2>&1 || { cat text.out; fail "text-corpus.toml"; }
grep -q '"val_loss"' text.jsonl || fail "text-corpus: no validation loss"
"$upipe" export ckpt-text hf-text > export.out || { cat export.out; fail "export"; }
python3 "$src/tests/cli/byte_tokenizer.py" hf-text || fail "the export's tokenizer"
plan=$(timeout 300 "$upipe" plan "$ex/llama3-8b-long-context.toml" --ranks 8 --json) || fail "plan of the Llama-3-8B file"
printf '%s' "$plan" | python3 -c '
import json, sys
m = json.load(sys.stdin)["methods"][0]
want = "mpirun -np 8 upipe train " + sys.argv[1]
assert m["fits"] and m["seq_len"] == 6684672, (m["fits"], m["seq_len"])
assert m["train_command"] == want, m["train_command"]
print("ok: llama3-8b-long-context.toml fits 8 x 80 GB at S = %d (device %.2f GiB)" % (m["seq_len"], m["device_peak_bytes"] / 2**30))
' "$ex/llama3-8b-long-context.toml" || fail "the Llama-3-8B plan"
echo "every example works"
