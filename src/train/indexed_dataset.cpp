#include "train/indexed_dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/checked.h"
#include "core/errors.h"
#include "core/safe_fs.h"
#include "core/setting_ref.h"

namespace upipe {
namespace {

constexpr int64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

struct Header {
  uint64_t version = 0;
  uint8_t dtype = 0;
  uint64_t sequences = 0, doc_entries = 0;
};

// Bytes per id of a Megatron dtype code (0 for the codes token files cannot hold).
int width_of(uint8_t code, bool& is_signed) {
  is_signed = code == 4 || code == 5;
  if (code == 4) return 4;
  if (code == 5) return 8;
  if (code == 8) return 2;
  return 0;
}

Header read_header(const ReadFile& f) {
  const std::string& path = f.path();
  if (f.size() < kHeaderBytes)
    throw ConfigError(
        fmt::format("{}: {} bytes, shorter than a Megatron index header", path, f.size()));
  char buf[kHeaderBytes];
  f.read_at(buf, kHeaderBytes, 0);
  if (std::memcmp(buf, kMegatronIdxMagic, 9) != 0)
    throw ConfigError(fmt::format("{} is not a Megatron index (no MMIDIDX magic)", path));
  Header h;
  std::memcpy(&h.version, buf + 9, 8);
  h.dtype = uint8_t(buf[17]);
  std::memcpy(&h.sequences, buf + 18, 8);
  std::memcpy(&h.doc_entries, buf + 26, 8);
  if (h.version != 1)
    throw ConfigError(
        fmt::format("{}: index version {} is not supported (Megatron writes 1)", path, h.version));
  // Every array must fit in the file: bounds the counts before anything is allocated.
  const uint64_t room = uint64_t(f.size() - kHeaderBytes);
  if (h.sequences > room / 12 || h.doc_entries > (room - 12 * h.sequences) / 8)
    throw ConfigError(
        fmt::format("{}: {} sequences and {} document entries do not fit in its {} bytes", path,
                    h.sequences, h.doc_entries, f.size()));
  const uint64_t need = kHeaderBytes + 12 * h.sequences + 8 * h.doc_entries;
  if (uint64_t(f.size()) != need && uint64_t(f.size()) != need + h.sequences)
    throw ConfigError(fmt::format("{}: {} bytes, the header says {} (or {} with sequence modes)",
                                  path, f.size(), need, need + h.sequences));
  return h;
}

template <class T>
std::vector<T> read_array(const ReadFile& f, uint64_t n, int64_t offset) {
  std::vector<T> v(static_cast<size_t>(n));
  f.read_at(v.data(), int64_t(n * sizeof(T)), offset);
  return v;
}

}  // namespace

bool is_megatron_bin(const std::string& path) {
  std::error_code ec;
  return std::filesystem::path(path).extension() == ".bin" &&
         std::filesystem::exists(std::filesystem::path(path).replace_extension(".idx"), ec);
}

IndexedDataset read_indexed_dataset(const std::string& prefix) {
  const std::string idx = prefix + ".idx", binp = prefix + ".bin";
  const ReadFile f(idx, "Megatron index");
  const Header h = read_header(f);
  IndexedDataset ds;
  bool is_signed = false;
  const int width = width_of(h.dtype, is_signed);
  if (width == 0)
    throw ConfigError(fmt::format(
        "{}: dtype code {} is not a token id type upipe reads (4 int32, 5 int64, 8 uint16)", idx,
        h.dtype));
  const std::vector<int32_t> lengths = read_array<int32_t>(f, h.sequences, kHeaderBytes);
  const std::vector<int64_t> pointers =
      read_array<int64_t>(f, h.sequences, kHeaderBytes + 4 * int64_t(h.sequences));
  const std::vector<int64_t> doc_index =
      read_array<int64_t>(f, h.doc_entries, kHeaderBytes + 12 * int64_t(h.sequences));
  // Token offset of every sequence's start (and the end), checking the pointers on the way.
  std::vector<int64_t> seq_start(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 0)
      throw ConfigError(fmt::format("{}: sequence {} has length {}", idx, i, lengths[i]));
    const int64_t at = checked_mul(seq_start[i], int64_t(width), "token bytes");
    if (pointers[i] != at)
      throw ConfigError(
          fmt::format("{}: sequence {} starts at byte {}, not {}: the sequences are not contiguous",
                      idx, i, pointers[i], at));
    seq_start[i + 1] = checked_add(seq_start[i], int64_t(lengths[i]), "token count");
  }
  if (doc_index.empty() || doc_index.front() != 0 || doc_index.back() != int64_t(h.sequences))
    throw ConfigError(fmt::format("{}: the document index must run from 0 to the {} sequences", idx,
                                  h.sequences));
  for (size_t d = 0; d + 1 < doc_index.size(); ++d) {
    if (doc_index[d + 1] < doc_index[d])
      throw ConfigError(fmt::format("{}: the document index decreases at entry {}", idx, d + 1));
    if (doc_index[d + 1] > int64_t(h.sequences))
      throw ConfigError(fmt::format("{}: document index entry {} is {}, past the {} sequences", idx,
                                    d + 1, doc_index[d + 1], h.sequences));
    const int64_t start = seq_start[size_t(doc_index[d])];
    if (seq_start[size_t(doc_index[d + 1])] > start) ds.doc_starts.push_back(start);  // not empty
  }
  const int64_t total = seq_start.back();
  ds.doc_starts.push_back(total);
  const ReadFile b(binp, "Megatron token data");
  // Exactly: a .bin longer than its index says is one written again beside a stale .idx, whose
  // documents would cut it in the wrong places.
  const int64_t want = checked_mul(total, int64_t(width), "token bytes");
  if (b.size() != want)
    throw ConfigError(fmt::format(
        "{}: {} bytes, but the index {} says {} tokens of {} bytes ({} bytes): the two are not one "
        "dataset (one was written again without the other); make them again together",
        binp, b.size(), idx, total, width, want));
  ds.bin.path = binp;
  ds.bin.format = TokenFormat::kRaw;
  ds.bin.width = width;
  ds.bin.is_signed = is_signed;
  ds.bin.data_offset = 0;
  ds.bin.count = total;
  return ds;
}

