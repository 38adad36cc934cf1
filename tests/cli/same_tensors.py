#!/usr/bin/env python3
"""same_tensors.py A B: exit 0 when two safetensors files hold the same tensors bitwise (names,
dtypes, shapes, data) and the same __metadata__ except the keys given with --ignore KEY."""
import json
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    return header, meta, data[8 + n :]


args = sys.argv[1:]
ignore = set()
while "--ignore" in args:
    i = args.index("--ignore")
    ignore.add(args[i + 1])
    del args[i : i + 2]
(ha, ma, da), (hb, mb, db) = load(args[0]), load(args[1])
for k in ignore:
    ma.pop(k, None)
    mb.pop(k, None)
if ha != hb or ma != mb or da != db:
    print(f"{args[0]} and {args[1]} differ:", "header" if ha != hb else "",
          "metadata" if ma != mb else "", "data" if da != db else "")
    sys.exit(1)
