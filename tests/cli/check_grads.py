#!/usr/bin/env python3
"""Checks a `upipe eval --save-grads` file against a fixture's transformers fp64 gradients
(standard library only): the same tensor names, shapes and F32 dtype, and for every tensor the
rule of test_model_hf, max|g - g64| / max|g64| within 10x transformers' own fp32 error (with a
floor of 1e-6). Also that the norms upipe printed in its --json output match the file.

Usage: check_grads.py SAVED.safetensors FIXTURE_DIR EVAL_JSON_FILE [packed]
With "packed", against the fixture's packed-documents reference (grads_packed_fp64, and
reference.json "packed").
"""
import array
import json
import math
import struct
import sys


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        code = {"F32": "f", "F64": "d"}[t["dtype"]]
        a, b = t["data_offsets"]
        values = array.array(code)
        values.frombytes(data[a:b])
        out[name] = (t["dtype"], t["shape"], values)
    return out


def main():
    saved_path, fixture, eval_json = sys.argv[1:4]
    packed = sys.argv[4:5] == ["packed"]
    saved = read_safetensors(saved_path)
    ref = read_safetensors(fixture + ("/grads_packed_fp64" if packed else "/grads_fp64") + ".safetensors")
    reference = json.load(open(fixture + "/reference.json"))
    rel = (reference["packed"] if packed else reference)["grad_rel_err"]
    norms = json.loads([l for l in open(eval_json) if l.startswith("{")][-1])["grad_norms"]
    failures = []
    if sorted(saved) != sorted(ref):
        failures.append("names differ: %s" % sorted(set(saved) ^ set(ref)))
    for name in sorted(set(saved) & set(ref)):
        dtype, shape, g = saved[name]
        _, shape64, g64 = ref[name]
        if dtype != "F32" or shape != shape64:
            failures.append("%s: %s %s, want F32 %s" % (name, dtype, shape, shape64))
            continue
        if any(math.isnan(x) or math.isinf(x) for x in g):
            failures.append("%s: not finite" % name)
            continue
        scale = max(abs(x) for x in g64)
        err = max(abs(a - b) for a, b in zip(g, g64)) / scale if scale > 0 else max(abs(x) for x in g)
        bound = 10 * max(rel[name]["max_abs_rel"], 1e-6)
        if not err <= bound:
            failures.append("%s: max rel error %.3g > %.3g" % (name, err, bound))
        norm = math.sqrt(sum(float(x) * x for x in g))
        if not abs(norm - norms[name]) <= 1e-5 * norms[name]:
            failures.append("%s: norm %.9g in the file, %.9g in --json" % (name, norm, norms[name]))
    for f in failures:
        print("FAIL " + f)
    print("%d tensors checked, %d failures" % (len(saved), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
