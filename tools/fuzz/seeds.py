#!/usr/bin/env python3
"""Seed corpora of the tools/fuzz harnesses, written into OUT/<harness>/ (`make fuzz` writes
build-fuzz/corpus): the repository's fixtures and examples, and a few tiny files made here;
fuzz_checkpoint_files' seeds are written by the harness itself (the real checkpoint writer), run
from OUT's build directory (OUT/../tools/fuzz), and are fuzz_resume_checkpoint's too (one format).
Nothing of it is committed; the fuzzers add what they find to these directories."""
import json
import os
import pathlib
import struct
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"


def safetensors(tensors, metadata=None):
    """tensors: (name, dtype, shape, data bytes), laid out in order."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def llmc_bin(ids, width):
    magic, version = (20240520, 1) if width == 2 else (20240801, 7)
    head = struct.pack("<3i", magic, version, len(ids)) + b"\0" * (256 * 4 - 12)
    return head + b"".join(struct.pack("<H" if width == 2 else "<I", i) for i in ids)


def main(out):
    out = pathlib.Path(out)
    seeds = {}
    f32 = lambda *v: struct.pack(f"<{len(v)}f", *v)
    seeds["fuzz_safetensors"] = {
        "f32_bf16": safetensors([("a", "F32", [2, 3], f32(*range(6))), ("b", "BF16", [4], b"\x80\x3f" * 4)],
                                {"format": "pt"}),
        "f16_scalar": safetensors([("h", "F16", [3], b"\x00\x3c" * 3), ("s", "F32", [], f32(2.5))]),
        "empty": safetensors([("z", "F32", [0, 4], b"")]),
    }
    index = {"metadata": {"total_size": 64},
             "weight_map": {"model.a.weight": "model-00001-of-00002.safetensors",
                            "model.b.weight": "model-00001-of-00002.safetensors",
                            "model.e.weight": "model-00002-of-00002.safetensors"}}
    seeds["fuzz_safetensors_index"] = {"index": json.dumps(index, indent=2).encode(),
                                       "index_one": json.dumps({"weight_map": {
                                           "model.e.weight": "model-00002-of-00002.safetensors"}}).encode()}
    configs = {f"{m}_{p.name}": p.read_bytes() for m in ("llama", "qwen3") for p in (FIX / "hf" / m).glob("config*.json")}
    seeds["fuzz_model_config"] = configs
    seeds["fuzz_run_toml"] = {p.name: p.read_bytes() for p in (ROOT / "examples").glob("*.toml")}
    ids = [(i * 37) % 251 for i in range(40)]
    seeds["fuzz_tokens"] = {"tokens.npy": (FIX / "hf" / "llama" / "tokens.npy").read_bytes(),
                            "w2.bin": llmc_bin(ids, 2), "w4.bin": llmc_bin(ids, 4)}
    seeds["fuzz_indexed_dataset"] = {
        name: struct.pack("<H", len(idx)) + idx + (FIX / "megatron" / f"{name}.bin").read_bytes()
        for name in ("split", "uint16") for idx in [(FIX / "megatron" / f"{name}.idx").read_bytes()]}
    seeds["fuzz_doc_lens"] = {"doc_lens.npy": (FIX / "hf" / "llama" / "doc_lens.npy").read_bytes(),
                              "list": b"100,12,400", "bin": llmc_bin([100, 12, 400], 2)}
    lines = [json.dumps({"step": s, "run": "r1", "loss": 5.5 - 0.25 * s, "grad_norm": 1.0, "lr": 1e-4,
                         "tokens_per_s": 100.0, "mfu": 0.1, "peak_bytes": 10, "peak_by_tag": {"weights": 10},
                         "host_peak_bytes": 0, "host_peak_by_tag": {}, "budget_bytes": 100,
                         "step_s": 0.5, "eta_s": 1.0}, separators=(",", ":")) for s in (1, 2, 3)]
    seeds["fuzz_metrics"] = {"metrics.jsonl": ("\n".join(lines) + "\n").encode()}
    meta = {"format": "upipe-zero3-checkpoint-2", "upipe": "0.1.0", "run_id": "r1", "step": 2,
            "world": 2, "cp_size": 2,
            "units": [{"name": "embed", "numel": 10, "shard": 5}, {"name": "layer0", "numel": 7, "shard": 4}],
            "model": (FIX / "hf" / "llama" / "config.json").read_text(),
            "run": (ROOT / "examples" / "copy-task.toml").read_text(),
            "checksum": {"algorithm": "xxh3-64", "piece_elements": 4},
            "files": [{"name": f"rank_{q:05d}.safetensors", "bytes": 400, "header_xxh3": "0123456789abcdef",
                       "pieces_xxh3": ["00000000000000%02x" % i for i in range(9)]} for q in range(2)],
            "data": "copy"}
    seeds["fuzz_checkpoint_meta"] = {"meta.json": (json.dumps(meta, indent=1) + "\n").encode()}
    seeds["fuzz_strict_json"] = dict(configs, index=seeds["fuzz_safetensors_index"]["index"],
                                     meta=seeds["fuzz_checkpoint_meta"]["meta.json"],
                                     dup=b'{"a": 1, "b": {"c": [1, 2.5e3, null, true]}, "a": 2}')
    # fuzz_load_params: the model byte (0 tiny, 1 tiny-qwen3), then edits of 3 bytes (op, target,
    # argument; tools/fuzz/fuzz_load_params.cpp): none, a second shard, a tied lm_head stored too
    # (the embedding's values, or others), a BF16 tensor.
    seeds["fuzz_load_params"] = {"tiny": b"\x00", "qwen3": b"\x01", "sharded": b"\x00\x07\x03\x00",
                                 "tied_head": b"\x01\x05\x00\x00",
                                 "tied_head_differs": b"\x01\x05\x00\x00\x04\x18\x05",
                                 "bf16": b"\x00\x02\x01\x01"}
    # fuzz_tokenize: entries (kind, name length, name, content length, content), then the output byte.
    entry = lambda kind, name, body: bytes([kind, len(name)]) + name + bytes([len(body)]) + body
    seeds["fuzz_tokenize"] = {
        "two": entry(0, b"a.txt", b"hello") + entry(0, b"b.txt", b"") + b"\x00",
        "mixed": b"".join([entry(0, b"a", b"xy"), entry(2, b"git", b"h"), entry(3, b"sub", b"z"),
                           entry(4, b"ln", b""), entry(5, b"up", b""), entry(6, b"dang", b""),
                           entry(7, b"old", b"ab")]) + b"\x01",
        "bytes": entry(0, b"a", b"\xff\x00x") + b"\x10",
        "force": entry(0, b"a", b"q") + bytes([8 | 4 | 3])}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    bpe = {"version": "1.0", "added_tokens": [{"id": 256, "content": "<s>", "special": True}],
           "pre_tokenizer": byte_level, "decoder": byte_level,
           "post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                              "special_tokens": {"<s>": {"id": "<s>", "ids": [256], "tokens": ["<s>"]}}},
           "model": {"type": "BPE", "vocab": {chr(0x21 + i): i for i in range(40)}, "merges": []}}
    unigram = {"version": "1.0", "added_tokens": [],
               "post_processor": {"type": "Sequence", "processors": [
                   byte_level, {"type": "BertProcessing", "sep": ["[SEP]", 2], "cls": ["[CLS]", 1]}]},
               "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["a", -1.5], ["b", -2.0]]}}
    seeds["fuzz_export_tokenizer"] = {"bpe": json.dumps(bpe, indent=1).encode(),
                                      "unigram": json.dumps(unigram, indent=1).encode()}
    # fuzz_indexed_dataset_counts: the flags byte, then the fields it spells (its opening comment).
    seeds["fuzz_indexed_dataset_counts"] = {"uint16": b"\x00\x03\x05\x00\x07\x01\x01",
                                            "int32": b"\x01\x02\x04\x04\x02",
                                            "raw_index": b"\x82\x02\x02\x03\x04\x02\x01\x03"}
    for harness, files in seeds.items():
        d = out / harness
        d.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (d / name).write_bytes(data)
    # fuzz_checkpoint_files writes its own seeds with the real checkpoint writer; the same bundles
    # seed fuzz_resume_checkpoint.
    harness = out.parent / "tools" / "fuzz" / "fuzz_checkpoint_files"
    if harness.exists():
        for name in ("fuzz_checkpoint_files", "fuzz_resume_checkpoint"):
            subprocess.run([str(harness)], check=True, capture_output=True,
                           env=dict(os.environ, UPIPE_FUZZ_WRITE_SEEDS=str(out / name)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build-fuzz/corpus")
