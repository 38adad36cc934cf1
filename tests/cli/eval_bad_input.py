#!/usr/bin/env python3
"""`upipe eval`'s (and `upipe bench model`'s) bad inputs under mpirun: each case ends every rank with exit status 2 and
exactly one line "upipe: error: ..." (rank 0's) naming the file, tensor or field to fix — never a
crash, a hang or a loss. The bad models and token files are built in a temporary directory from
the committed fixture tests/fixtures/hf/llama (Debian's python3, standard library only).

Usage: eval_bad_input.py UPIPE_BINARY MPIRUN [MPIRUN ARGS...]   (NP=2 ranks unless set)
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "hf", "llama")


def read_safetensors(path):
    """(header dict, data bytes) of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_safetensors(path, header, data):
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def npy(path, descr, values):
    """A 1-D .npy (format 1.0) of `values` packed with the struct code matching `descr`."""
    code = {"<i4": "i", "<i8": "q", "<u2": "H", "<f4": "f"}[descr]
    head = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (descr, len(values))
    head += " " * (63 - (10 + len(head)) % 64) + "\n"  # pad so the data starts at a multiple of 64
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode())
        f.write(struct.pack("<%d%s" % (len(values), code), *values))


def model_dir(root, name, config=None, weights=True):
    """A copy of the llama fixture's config (edited by `config`) and, with `weights`, its weights."""
    d = os.path.join(root, name)
    os.makedirs(d)
    with open(os.path.join(FIXTURE, "config.json")) as f:
        cfg = json.load(f)
    if config:
        config(cfg)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    if weights:
        shutil.copy(os.path.join(FIXTURE, "model.safetensors"), d)
    return d


def prepend_to_config(d, fields):
    """`fields` ('"k": v, ') written in front of d/config.json's first key, as a hand edit would."""
    path = os.path.join(d, "config.json")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace("{", "{" + fields, 1))


