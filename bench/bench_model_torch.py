#!/usr/bin/env python3
"""PyTorch eager baseline for `upipe bench model`: the same decoder (a Hugging Face config.json of
model_type llama or qwen3) built with transformers on the CPU, one thread, fp32, random weights,
timed on one forward + backward of model(input_ids, labels=input_ids).loss over S random tokens.
With --dtype bf16 the step runs under torch.autocast("cpu", dtype=torch.bfloat16) (fp32 master
weights, bf16 matmuls and attention), PyTorch's usual bf16 training on the CPU.

Reports (one JSON line): median seconds of --iters timed steps after one warm-up step, tokens/s,
the loss of the last step and the attention implementation. Needs torch and transformers (run it
with the python that has them; bench/run_benchmarks.py uses /tmp/hf/bin/python when present).

Usage: bench_model_torch.py --config DIR/config.json --seq-len S [--iters N] [--attn sdpa|eager]
       [--dtype fp32|bf16]
"""
import argparse
import json
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="a Hugging Face config.json (llama or qwen3)")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"],
                    help="transformers' attention implementation")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                    help="bf16: the step under CPU autocast to bfloat16")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    import torch
    import transformers

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    with open(args.config) as f:
        cfg = json.load(f)
    cfg.pop("torch_dtype", None)  # the model is built in fp32 below, whatever the file says
    config = transformers.AutoConfig.for_model(**cfg)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=args.attn,
                                                          dtype=torch.float32)
    model.train()
    ids = torch.randint(0, config.vocab_size, (1, args.seq_len))

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    def step():
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, float(loss.detach())

    step()  # warm-up
    runs = [step() for _ in range(args.iters)]
    total = statistics.median(f + b for f, b, _ in runs)
    print(json.dumps({"framework": "pytorch-eager", "torch": torch.__version__,
                      "transformers": transformers.__version__, "attn_implementation": args.attn, "dtype": args.dtype,
                      "threads": torch.get_num_threads(), "seq_len": args.seq_len, "iters": args.iters,
                      "step_s": total, "fwd_s": statistics.median(f for f, _, _ in runs),
                      "bwd_s": statistics.median(b for _, b, _ in runs),
                      "tokens_per_s": args.seq_len / total, "loss": runs[-1][2],
                      "parameters": sum(p.numel() for p in model.parameters())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
