#!/usr/bin/env python3
"""Generate the Megatron-LM indexed-dataset fixture for upipe's data tests.

Writes tests/fixtures/megatron/{split.bin, split.idx, uint16.bin, uint16.idx, expected.json} with
Megatron-Core's own writer (megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder, the one
tools/preprocess_data.py uses):
    split     int32 ids; documents of several sequences each (preprocess_data.py
              --split-sentences), one empty document, documents of length 1
    uint16    uint16 ids (the dtype preprocess_data.py picks for vocabularies < 65500),
              one sequence per document
expected.json holds, per dataset, every document's ids as Megatron-Core's reader returns them
(IndexedDataset, concatenating a document's sequences), which upipe's reader must reproduce.

Deterministic (fixed seed). Usage (needs numpy, torch and megatron-core; `make test` never runs
it):  python3 tools/make_megatron_fixture.py [--out tests/fixtures/megatron]
"""
import argparse
import json
import os

import numpy as np
import torch
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder


def build(prefix, dtype, documents):
    """documents: list of documents, each a list of sequences (lists of ids)."""
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for doc in documents:
        for seq in doc:
            b.add_item(torch.from_numpy(np.array(seq, dtype=dtype)))
        b.end_document()
    b.finalize(prefix + ".idx")


def read_back(prefix):
    ds = IndexedDataset(prefix)
    di = ds.document_indices
    return [np.concatenate([ds[s] for s in range(di[d], di[d + 1])] or [np.zeros(0, np.int64)])
            .astype(np.int64).tolist() for d in range(len(di) - 1)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                  "tests", "fixtures", "megatron"))
    out = os.path.normpath(ap.parse_args().out)
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(1234)
    split = []
    for i in range(12):
        if i == 5:
            split.append([])  # an empty document
            continue
        n_seq = int(rng.integers(1, 4))
        split.append([rng.integers(0, 50000, int(rng.integers(1, 40))).tolist() for _ in range(n_seq)])
    split.append([[7]])  # length 1
    one = [[rng.integers(0, 256, int(rng.integers(1, 60))).tolist()] for _ in range(20)]
    expected = {}
    for name, dtype, docs in [("split", np.int32, split), ("uint16", np.uint16, one)]:
        prefix = os.path.join(out, name)
        build(prefix, dtype, docs)
        expected[name] = read_back(prefix)
        want = [[t for s in d for t in s] for d in docs]
        assert expected[name] == want, name
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)
        f.write("\n")
    print(f"wrote {out}: " + ", ".join(f"{k} ({len(v)} documents)" for k, v in expected.items()))


if __name__ == "__main__":
    main()