def build(root):
    """The cases: (expected text of the error line, or None where the command must succeed,
    upipe arguments)."""
    tokens = os.path.join(FIXTURE, "tokens.npy")
    header, data = read_safetensors(os.path.join(FIXTURE, "model.safetensors"))
    cases = []

    def case(text, *args):
        cases.append((text, list(args)))

    def weights_case(name, text, edit=None, raw=None):
        d = model_dir(root, name, weights=False)
        st = os.path.join(d, "model.safetensors")
        if raw is not None:
            with open(st, "wb") as f:
                f.write(raw)
        else:
            h = json.loads(json.dumps(header))
            edited = edit(h)  # the data section too, when it returns one
            write_safetensors(st, h, edited if isinstance(edited, bytes) else data)
        case(text, "eval", "--model", d, "--tokens", tokens, "--method", "ulysses")

    # A directory with weights but no config.json.
    d = os.path.join(root, "no_config")
    os.makedirs(d)
    shutil.copy(os.path.join(FIXTURE, "model.safetensors"), d)
    case("no_config: directory holds no config.json", "eval", "--model", d, "--seq-len", "8")
    # config.json problems: unknown model_type, missing field, invalid JSON.
    d = model_dir(root, "gpt2", lambda c: c.update(model_type="gpt2"))
    case("field 'model_type' = \"gpt2\" is not supported", "eval", "--model", d, "--seq-len", "8")
    d = model_dir(root, "no_hidden", lambda c: c.pop("hidden_size"))
    case("no_hidden/config.json: field 'hidden_size' is missing", "eval", "--model", d, "--seq-len", "8")
    d = model_dir(root, "bad_json", weights=False)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"model_type": "llama",')
    case("bad_json/config.json: not valid JSON", "eval", "--model", d, "--seq-len", "8")
    # A number no double holds (an internal error, exit 1, before it was refused as the file's).
    d = model_dir(root, "huge_number", weights=False)
    prepend_to_config(d, '"initializer_range": 1e999, ')
    case("huge_number/config.json: not valid JSON", "eval", "--model", d, "--seq-len", "8")
    # A value nested 200000 deep (a segfault, exit 139, no error line: quoting it recursed).
    d = model_dir(root, "deep_json", weights=False)
    prepend_to_config(d, '"x": ' + "[" * 200000 + "]" * 200000 + ", ")
    case("deep_json/config.json: nested more than 64 deep", "eval", "--model", d, "--seq-len", "8")
    # ... in a tensor's shape of a safetensors header.
    deep = json.loads(json.dumps(header))
    deep["model.norm.weight"]["shape"] = "@"
    text = json.dumps(deep).replace('"@"', "[" * 200000 + "]" * 200000).encode()
    weights_case("deep_shape", "deep_shape/model.safetensors header: nested more than 64 deep",
                 raw=struct.pack("<Q", len(text)) + text + data)
    # Corrupt or truncated safetensors.
    full = open(os.path.join(FIXTURE, "model.safetensors"), "rb").read()
    weights_case("truncated", "truncated/model.safetensors", raw=full[:len(full) - 1000])
    weights_case("short_header", "short_header/model.safetensors", raw=full[:5])
    weights_case("header_len", "header_len/model.safetensors", raw=struct.pack("<Q", 1 << 40) + full[8:])
    hlen = struct.unpack("<Q", full[:8])[0]
    weights_case("header_json", "header_json/model.safetensors",
                 raw=full[:8] + b"{" * 16 + full[8 + 16:])
    weights_case("header_garbage", "header_garbage/model.safetensors",
                 raw=full[:8] + bytes(hlen) + full[8 + hlen:])
    # Tensors: wrong shape (same bytes), missing, overlapping offsets, unknown dtype.
    gate = "model.layers.0.mlp.gate_proj.weight"
    weights_case("wrong_shape", gate, lambda h: h[gate].update(shape=[64, 160]))
    def drop(h, name):  # the tensor and its bytes, the later tensors moved down
        b, e = h.pop(name)["data_offsets"]
        for k, v in h.items():
            if k != "__metadata__" and v["data_offsets"][0] >= e:
                v["data_offsets"] = [v["data_offsets"][0] - (e - b), v["data_offsets"][1] - (e - b)]
        return data[:b] + data[e:]

    def elsewhere(h, name):  # the tensor pointed at bytes appended after the data, its own left
        b, e = h[name]["data_offsets"]
        h[name]["data_offsets"] = [len(data), len(data) + e - b]
        return data + bytes(e - b)

    weights_case("missing", "model.norm.weight", lambda h: drop(h, "model.norm.weight"))
    weights_case("elsewhere", "of the data section belong to no tensor",
                 lambda h: elsewhere(h, "model.norm.weight"))
    weights_case("offsets", gate, lambda h: h[gate].update(
        data_offsets=[h[gate]["data_offsets"][0], h[gate]["data_offsets"][1] + 4]))
    weights_case("dtype", gate, lambda h: h[gate].update(dtype="Q7"))
    # The (tied) fixture's file with an lm_head.weight added: other values than the embedding are
    # another model (transformers unties it), refused; the same values (some tools save both) are
    # the tied model and load.
    def with_head(h, flip):
        eb, ee = h["model.embed_tokens.weight"]["data_offsets"]
        head = bytearray(data[eb:ee])
        if flip:
            head[1] ^= 0x40  # the first element's value, in its high bytes
        h["lm_head.weight"] = dict(h["model.embed_tokens.weight"], data_offsets=[len(data), len(data) + ee - eb])
        return data + bytes(head)

    weights_case("tied_other_head", "tied_other_head: config.json ties the output head "
                 "to the embedding (tie_word_embeddings), but the file also holds an lm_head.weight that "
                 "differs from model.embed_tokens.weight (element 0:", lambda h: with_head(h, True))
    weights_case("tied_same_head", None, lambda h: with_head(h, False))
    # A model folder with a file named like a checkpoint step is no checkpoint directory: loads.
    d = model_dir(root, "step_named_file")
    with open(os.path.join(d, "step_1"), "w") as f:
        f.write("notes\n")
    case(None, "eval", "--model", d, "--tokens", tokens, "--method", "ulysses")
    # The config disagrees with the checkpoint: the tensors have the wrong shapes for it.
    d = model_dir(root, "wider", lambda c: c.update(intermediate_size=192))
    case("tensor 'model.layers.0.mlp.gate_proj.weight': has shape [160, 64], expected [192, 64]", "eval",
         "--model", d, "--tokens", tokens, "--method", "ulysses")
    # Token files: an id outside the vocabulary (256), the wrong dtype, 2-D, not .npy.
    npy(os.path.join(root, "big.npy"), "<i4", [1, 2, 256, 3])
    case("token 256 at index 2 is outside the vocabulary [0, 256)", "eval", "--model", FIXTURE,
         "--tokens", os.path.join(root, "big.npy"))
    npy(os.path.join(root, "neg.npy"), "<i8", [1, -1, 3])
    case("token -1 at index 1 is outside the vocabulary", "eval", "--model", FIXTURE, "--tokens",
         os.path.join(root, "neg.npy"))
    npy(os.path.join(root, "float.npy"), "<f4", [1.0, 2.0, 3.0])
    case("float.npy", "eval", "--model", FIXTURE, "--tokens", os.path.join(root, "float.npy"))
    with open(os.path.join(root, "text.npy"), "w") as f:
        f.write("1 2 3 4\n")
    case("text.npy is neither a .npy file", "eval", "--model", FIXTURE, "--tokens", os.path.join(root, "text.npy"))
    # S not allowed by the method: the sequence does not split over the ranks, the heads do not.
    case("seq-len (9)", "eval", "--model", FIXTURE, "--tokens", tokens, "--seq-len", "9", "--method", "ulysses")
    case("seq-len (10)", "eval", "--model", FIXTURE, "--tokens", tokens, "--seq-len", "10", "--method", "ring")
    d = model_dir(root, "heads3", lambda c: c.update(num_attention_heads=3, num_key_value_heads=1,
                                                     hidden_size=48), weights=False)
    case("num_attention_heads of $TMP/heads3/config.json (3) must be divisible by the number of ranks "
         "in the all-to-all group (2)", "eval", "--model", d, "--seq-len", "16", "--method", "ulysses",
         "--random-weights")
    case("--stage-heads 3 must be a multiple", "eval", "--model", FIXTURE, "--tokens", tokens, "--method",
         "upipe", "--stage-heads", "3")
    case("--chunks", "eval", "--model", FIXTURE, "--tokens", tokens, "--method", "fpdt", "--chunks", "7")
    case("--residual-dtype bf16 needs --dtype bf16", "eval", "--model", FIXTURE, "--tokens", tokens,
         "--residual-dtype", "bf16")
    case("--residual-dtype: 'fp16' is unknown; choose fp32 or bf16", "eval", "--model", FIXTURE, "--tokens",
         tokens, "--residual-dtype", "fp16")
    case("--recompute: 'op' is unknown; choose layer, block or none", "eval", "--model", FIXTURE, "--tokens",
         tokens, "--recompute", "op")
    case("--checkpoint-granularity: 'op' is unknown", "eval", "--model", FIXTURE, "--tokens", tokens,
         "--checkpoint-granularity", "op")
    # Untrusted model directories: no weights (or a dangling symlink for them, as a Hugging Face
    # cache with a missing blob has) is an error unless random weights are asked for; shard names
    # of an index stay inside the directory; a FIFO is refused, never opened in a way that blocks;
    # a key given twice in config.json or a safetensors header is an error.
    d = model_dir(root, "no_weights", weights=False)
    case("no_weights holds no weights", "eval", "--model", d, "--seq-len", "8")
    # PyTorch pickles are never read: the message says so and how to convert them.
    d = model_dir(root, "torch_bin", weights=False)
    open(os.path.join(d, "pytorch_model.bin"), "wb").write(b"PK\x03\x04")
    case("holds PyTorch weights (pytorch_model.bin), which upipe does not read", "eval", "--model", d,
         "--seq-len", "8")
    case("holds PyTorch weights (pytorch_model.bin), which upipe does not read", "train", "--model", d,
         "--init-from", d, "--steps", "1", "--seq-len", "8")
    d = model_dir(root, "dangling", weights=False)
    os.symlink(os.path.join(root, "blobs", "missing"), os.path.join(d, "model.safetensors"))
    case("model.safetensors is a dangling symlink", "eval", "--model", d, "--seq-len", "8")
    shutil.copy(os.path.join(FIXTURE, "model.safetensors"), os.path.join(root, "outside.safetensors"))
    for name, shard in (("escape", "../outside.safetensors"),
                        ("absolute", os.path.join(root, "outside.safetensors"))):
        d = model_dir(root, name, weights=False)
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {t: shard for t in header if t != "__metadata__"}}, f)
        case("is not a relative name inside", "eval", "--model", d, "--tokens", tokens, "--method", "ulysses")
    d = model_dir(root, "fifo_shard", weights=False)
    os.mkfifo(os.path.join(d, "model-00001-of-00001.safetensors"))
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {t: "model-00001-of-00001.safetensors" for t in header
                                  if t != "__metadata__"}}, f)
    case("is a FIFO, not a regular file", "eval", "--model", d, "--tokens", tokens, "--method", "ulysses")
    d = model_dir(root, "fifo_config", weights=False)
    os.remove(os.path.join(d, "config.json"))
    os.mkfifo(os.path.join(d, "config.json"))
    case("fifo_config: directory holds no config.json", "eval", "--model", d, "--seq-len", "8")
    os.mkfifo(os.path.join(root, "fifo_config.json"))
    case("fifo_config.json is a FIFO, not a regular file", "eval", "--model",
         os.path.join(root, "fifo_config.json"), "--seq-len", "8")
    d = model_dir(root, "dup_config", weights=False)
    prepend_to_config(d, '"hidden_size": 32, ')
    case("duplicate key 'hidden_size'", "eval", "--model", d, "--seq-len", "8")
    d = model_dir(root, "dup_header", weights=False)
    text = json.dumps(header).replace('{', '{"%s": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, ' % gate, 1)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode() + data)
    case("duplicate key '%s'" % gate, "eval", "--model", d, "--tokens", tokens, "--method", "ulysses")
    with open(tokens, "rb") as f:
        raw = bytearray(f.read())
    raw[6] = 4  # format version 4.0: not one NumPy writes
    with open(os.path.join(root, "v4.npy"), "wb") as f:
        f.write(raw)
    case(".npy format version 4.0 is not supported", "eval", "--model", FIXTURE, "--tokens",
         os.path.join(root, "v4.npy"))
    # --save-grads never replaces a FIFO, a device or a symlink (checked before any work).
    os.mkfifo(os.path.join(root, "grads.fifo"))
    case("refusing to write gradients file", "eval", "--model", FIXTURE, "--tokens", tokens,
         "--save-grads", os.path.join(root, "grads.fifo"))
    os.symlink(os.path.join(root, "victim"), os.path.join(root, "grads.link"))
    case("it is a symlink", "eval", "--model", FIXTURE, "--tokens", tokens, "--save-grads",
         os.path.join(root, "grads.link"))
    case("it is a character device", "eval", "--model", FIXTURE, "--tokens", tokens,
         "--save-grads", "/dev/null")
    # `upipe bench model` shares eval's model loading and checks.
    case("seq-len (9)", "bench", "model", "--model", FIXTURE, "--seq-len", "9", "--method", "ulysses")
    case("--seq-len", "bench", "model", "--model", "tiny", "--seq-len", "1")
    case("--iters", "bench", "model", "--model", "tiny", "--iters", "0")
    case("field 'model_type' = \"gpt2\"", "bench", "model", "--model", os.path.join(root, "gpt2"), "--seq-len", "8")
    case("no_weights holds no weights", "bench", "model", "--model", os.path.join(root, "no_weights"),
         "--seq-len", "8")
    case("tensor 'model.layers.0.mlp.gate_proj.weight': has shape [64, 160]", "bench", "model", "--model",
         os.path.join(root, "wrong_shape"), "--seq-len", "16", "--method", "ulysses")
    return cases


