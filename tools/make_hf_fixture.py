#!/usr/bin/env python3
"""Generate the Hugging Face transformers reference fixtures for upipe's model tests.

Writes, for two small random decoders, everything the engine needs to prove that its
forward loss and its parameter gradients equal transformers':

    <out>/llama/   Llama-3 shape: GQA (4 q heads, 2 KV heads, head_dim 16, hidden 64),
                   RoPE theta 5e5 with "llama3" frequency scaling whose
                   original_max_position_embeddings (64) is below the fixture length, so
                   all three branches of the scaling (kept / smoothed / divided) are used;
                   tied embeddings (no lm_head.weight anywhere).
    <out>/qwen3/   Qwen3: QK-norm, head_dim 32 != hidden 64 / 4 heads, untied LM head.

Each directory holds
    config.json                 hub form: top-level "rope_theta" + "rope_scaling"
    config.rope_parameters.json (qwen3 only) the same config as transformers >= 5 writes
                                it: "rope_parameters": {"rope_theta", "rope_type", ...}
    model.safetensors           fp32 weights, Hugging Face tensor names
    tokens.npy                  1-D int32, S = 512 ids (includes V-1, V-2 and 0)
    grads_fp64.safetensors      d loss / d param, fp64 reference (see below)
    grads_fp32.safetensors      d loss / d param, stock transformers in fp32
    reference.json              losses, versions, per-tensor fp32-vs-fp64 gradient error
    doc_lens.npy                1-D int32 document lengths summing to S (packed sequence)
    grads_packed_fp64.safetensors, grads_packed_fp32.safetensors
                                the same gradients for tokens.npy packed as those documents
    reference.json "packed"     its losses and per-tensor fp32-vs-fp64 gradient error

The loss is `model(input_ids, labels=input_ids).loss`: mean cross-entropy over the S-1
next-token predictions. The packed reference runs each document alone through the model (its own
positions from 0, its own causal mask) and sums the token losses: the loss is that sum over the
S - (number of documents) predictions inside documents, divided by their count; a document of
length 1 predicts nothing. attn_implementation="eager" (the plain math:
softmax(q k^T / sqrt(d) + causal mask) v), so the reference does not depend on which
fused SDPA kernel torch picks.

fp32 reference: the stock transformers model in float32, untouched.

fp64 reference: the same weights, `model.double()`, plus four patches because stock
transformers silently computes parts of a float64 model in float32:
  * RoPE inv_freq is built in fp32 at init and cos/sin are computed from fp32
    position * inv_freq        -> inv_freq recomputed in exact fp64 (same formula,
                                  incl. llama3 scaling), angles and cos/sin in fp64;
  * RMSNorm casts its input to fp32           -> computed in the input dtype (fp64);
  * eager attention softmax(dtype=float32)    -> softmax in fp64;
  * ForCausalLMLoss does logits.float()       -> cross-entropy in fp64.
Each patch is the identical expression with the fp32 cast removed. The patched fp64
model is checked against an independent plain-torch fp64 implementation written here
(loss and every gradient must agree to ~1e-12). The stock (unpatched) `.double()` loss
is also recorded, as "loss_fp64_stock", for information.

reference.json "grad_rel_err" gives, per tensor, transformers' own fp32 error:
    max_abs_rel = max|g32 - g64| / max|g64|
    fro_rel     = ||g32 - g64||_F / ||g64||_F
The engine's fp32 tolerance is meant to be 10x of these.

Deterministic: fixed seeds (--seed, default 1234), a fixed weight initialisation written
here (not transformers' init), one CPU thread, deterministic algorithms. Runs on CPU in
well under a minute.

Usage (needs torch, transformers, safetensors, numpy; `make test` and CI never run it):
    python3 tools/make_hf_fixture.py [--out tests/fixtures/hf] [--seq-len 512]
                                     [--seed 1234] [--models llama,qwen3] [--verify-only]
                                     [--packed-only]
--packed-only writes only the packed files, from the weights and tokens already there.
"""
import argparse
import copy
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import load_file

