#!/usr/bin/env python3
"""Converts a 1-D .npy token file into an llm.c .bin file (standard library only, no numpy), so a
CLI test can check that `upipe eval` gives the same loss on both. Usage: npy_to_bin.py IN.npy OUT.bin

The .bin layout is karpathy/llm.c's: 256 little-endian int32 (magic, version, token count, zeros),
then the ids: uint16 with magic 20240520 version 1 when every id fits, else uint32 with magic
20240801 version 7.
"""
import ast
import struct
import sys

FORMATS = {"<i4": "i", "<i8": "q", "<u2": "H", "<u4": "I"}


def read_npy(path):
    data = open(path, "rb").read()
    assert data[:6] == b"\x93NUMPY", f"{path}: not a .npy file"
    if data[6] == 1:
        (hlen,), start = struct.unpack("<H", data[8:10]), 10
    else:
        (hlen,), start = struct.unpack("<I", data[8:12]), 12
    header = ast.literal_eval(data[start:start + hlen].decode("latin1"))
    assert not header["fortran_order"] and len(header["shape"]) == 1, f"{path}: not 1-D"
    code = FORMATS[header["descr"]]
    n = header["shape"][0]
    return list(struct.unpack_from(f"<{n}{code}", data, start + hlen))


def main():
    ids = read_npy(sys.argv[1])
    narrow = max(ids, default=0) < 65536
    header = [20240520, 1] if narrow else [20240801, 7]
    header += [len(ids)] + [0] * 253
    with open(sys.argv[2], "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(ids)}{'H' if narrow else 'I'}", *ids))


if __name__ == "__main__":
    main()