def main():
    upipe, mpirun = sys.argv[1], sys.argv[2:]
    np_ = os.environ.get("NP", "2")
    failures = 0
    with tempfile.TemporaryDirectory(prefix="upipe_eval_bad_") as root:
        for text, args in build(root):
            text = text and text.replace("$TMP", root)
            shown = "upipe " + " ".join(a.replace(root + "/", "$TMP/") for a in args)
            try:
                p = subprocess.run(mpirun + ["-np", np_, upipe] + args, capture_output=True, text=True,
                                   timeout=120)
                out, rc = p.stdout + p.stderr, p.returncode
            except subprocess.TimeoutExpired:
                out, rc = "(timed out after 120 s)", 124
            lines = [l for l in out.splitlines() if l.startswith("upipe: error: ")]
            if text is None:  # a file that must load
                if rc != 0:
                    failures += 1
                    print("FAIL: %s -> exit %d, want 0:" % (shown, rc))
                    print("\n".join(out.splitlines()[:20]))
                else:
                    print("ok: %s -> exit 0" % shown)
                continue
            if rc != 2 or len(lines) != 1 or text not in lines[0]:
                failures += 1
                print("FAIL: %s -> exit %d, %d error line(s); want exit 2, one line with '%s':" %
                      (shown, rc, len(lines), text))
                print("\n".join(out.splitlines()[:20]))
            else:
                print("ok: %s -> %s" % (shown, lines[0].replace(root + "/", "$TMP/")))
    if failures:
        print("%d case(s) failed" % failures)
        return 1
    print("all cases exit 2 with one error line")
    return 0


if __name__ == "__main__":
    sys.exit(main())