std::vector<std::string> indexed_dataset_prefixes(const std::string& path, std::string_view key) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> out;
  if (fs::is_directory(path, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file() && e.path().extension() == ".idx")
        out.push_back((e.path().parent_path() / e.path().stem()).string());
    if (ec)
      throw ConfigError(
          fmt::format("{}: cannot list '{}': {}", setting_ref(key), path, ec.message()));
    if (out.empty())
      throw ConfigError(
          fmt::format("{}: the directory '{}' holds no .idx file", setting_ref(key), path));
    std::sort(out.begin(), out.end());
    return out;
  }
  const fs::path p(path);
  if (p.extension() == ".idx" || p.extension() == ".bin") {
    const std::string prefix = (p.parent_path() / p.stem()).string();
    if (!fs::exists(prefix + ".idx", ec))
      throw ConfigError(fmt::format(
          "{}: '{}' has no Megatron index beside it ({}.idx): with {} every path names a "
          "Megatron dataset (PREFIX.idx + PREFIX.bin, as upipe tokenize DIR writes)",
          setting_ref(key), path, prefix, setting_value("data.documents", "index")));
    return {prefix};
  }
  if (!fs::exists(path + ".idx", ec))
    throw ConfigError(
        fmt::format("{}: '{}' names no Megatron dataset (PREFIX.idx + PREFIX.bin, or a directory)",
                    setting_ref(key), path));
  return {path};
}

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix)
    : prefix_(prefix), bin_(prefix + ".bin", "Megatron token data") {}

void IndexedDatasetWriter::add(std::span<const int32_t> ids) {
  std::vector<uint16_t> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > UINT16_MAX)
      throw ConfigError(fmt::format("{}: id {} does not fit in uint16", prefix_, ids[i]));
    out[i] = uint16_t(ids[i]);
  }
  if (current_ + int64_t(ids.size()) > INT32_MAX)
    throw ConfigError(fmt::format(
        "{}: a document of 2^31 ids or more is longer than an index entry holds", prefix_));
  bin_.write(out.data(), int64_t(out.size() * 2));
  current_ += int64_t(ids.size());
}

void IndexedDatasetWriter::end_document() {
  lengths_.push_back(int32_t(current_));
  bytes_ += current_ * 2;
  current_ = 0;
}

void IndexedDatasetWriter::commit() {
  std::vector<int64_t> pointers, doc_index{0};
  int64_t at = 0;
  for (int32_t l : lengths_) {
    pointers.push_back(at);
    at += int64_t(l) * 2;
    doc_index.push_back(int64_t(pointers.size()));
  }
  AtomicFile idx(prefix_ + ".idx", "Megatron index");
  idx.write(kMegatronIdxMagic, 9);
  const uint64_t version = 1, n = lengths_.size(), m = doc_index.size();
  const uint8_t code = 8;  // uint16
  idx.write(&version, 8);
  idx.write(&code, 1);
  idx.write(&n, 8);
  idx.write(&m, 8);
  idx.write(lengths_.data(), int64_t(n * 4));
  idx.write(pointers.data(), int64_t(n * 8));
  idx.write(doc_index.data(), int64_t(m * 8));
  bin_.commit();
  idx.commit();
}

}  // namespace upipe
