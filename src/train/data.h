// Training data: the sequences `upipe train` feeds the model. Sequence number g of a run is a
// pure function of (seed, g), and g is fixed by (step, micro-step, DP rank, DP size), so a
// resumed run reads exactly the sequences it would have read, and a DP split of the same global
// batch sees the same sequences (see DataSource::global_index). Kinds:
//   random  uniform ids in [0, V) (benchmarks);
//   copy    a random first half, then the first half repeated (a long-range task whose loss can
//           only fall if attention crosses the rank boundaries);
//   files   token files (.npy, llm.c .bin) concatenated into one stream; each sequence is a
//           window of S tokens at a pseudo-random offset, read without loading the files.
// Packed documents (data.documents, files only): the stream is a run of documents, and a
// sequence's documents are the pieces of them its window holds: whole documents, and the pieces
// of the ones the window's start and end cut, each piece a document of its own (positions from 0,
// its last token predicts nothing). Where documents end:
//   eos:ID  after every id ID (the end-of-text token ends the document it closes), in .npy and
//           llm.c .bin files alike;
//   index   at the documents of Megatron-LM indexed datasets (data.path: PREFIX, PREFIX.idx,
//           PREFIX.bin or a directory of them; train/indexed_dataset.h), concatenated in order.
// The documents of sequence g are a pure function of its window, so resume stays exact.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/tokens.h"

namespace upipe {

enum class DataKind { kFiles, kRandom, kCopy };

// data.documents: "none" (a sequence is one document), "eos:ID" or "index".
struct DocumentsMode {
  enum class Kind { kNone, kEos, kIndex } kind = Kind::kNone;
  int64_t eos = -1;  // kEos: the end-of-text id
};
// ConfigError naming data.documents for anything else.
DocumentsMode parse_documents_mode(const std::string& s);

// "files" | "random" | "copy"; anything else is a ConfigError naming data.kind.
DataKind parse_data_kind(const std::string& s);
const char* data_kind_name(DataKind k);

struct DataOptions {
  DataKind kind = DataKind::kRandom;
  std::string path;  // files: a token file, a directory of .npy/.bin files, or a glob
  std::string path_key = "data.path";  // the setting `path` came from, named in errors
  int64_t seq_len = 0;                 // S, tokens per sequence
  int64_t vocab = 0;                   // V: ids are drawn from / checked against [0, V)
  uint64_t seed = 1;
  int dp_size = 1;      // data-parallel groups (world / CP)
  int micro_steps = 1;  // sequences per DP rank per optimizer step
  DocumentsMode documents;
  // files: read every id once at construction and refuse the data (ConfigError) if one is
  // outside [0, V), so a bad id cannot stop one rank in the middle of a run. Off, an id is
  // checked only when its window is read (a ConfigError thrown by sample()).
  bool check_vocab = true;
};

// What DataSource refuses before it opens a file (sizes, the task's S, the documents mode and its
// end-of-text id against the vocabulary): ConfigError naming the setting.
void check_data_options(const DataOptions& o);

class DataSource {
 public:
  // Validates the options (ConfigError naming data.* / train.* keys); for files, resolves the
  // path, reads the headers and refuses a stream shorter than S tokens.
  explicit DataSource(const DataOptions& o);

  // The S tokens of DP rank `dp_rank`'s micro-step `micro` (0-based) of optimizer step `step`
  // (0-based): sequence(global_index(step, micro, dp_rank)).
  std::vector<int32_t> sample(int64_t step, int micro, int dp_rank) const;

  // (step * micro_steps + micro) * dp_size + dp_rank: step k's global batch is the sequences
  // [k M D, (k + 1) M D), whatever D (DP size) and M (micro-steps) make it up, so DP = 2 with
  // M = 1 reads the same sequences per step as DP = 1 with M = 2.
  int64_t global_index(int64_t step, int micro, int dp_rank) const;

  // Sequence number `index` of the run: S ids, a pure function of (kind, seed, index, files).
  std::vector<int32_t> sequence(int64_t index) const;

  // files: the S ids from stream position `begin` on, in [0, total_tokens() - S].
  std::vector<int32_t> window(int64_t begin) const;

  // files: the first stream position of sequence `index`, in [0, total_tokens() - S].
  int64_t window_start(int64_t index) const;

  // The document lengths (summing to S) of the window of S ids `ids` at stream position `begin`,
  // by data.documents; empty with "none" (one document).
  std::vector<int64_t> window_documents(int64_t begin, std::span<const int32_t> ids) const;
  // The same for sequence `index` (its ids: sequence(index)).
  std::vector<int64_t> sequence_documents(int64_t index, std::span<const int32_t> ids) const;
  bool packed() const { return opt_.documents.kind != DocumentsMode::Kind::kNone; }

  const DataOptions& options() const { return opt_; }
  const std::vector<TokenFileInfo>& files() const { return files_; }
  int64_t total_tokens() const { return starts_.empty() ? 0 : starts_.back(); }  // files

  // files, read whole at construction (check_vocab): what the stream holds, for a resumed run
  // to see that its data is the run's: "N tokens[, D documents], xxh3 HEX", the hash over every
  // id (as int32, in stream order) and, with data.documents = "index", the documents' starts.
  // The same ids in other files (split otherwise, .npy for .bin) give the same text; an id
  // changed, a file added, a stale .idx do not. Checkpoints record it and compare it as text: its
  // wording is a format. "" for random and copy data (a function of the settings) and without
  // check_vocab.
  const std::string& fingerprint() const { return fingerprint_; }
  uint64_t content_hash() const { return content_hash_; }  // the hash in fingerprint(); 0 if none
  // files, read whole at construction (check_vocab): the largest id the stream holds; -1 if none.
  int32_t max_id() const { return max_id_; }

 private:
  // Stream ids [begin, begin + n) into out, across file boundaries.
  void read_stream(int64_t begin, int64_t n, int32_t* out) const;

  DataOptions opt_;
  std::vector<TokenFileInfo> files_;
  std::vector<int64_t> starts_;  // files_.size() + 1 prefix sums of the files' id counts
  std::vector<int64_t>
      doc_starts_;  // index: stream positions of the documents' starts, and the end
  std::string fingerprint_;
  uint64_t content_hash_ = 0;
  int32_t max_id_ = -1;
};

// The files a data.path names, in stream order: the file itself; a directory's *.npy and *.bin
// (not recursive) sorted by name; or a glob's matches sorted by name. None is a ConfigError,
// naming the setting `key` the path came from.
std::vector<std::string> expand_token_paths(const std::string& path,
                                            std::string_view key = "data.path");

// The copy task's scored predictions. The prediction at position p reads tokens [0, p] and is
// labelled with token p + 1. With h = S/2, tokens [h, S) repeat tokens [0, h); the copy loss
// scores predictions whose label is in the second half except its first token (token h): that
// token repeats token 0, but nothing in the sequence marks where the first half ends (RoPE gives
// relative positions only), so no model can know the copy starts there. Scored: p in [h, S - 1),
// h - 1 predictions, each of which a model that attends back h tokens predicts exactly.
bool copy_loss_counts(int64_t p, int64_t seq_len);
std::pair<int64_t, int64_t> copy_loss_positions(int64_t seq_len);  // [h, S - 1)

}  // namespace upipe
