// Megatron-LM's indexed datasets (megatron/core/datasets/indexed_dataset.py, the files its
// tools/preprocess_data.py writes): PREFIX.bin holds the token ids of every sequence back to back,
// no header; PREFIX.idx says how to cut them:
//   b"MMIDIDX\x00\x00", uint64 version 1, uint8 dtype code (4 int32, 5 int64, 8 uint16; the other
//   codes are refused), uint64 sequence count n, uint64 document count m (the entries of the
//   document index, one more than the documents), int32 sequence lengths[n], int64 sequence byte
//   pointers[n] (into the .bin), int64 document index[m] (the first sequence of each document,
//   starting at 0 and ending at n), optionally int8 sequence modes[n] (multimodal; ignored).
// The ids of a document are its sequences' ids in order (one sequence per document unless the
// corpus was split into sentences). Every size is checked against the file's size before anything
// is allocated; pointers must be contiguous (as preprocess_data.py writes them).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/safe_fs.h"
#include "model/tokens.h"

namespace upipe {

inline constexpr char kMegatronIdxMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};

// One dataset: its .bin as a token file (TokenFormat::kRaw) and the token offset of every
// document's start inside it, plus the end (documents() + 1 entries, ascending; documents of no
// tokens are dropped).
struct IndexedDataset {
  TokenFileInfo bin;
  std::vector<int64_t> doc_starts;
  int64_t documents() const { return int64_t(doc_starts.size()) - 1; }
};

// Reads PREFIX.idx and checks PREFIX.bin against it; ConfigError naming the file for anything
// malformed (magic, version, dtype, sizes, a document index that is not ascending from 0 to n,
// pointers that are not contiguous, a .bin shorter than the index says).
IndexedDataset read_indexed_dataset(const std::string& prefix);

// Whether `path` is a Megatron dataset's .bin (a .bin with its .idx beside it): it has no llm.c
// header, and a token-file reader that refuses it says how it is read instead.
bool is_megatron_bin(const std::string& path);

// The dataset prefixes a path names: "P.idx" or "P.bin" or "P" itself -> P; a directory -> every
// *.idx in it, sorted by name (their prefixes). ConfigError when none is found, naming the
// setting `key` the path came from.
std::vector<std::string> indexed_dataset_prefixes(const std::string& path,
                                                  std::string_view key = "data.path");

// Writes PREFIX.bin and PREFIX.idx (uint16 ids, one sequence per document), each atomically at
// commit(): documents are streamed into the .bin as they are added. ConfigError when an id does
// not fit in uint16 or a document has 2^31 ids or more, Error when a write fails.
class IndexedDatasetWriter {
 public:
  explicit IndexedDatasetWriter(const std::string& prefix);
  // Appends ids to the current document; end_document() closes it.
  void add(std::span<const int32_t> ids);
  void end_document();
  void commit();
  int64_t documents() const { return int64_t(lengths_.size()); }
  int64_t tokens() const { return bytes_ / 2; }

 private:
  std::string prefix_;
  AtomicFile bin_;
  std::vector<int32_t> lengths_;
  int64_t bytes_ = 0, current_ = 0;
};

}  // namespace upipe
