#!/usr/bin/env bash
# The attention-block commands take a model's block (--model: a preset or a Hugging Face
# directory) in place of the shape flags, which a newcomer had to copy from config.json by hand:
# `check --model tiny-qwen3` (QK-norm, GQA) passes against local on 2 ranks; `bench attention
# --model llama3-8b` plans Llama-3-8B's block (H 32, K 8, d 128); a shape flag beside --model
# is refused, exit 2, naming both.
# Usage: model_block.sh UPIPE_BINARY MPIRUN [MPIRUN ARGS...]
set -u
upipe=$1
shift
fail() { echo "FAIL: $*"; exit 1; }
out=$(timeout 120 "$@" -np 2 "$upipe" check --model tiny-qwen3 --seq-len 256 2>&1) ||
  { echo "$out"; fail "check --model tiny-qwen3 on 2 ranks"; }
echo "$out" | grep -q "PASSED" && ! echo "$out" | grep -q "FAILED" || { echo "$out"; fail "check did not pass"; }
echo "$out" | grep -E "H=|heads" | head -2
json=$("$upipe" bench attention --model llama3-8b --seq-len 65536 --meta-ranks 8 --json) ||
  fail "bench attention --model llama3-8b"
python3 -c 'import json,sys; j=json.loads(sys.argv[1]); s=(j["heads"], j["kv_heads"], j["head_dim"]); print("llama3-8b block:", s); assert s == (32, 8, 128), s' "$json" ||
  fail "bench attention --model llama3-8b planned another shape"
out=$("$upipe" bench attention --model llama3-8b --heads 8 --seq-len 4096 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q -F -- "--heads and --model llama3-8b: the model gives the block's shape; give one of them" ||
  { echo "$out"; fail "a shape flag beside --model: exit $rc"; }
echo "PASS"
