// libFuzzer harness: a Megatron indexed dataset (read_indexed_dataset on PREFIX.idx + PREFIX.bin).
// The input is a 2-byte little-endian length L, then L bytes of .idx, then the .bin (L clamped
// to what there is). What reads keeps the reader's contract: documents ascending from 0 inside
// the .bin, every id readable. Seeds: tests/fixtures/megatron/{split,uint16} in that framing
// (tools/fuzz/seeds.py).
#include <vector>

#include "fuzz_common.h"
#include "train/indexed_dataset.h"

using namespace upipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t idx_len = std::min(size_t(data[0] | (data[1] << 8)), size - 2);
  const std::string_view idx = fuzz::as_text(data + 2, idx_len);
  const std::string_view bin = fuzz::as_text(data + 2 + idx_len, size - 2 - idx_len);
  fuzz::write_file("d.idx", idx);
  fuzz::write_file("d.bin", bin);
  fuzz::refused_or_read([&] {
    const IndexedDataset ds = read_indexed_dataset((fuzz::scratch() / "d").string());
    fuzz::require(ds.documents() >= 0 && ds.doc_starts.front() == 0, "no start at 0");
    for (size_t i = 1; i < ds.doc_starts.size(); ++i)
      fuzz::require(ds.doc_starts[i - 1] < ds.doc_starts[i], "documents not ascending");
    fuzz::require(ds.doc_starts.back() <= ds.bin.count, "documents past the .bin");
    fuzz::require(ds.bin.data_offset + ds.bin.count * ds.bin.width <= int64_t(bin.size()),
                  "ids past the end of the .bin");
    std::vector<int32_t> v(size_t(ds.bin.count));
    read_token_range(ds.bin, 0, ds.bin.count, int64_t(1) << 20, v.data());
  });
  return 0;
}