import transformers
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.llama import modeling_llama
from transformers.models.qwen3 import modeling_qwen3

# ----------------------------------------------------------------------------------------
# The two configs, in the form hub config.json files have (rope_theta + rope_scaling).
# ----------------------------------------------------------------------------------------

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 160,
    "max_position_embeddings": 512,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 64,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "use_cache": True,
    "vocab_size": 256,
}

QWEN3_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "initializer_range": 0.02,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "max_window_layers": 2,
    "model_type": "qwen3",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 256,
}

MODELS = {"llama": LLAMA_CONFIG, "qwen3": QWEN3_CONFIG}
MODULES = {"llama": modeling_llama, "qwen3": modeling_qwen3}


def setup_torch():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")


# ----------------------------------------------------------------------------------------
# Weights and tokens
# ----------------------------------------------------------------------------------------

def init_weights(model, seed):
    """Fixed init: Linear/embedding ~ N(0, 1/fan_in) (embedding: 1/hidden), every
    RMSNorm weight (input/post-attention/final norms, q_norm, k_norm) ~ U(0.5, 1.5)."""
    g = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights appear once
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g, dtype=torch.float64))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(hidden))
            elif name.endswith(".weight") and p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(p.shape[1]))
            else:
                raise RuntimeError(f"unexpected parameter {name}")


