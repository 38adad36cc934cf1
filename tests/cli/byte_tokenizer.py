"""Checks, with the standard library alone, that DIR/tokenizer.json is the byte tokenizer of
`upipe tokenize`: 256 ids, id b spelled by GPT-2's byte-to-unicode character of byte b, no
merges, ByteLevel pre-tokenizer and decoder without regex splitting or a prefix space (what
transformers needs to map any UTF-8 text to its bytes); tokenizer_config.json names the fast
tokenizer class. Then encodes a UTF-8 sample the way that tokenizer does and compares with its
bytes. Usage: byte_tokenizer.py DIR"""
import json
import os
import sys


def byte_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


d = sys.argv[1]
with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
    t = json.load(f)
with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
    c = json.load(f)
if c.get("tokenizer_class") != "PreTrainedTokenizerFast":
    fail("tokenizer_class is %r" % c.get("tokenizer_class"))
m = t["model"]
if m["type"] != "BPE" or m["merges"] != [] or len(m["vocab"]) != 256:
    fail("not a 256-entry BPE without merges")
alpha = byte_alphabet()
for b in range(256):
    if m["vocab"].get(alpha[b]) != b:
        fail("byte %d is not id %d" % (b, b))
for part in ("pre_tokenizer", "decoder"):
    p = t[part]
    if p["type"] != "ByteLevel" or p["use_regex"] or p["add_prefix_space"]:
        fail("%s is %r" % (part, p))
sample = "héllo wörld\n\t ~! 東京 \x00\xff"
ids = [m["vocab"][alpha[b]] for b in sample.encode("utf-8")]
if ids != list(sample.encode("utf-8")):
    fail("the sample does not encode to its bytes")
print("byte tokenizer OK: 256 ids, the sample encodes to its %d bytes" % len(ids))
