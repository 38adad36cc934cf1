// libFuzzer harness: a Megatron indexed dataset (read_indexed_dataset), structure-aware: the input
// spells the .idx field by field and the harness lays it out, so every input gets past the magic
// and the sizes to the reader's checks of the counts and offsets. Byte 0 picks the dtype code
// (int32, int64, uint16, or one the reader refuses) and which fields come from the input rather
// than being made consistent (version, sequence modes, the .bin's size, pointers, the document
// index); then the sequence count, each sequence's length (a signed byte), pointer offsets, the
// document entries. The .bin holds the ids the lengths say (plus or minus the input's delta).
// What reads keeps the contract fuzz_indexed_dataset checks. Seeds: tools/fuzz/seeds.py.
#include <algorithm>
#include <cstring>
#include <vector>

#include "fuzz_common.h"
#include "train/indexed_dataset.h"

using namespace upipe;

namespace {

// The input as a stream of bytes, zeros past its end.
struct Bytes {
  const uint8_t* p;
  size_t n, at = 0;
  uint8_t next() { return at < n ? p[at++] : 0; }
};

template <class T>
void append(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Bytes in{data + 1, size - 1};
  const uint8_t flags = data[0];
  const uint8_t codes[] = {8, 4, 5, 8, 1, 6, 8, 4};
  const uint8_t code = codes[flags & 7];
  const int width = code == 8 ? 2 : code == 4 ? 4 : code == 5 ? 8 : 1;
  const uint64_t version = (flags & 8) ? in.next() : 1;
  const bool modes = flags & 16;
  const int bin_delta = (flags & 32) ? int8_t(in.next()) : 0;
  const uint64_t n = in.next() % 33;
  std::vector<int32_t> lengths(n);
  for (int32_t& l : lengths) l = int8_t(in.next());
  std::vector<int64_t> pointers(n);
  int64_t at = 0, total = 0;
  for (size_t i = 0; i < n; ++i) {
    pointers[i] = at + ((flags & 64) ? int8_t(in.next()) : 0);
    at += int64_t(std::max(lengths[i], 0)) * width;
    total += std::max(lengths[i], 0);
  }
  // The document index: ascending from 0 to n by the input's steps, or the input's values.
  std::vector<int64_t> doc_index{0};
  if (flags & 128) {
    for (uint64_t k = in.next() % 35; k > 0; --k)
      doc_index.push_back(int64_t(in.next() % (n + 3)) - 1);
  } else {
    for (uint64_t d = 0; d < n && doc_index.size() < 2 * n + 2;)  // steps of 0: empty documents
      doc_index.push_back(int64_t(d = std::min(n, d + in.next() % 3)));
    if (doc_index.back() != int64_t(n)) doc_index.push_back(int64_t(n));
  }
  std::string idx(kMegatronIdxMagic, 9);
  append(idx, version);
  append(idx, code);
  append(idx, n);
  append(idx, uint64_t(doc_index.size()));
  for (int32_t l : lengths) append(idx, l);
  for (int64_t p : pointers) append(idx, p);
  for (int64_t d : doc_index) append(idx, d);
  if (modes) idx.append(n, '\0');
  std::string bin(size_t(std::max<int64_t>(0, total * width + bin_delta)), '\0');
  for (size_t i = 0; i < bin.size(); ++i) bin[i] = char(in.next());
  fuzz::write_file("d.idx", idx);
  fuzz::write_file("d.bin", bin);
  fuzz::refused_or_read([&] {
    const IndexedDataset ds = read_indexed_dataset((fuzz::scratch() / "d").string());
    fuzz::require(ds.documents() >= 0 && ds.doc_starts.front() == 0, "no start at 0");
    for (size_t i = 1; i < ds.doc_starts.size(); ++i)
      fuzz::require(ds.doc_starts[i - 1] < ds.doc_starts[i], "documents not ascending");
    fuzz::require(ds.doc_starts.back() == ds.bin.count, "documents other than the .bin's ids");
    fuzz::require(ds.bin.data_offset + ds.bin.count * ds.bin.width == int64_t(bin.size()),
                  "ids other than the .bin's");
    std::vector<int32_t> v(size_t(ds.bin.count));
    read_token_range(ds.bin, 0, ds.bin.count, int64_t(1) << 20, v.data());
  });
  return 0;
}