def make_tokens(seq_len, vocab, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=seq_len, dtype=np.int64)
    # ids at the top of the vocabulary (and 0), as inputs and as labels
    for pos, tok in [(0, vocab - 1), (1, vocab - 2), (2, 0), (seq_len // 2, vocab - 1),
                     (seq_len // 2 + 1, vocab - 1), (seq_len - 2, vocab - 3), (seq_len - 1, vocab - 1)]:
        ids[pos] = tok
    ids[rng.choice(seq_len, size=8, replace=False)] = vocab - 1
    return ids.astype(np.int32)


# ----------------------------------------------------------------------------------------
# fp64 reference: exact fp64 inv_freq and removal of the fp32 casts
# ----------------------------------------------------------------------------------------

def inv_freq_fp64(cfg):
    """RoPE inverse frequencies in fp64, same formulas as transformers (default, llama3)."""
    rp = cfg.rope_parameters
    dim = cfg.head_dim
    base = float(rp["rope_theta"])
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if rp["rope_type"] == "default":
        return inv
    assert rp["rope_type"] == "llama3", rp
    factor, lo, hi = float(rp["factor"]), float(rp["low_freq_factor"]), float(rp["high_freq_factor"])
    old = float(rp["original_max_position_embeddings"])
    lo_wl, hi_wl = old / lo, old / hi
    wavelen = 2 * math.pi / inv
    inv_l = torch.where(wavelen > lo_wl, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
    medium = ~(wavelen < hi_wl) * ~(wavelen > lo_wl)
    return torch.where(medium, smoothed, inv_l)


def _rms_forward_exact(self, hidden_states):
    dt = hidden_states.dtype
    h = hidden_states.to(torch.promote_types(dt, torch.float32))
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * h.to(dt)


def _rotary_forward_fp64(self, x, position_ids):
    freqs = position_ids[..., None].to(torch.float64) * self.inv_freq.to(device=x.device, dtype=torch.float64)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * self.attention_scaling
    sin = emb.sin() * self.attention_scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def _make_eager_exact(mod):
    repeat_kv = mod.repeat_kv

    def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key_states = repeat_kv(key, module.num_key_value_groups)
        value_states = repeat_kv(value, module.num_key_value_groups)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.promote_types(query.dtype, torch.float32)).to(query.dtype)
        attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()
        return attn_output, attn_weights

    return eager_attention_forward


def _causal_lm_loss_exact(logits, labels, vocab_size, ignore_index=-100, **kwargs):
    labels = F.pad(labels, (0, 1), value=ignore_index)
    shift_labels = labels[..., 1:].contiguous().view(-1).to(logits.device)
    return F.cross_entropy(logits.view(-1, vocab_size), shift_labels, ignore_index=ignore_index, reduction="mean")


class Fp64Exact:
    """Context: patches the model family's module so that a .double() model is fp64 throughout."""

    def __init__(self, name):
        self.mod = MODULES[name]
        self.rms_cls = getattr(self.mod, "LlamaRMSNorm" if name == "llama" else "Qwen3RMSNorm")

    def __enter__(self):
        self.saved = (self.rms_cls.forward, self.mod.eager_attention_forward)
        self.rms_cls.forward = _rms_forward_exact
        self.mod.eager_attention_forward = _make_eager_exact(self.mod)
        return self

    def __exit__(self, *exc):
        self.rms_cls.forward, self.mod.eager_attention_forward = self.saved


def to_fp64_exact(model):
    """model.double() with exact fp64 RoPE frequencies and an fp64 loss (the per-instance
    parts of the patch; use together with Fp64Exact)."""
    model.double()
    rot = model.model.rotary_emb
    inv = inv_freq_fp64(model.config)
    assert torch.allclose(inv.float(), rot.inv_freq.float(), rtol=1e-6, atol=0), (inv, rot.inv_freq)
    rot.inv_freq = inv.clone()
    rot.original_inv_freq = inv.clone()
    rot.forward = _rotary_forward_fp64.__get__(rot)
    model.loss_function = _causal_lm_loss_exact
    return model


# ----------------------------------------------------------------------------------------
# Independent plain-torch fp64 implementation (check of the patched fp64 reference)
# ----------------------------------------------------------------------------------------

def independent_loss(params, cfg, ids, inv_freq):
    """The model written out from the architecture, fp64 throughout. params: name -> tensor."""
    S = ids.shape[0]
    H, K, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    G = H // K
    eps = cfg.rms_norm_eps
    qk_norm = cfg.model_type == "qwen3"

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(x):  # x (S, heads, d); rotate-half convention
        ang = torch.arange(S, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (S, d/2)
        cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    E = params["model.embed_tokens.weight"]
    W_lm = params.get("lm_head.weight", E)
    x = E[ids]
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    for l in range(cfg.num_hidden_layers):
        p = lambda n: params[f"model.layers.{l}.{n}"]
        h = rms(x, p("input_layernorm.weight"))
        q = (h @ p("self_attn.q_proj.weight").T).view(S, H, d)
        k = (h @ p("self_attn.k_proj.weight").T).view(S, K, d)
        v = (h @ p("self_attn.v_proj.weight").T).view(S, K, d)
        if qk_norm:
            q = rms(q, p("self_attn.q_norm.weight"))
            k = rms(k, p("self_attn.k_norm.weight"))
        q, k = rope(q), rope(k)
        kh = k[:, torch.arange(H) // G, :]  # query head h reads KV head h // G
        vh = v[:, torch.arange(H) // G, :]
        s = torch.einsum("ihd,jhd->hij", q, kh) / math.sqrt(d)
        s = s.masked_fill(~causal, float("-inf"))
        o = torch.einsum("hij,jhd->ihd", torch.softmax(s, dim=-1), vh).reshape(S, H * d)
        x = x + o @ p("self_attn.o_proj.weight").T
        h = rms(x, p("post_attention_layernorm.weight"))
        m = F.silu(h @ p("mlp.gate_proj.weight").T) * (h @ p("mlp.up_proj.weight").T)
        x = x + m @ p("mlp.down_proj.weight").T
    x = rms(x, params["model.norm.weight"])
    logits = x @ W_lm.T
    return F.cross_entropy(logits[:-1], ids[1:], reduction="mean")


# ----------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------

def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids[None, :], labels=ids[None, :], use_cache=False)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return out.loss.detach(), grads


def rel_err(a, b):
    """a: approximation, b: reference (both fp64 tensors)."""
    diff = (a - b).abs()
    return {
        "max_abs_rel": float(diff.max() / b.abs().max()),
        "fro_rel": float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)),
    }


def rope_config_form(cfg_dict):
    """The same config as transformers >= 5 serialises it (rope_parameters form)."""
    cfg = AutoConfig.for_model(**{k: v for k, v in cfg_dict.items() if k != "model_type"},
                               model_type=cfg_dict["model_type"])
    with tempfile.TemporaryDirectory() as td:
        cfg.save_pretrained(td)
        with open(os.path.join(td, "config.json")) as f:
            return json.load(f)


def generate(name, outdir, seq_len, seed):
    cfg_dict = MODELS[name]
    os.makedirs(outdir, exist_ok=True)
    write_json(os.path.join(outdir, "config.json"), cfg_dict)
    if name == "qwen3":
        write_json(os.path.join(outdir, "config.rope_parameters.json"), rope_config_form(cfg_dict))

    cfg = AutoConfig.from_pretrained(outdir)  # parse the hub form we just wrote
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    model.train(False)  # no dropout anyway (attention_dropout 0); eval for clarity
    init_weights(model, seed)
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight

    # weights: Hugging Face names; tied head stored once, as model.embed_tokens.weight
    weights = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    assert ("lm_head.weight" in weights) == (not cfg.tie_word_embeddings)
    np_save_file(weights, os.path.join(outdir, "model.safetensors"), metadata={"format": "pt"})

    vocab = cfg.vocab_size
    tokens = make_tokens(seq_len, vocab, seed)
    np.save(os.path.join(outdir, "tokens.npy"), tokens)
    ids = torch.from_numpy(tokens.astype(np.int64))

    inv32 = model.model.rotary_emb.inv_freq.detach().clone()

    # fp32 reference: stock transformers
    loss32, g32 = loss_and_grads(model, ids)

    # fp64 stock (.double() only), for information
    m64s = copy.deepcopy(model).double()
    loss64_stock, _ = loss_and_grads(m64s, ids)
    del m64s

    # fp64 reference: .double() + exact fp64 RoPE / RMSNorm / softmax / loss
    m64 = to_fp64_exact(copy.deepcopy(model))
    if cfg.tie_word_embeddings:
        assert m64.lm_head.weight is m64.model.embed_tokens.weight
    with Fp64Exact(name):
        loss64, g64 = loss_and_grads(m64, ids)
    inv64 = m64.model.rotary_emb.inv_freq.detach().clone()

    # independent check of the fp64 reference
    params = {n: p.detach().clone().requires_grad_(True) for n, p in m64.named_parameters()}
    loss_ind = independent_loss(params, cfg, ids, inv_freq_fp64(cfg))
    loss_ind.backward()
    ind_loss_rel = abs(float(loss_ind.detach()) - float(loss64)) / abs(float(loss64))
    ind_grad_rel = max(rel_err(params[n].grad, g64[n])["max_abs_rel"] for n in g64)
    assert ind_loss_rel < 1e-12 and ind_grad_rel < 1e-10, (ind_loss_rel, ind_grad_rel)

    assert set(g32) == set(g64) == set(weights)
    np_save_file({n: g64[n].numpy() for n in g64}, os.path.join(outdir, "grads_fp64.safetensors"),
                 metadata={"format": "pt"})
    np_save_file({n: g32[n].numpy() for n in g32}, os.path.join(outdir, "grads_fp32.safetensors"),
                 metadata={"format": "pt"})

    errs = {n: rel_err(g32[n].double(), g64[n]) for n in g64}
    worst = max(errs, key=lambda n: errs[n]["max_abs_rel"])
    worst_fro = max(errs, key=lambda n: errs[n]["fro_rel"])
    ref = {
        "model": name,
        "seq_len": seq_len,
        "seed": seed,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "attn_implementation": "eager",
        "loss_definition": "model(input_ids, labels=input_ids).loss: mean CE over the S-1 next-token predictions",
        "loss_fp64": float(loss64),
        "loss_fp32": float(loss32),
        "loss_fp32_rel_err": abs(float(loss32) - float(loss64)) / abs(float(loss64)),
        "loss_fp64_stock": float(loss64_stock),
        "loss_fp64_stock_note": "model.double() without the fp64 patches (transformers keeps RoPE angles, "
                                "RMSNorm, softmax and the loss in fp32); information only",
        "fp64_reference": "model.double() with inv_freq recomputed in fp64 and RoPE angles, RMSNorm, "
                          "softmax and cross-entropy computed in fp64",
        "fp64_check_independent": {"loss_rel_err": ind_loss_rel, "grad_max_abs_rel": ind_grad_rel},
        "inv_freq_fp64": [float(x) for x in inv64],
        "inv_freq_fp32_transformers": [float(x) for x in inv32],
        "grad_rel_err_definition": {"max_abs_rel": "max|g32-g64| / max|g64|",
                                    "fro_rel": "||g32-g64||_F / ||g64||_F"},
        "grad_rel_err_max": {"max_abs_rel": errs[worst]["max_abs_rel"], "max_abs_rel_tensor": worst,
                             "fro_rel": errs[worst_fro]["fro_rel"], "fro_rel_tensor": worst_fro},
        "grad_rel_err": errs,
        "tensors": {n: list(w.shape) for n, w in weights.items()},
    }
    write_json(os.path.join(outdir, "reference.json"), ref)
    return ref


# ----------------------------------------------------------------------------------------
# Packed documents: each document alone through the model, token losses summed
# ----------------------------------------------------------------------------------------

# Lengths summing to the fixtures' S = 512: documents of length 1, lengths off every power of
# two, one longer than S / 4.
PACKED_DOC_LENS = [1, 63, 100, 1, 211, 37, 99]


def packed_loss_and_grads(model, ids, lens):
    """sum over documents of (their token losses summed) / (predictions inside documents)."""
    model.zero_grad(set_to_none=True)
    predictions = sum(l - 1 for l in lens)
    total = 0.0
    start = 0
    for l in lens:
        if l > 1:
            d = ids[start:start + l]
            out = model(input_ids=d[None, :], labels=d[None, :], use_cache=False)
            part = out.loss * (l - 1) / predictions
            part.backward()
            total += float(part.detach())
        start += l
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return total, grads


def generate_packed(name, outdir):
    """The packed reference from the weights and tokens already in outdir."""
    seq_len = int(np.load(os.path.join(outdir, "tokens.npy")).shape[0])
    lens = PACKED_DOC_LENS
    assert sum(lens) == seq_len, (sum(lens), seq_len)
    np.save(os.path.join(outdir, "doc_lens.npy"), np.array(lens, dtype=np.int32))
    ids = torch.from_numpy(np.load(os.path.join(outdir, "tokens.npy")).astype(np.int64))
    model = AutoModelForCausalLM.from_pretrained(outdir, dtype=torch.float32, attn_implementation="eager")
    model.train(False)
    loss32, g32 = packed_loss_and_grads(model, ids, lens)
    m64 = to_fp64_exact(copy.deepcopy(model))
    with Fp64Exact(name):
        loss64, g64 = packed_loss_and_grads(m64, ids, lens)
    np_save_file({n: g64[n].numpy() for n in g64}, os.path.join(outdir, "grads_packed_fp64.safetensors"),
                 metadata={"format": "pt"})
    np_save_file({n: g32[n].numpy() for n in g32}, os.path.join(outdir, "grads_packed_fp32.safetensors"),
                 metadata={"format": "pt"})
    errs = {n: rel_err(g32[n].double(), g64[n]) for n in g64}
    with open(os.path.join(outdir, "reference.json")) as f:
        ref = json.load(f)
    ref["packed"] = {
        "doc_lens": lens,
        "loss_definition": "each document alone through the model; the sum of the token losses over "
                           "the S - (documents) next-token predictions inside documents, divided by their count",
        "loss_fp64": loss64,
        "loss_fp32": loss32,
        "loss_fp32_rel_err": abs(loss32 - loss64) / abs(loss64),
        "grad_rel_err": errs,
    }
    write_json(os.path.join(outdir, "reference.json"), ref)
    print(f"  {name} packed ({len(lens)} documents): loss fp64 {loss64:.17g}  fp32 {loss32:.9g}")


# ----------------------------------------------------------------------------------------
# Verification: reload what was written with transformers and reproduce the reference
# ----------------------------------------------------------------------------------------

def verify(name, outdir):
    with open(os.path.join(outdir, "reference.json")) as f:
        ref = json.load(f)
    ids = torch.from_numpy(np.load(os.path.join(outdir, "tokens.npy")).astype(np.int64))
    assert np.load(os.path.join(outdir, "tokens.npy")).dtype == np.int32
    g32_ref = load_file(os.path.join(outdir, "grads_fp32.safetensors"))
    g64_ref = load_file(os.path.join(outdir, "grads_fp64.safetensors"))

    dirs = [("config.json", outdir)]
    tmp = None
    if os.path.exists(os.path.join(outdir, "config.rope_parameters.json")):
        tmp = tempfile.mkdtemp()
        shutil.copy(os.path.join(outdir, "config.rope_parameters.json"), os.path.join(tmp, "config.json"))
        shutil.copy(os.path.join(outdir, "model.safetensors"), os.path.join(tmp, "model.safetensors"))
        dirs.append(("config.rope_parameters.json", tmp))
    rope_params = []
    try:
        for cfg_name, d in dirs:
            model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
            rope_params.append(dict(model.config.rope_parameters))
            loss32, g32 = loss_and_grads(model, ids)
            assert float(loss32) == ref["loss_fp32"], (cfg_name, float(loss32), ref["loss_fp32"])
            for n in g32_ref:
                assert torch.equal(g32[n], g32_ref[n]), (cfg_name, n)
            m64 = to_fp64_exact(model)
            with Fp64Exact(name):
                loss64, g64 = loss_and_grads(m64, ids)
            assert abs(float(loss64) - ref["loss_fp64"]) <= 1e-14 * abs(ref["loss_fp64"]), (cfg_name, float(loss64))
            for n in g64_ref:
                assert rel_err(g64[n], g64_ref[n])["max_abs_rel"] < 1e-12, (cfg_name, n)
            print(f"  {name}: reloaded with {cfg_name}: loss fp32 {float(loss32):.9g} (bitwise equal), "
                  f"fp64 {float(loss64):.17g}, gradients reproduced")
    finally:
        if tmp:
            shutil.rmtree(tmp)
    assert all(rp == rope_params[0] for rp in rope_params), rope_params


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "tests", "fixtures", "hf"),
                    help="output directory (one subdirectory per model); default tests/fixtures/hf")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--models", default="llama,qwen3")
    ap.add_argument("--verify-only", action="store_true", help="only reload and check existing fixtures")
    ap.add_argument("--packed-only", action="store_true",
                    help="only (re)write the packed-documents reference from the existing weights and tokens")
    args = ap.parse_args()
    setup_torch()
    out = os.path.normpath(args.out)
    for name in args.models.split(","):
        d = os.path.join(out, name)
        if args.packed_only:
            generate_packed(name, d)
            continue
        if not args.verify_only:
            ref = generate(name, d, args.seq_len, args.seed)
            w = ref["grad_rel_err_max"]
            print(f"{name}: loss fp64 {ref['loss_fp64']:.17g}  fp32 {ref['loss_fp32']:.9g}  "
                  f"(stock .double() {ref['loss_fp64_stock']:.17g})")
            print(f"  largest fp32-vs-fp64 grad error: max_abs_rel {w['max_abs_rel']:.3e} ({w['max_abs_rel_tensor']}), "
                  f"fro_rel {w['fro_rel']:.3e} ({w['fro_rel_tensor']})")
            print(f"  independent fp64 check: loss rel {ref['fp64_check_independent']['loss_rel_err']:.2e}, "
                  f"grad rel {ref['fp64_check_independent']['grad_max_abs_rel']:.2e}")
            generate_packed(name, d)
        verify(name, d)
    print(f"wrote {out}" if not args.verify_only else f"verified {out}")


if __name__ == "__main__":
    sys.exit(main())
