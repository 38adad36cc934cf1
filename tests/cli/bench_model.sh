#!/usr/bin/env bash
# `upipe bench model` as typed, on the committed fixtures' configurations (random weights): the
# FLOPs it says the step executed equal the closed form of the configuration (docs/model.md,
# "Speed"), and its MFU and HFU are the model and executed FLOPs over the GEMM rate it measured:
#   local_none  one rank, --recompute none: the model's matrix products (QK-norm's q, k products
#               once more) and one attention forward and backward per layer
#   upipe_none  upipe on 2 ranks: the same plus one q, k, v projection and attention forward
#               per layer (the block keeps nothing between forward and backward), summed over the ranks
# Usage: bench_model.sh UPIPE MPIRUN [MPIRUN ARGS...] -- CASE
set -u
upipe=$1
shift
mpirun=()
while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done
case_name=$2
here=$(cd "$(dirname "$0")" && pwd)
fix="$here/../fixtures/hf"
fail() { echo "FAIL $case_name: $*"; exit 1; }
s=192

# check FIXTURE RANKS JSON: the JSON's counts against the closed form for FIXTURE's config.json.
check() {
  python3 - "$fix/$1/config.json" "$2" "$s" "$3" <<'PY' || fail "$1: counts differ"
import json, sys
cfg, ranks, s = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
j = json.loads(sys.argv[4])
D, F, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
qk_norm = cfg["model_type"] == "qwen3"
matrix = L * D * (2 * q + 2 * kv + 3 * F) + V * D
gemm = 6 * s * matrix + (2 * s * L * D * (q + kv) if qk_norm else 0)
pairs = s * (s + 1) // 2
fwd, bwd = L * 4 * q * pairs, L * 10 * q * pairs
attn = fwd + bwd
if ranks > 1:  # the strategy's block recompute: q, k, v and one attention forward per layer
    gemm += 2 * s * L * D * (q + 2 * kv)
    attn += fwd
model = s * (6 * matrix + 6 * s * q * L)
ok = True
def same(name, got, want):
    global ok
    print("%s: %s (closed form %s)" % (name, got, want))
    ok &= got == want
same("executed_gemm_flops", j["executed_gemm_flops"], gemm)
same("executed_attention_flops", j["executed_attention_flops"], attn)
same("model_flops", j["model_flops"], model)
same("executed_attention_uncounted", j["executed_attention_uncounted"], 0)
g = j["gemm_tflops_per_s"] * 1e12
mfu, hfu = model / ranks / j["step_s"] / g, (gemm + attn) / ranks / j["step_s"] / g
print("mfu %.4f (from the counts %.4f), hfu %.4f (%.4f)" % (j["mfu"], mfu, j["hfu"], hfu))
ok &= g > 0 and abs(j["mfu"] - mfu) <= 1e-9 * mfu and abs(j["hfu"] - hfu) <= 1e-9 * hfu
ok &= j["gemm_n"] == 1024
sys.exit(0 if ok else 1)
PY
}

run_bench() {
  local np=$1 out
  shift
  out=$(timeout 120 "${mpirun[@]}" -np "$np" "$upipe" bench model --seq-len $s --iters 1 --recompute none \
        --json "$@" 2>&1) || { echo "$out"; fail "bench model failed"; }
  printf '%s\n' "$out" | grep '^{' | tail -1
}

case $case_name in
local_none)
  for fx in llama qwen3; do
    j=$(run_bench 1 --model "$fix/$fx" --random-weights --method local)
    check "$fx" 1 "$j"
  done ;;
upipe_none)
  for fx in llama qwen3; do
    j=$(run_bench 2 --model "$fix/$fx" --random-weights --method upipe)
    check "$fx" 2 "$j"
  done ;;
*) fail "unknown case" ;;
esac
echo "PASS $case_name"
