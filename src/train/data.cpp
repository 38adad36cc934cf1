#include "train/data.h"

#include <fmt/format.h>
#include <glob.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <memory>

#include "core/check.h"
#include "core/checked.h"
#include "core/errors.h"
#include "core/fault_inject.h"
#include "core/rng.h"
#include "core/setting_ref.h"
#include "train/indexed_dataset.h"

namespace upipe {
namespace {

// Keeps the data's random streams apart from the weights' (which use the same train.seed).
constexpr uint64_t kDataSalt = 0x6a09e667f3bcc909ull;
// Ids per chunk of the vocabulary scan.
constexpr int64_t kScanChunk = int64_t(1) << 16;

uint64_t sequence_seed(uint64_t seed, int64_t index) {
  return splitmix64(splitmix64(seed ^ kDataSalt) + uint64_t(index));
}

int32_t uniform_id(uint64_t s, int64_t i, int64_t vocab) {
  return int32_t(std::min<int64_t>(int64_t(uniform_at(s, uint64_t(i)) * double(vocab)), vocab - 1));
}

bool is_token_file(const std::filesystem::path& p) {
  return p.extension() == ".npy" || p.extension() == ".bin";
}

}  // namespace

DocumentsMode parse_documents_mode(const std::string& s) {
  DocumentsMode m;
  if (s == "none") return m;
  if (s == "index") {
    m.kind = DocumentsMode::Kind::kIndex;
    return m;
  }
  if (s.rfind("eos:", 0) == 0) {
    const std::string id = s.substr(4);
    int64_t v = -1;
    const auto r = std::from_chars(id.data(), id.data() + id.size(), v);
    if (!id.empty() && r.ec == std::errc() && r.ptr == id.data() + id.size() && v >= 0) {
      m.kind = DocumentsMode::Kind::kEos;
      m.eos = v;
      return m;
    }
  }
  throw ConfigError(fmt::format(
      "{} is unknown; choose \"none\", \"eos:ID\" (documents end after the token id ID) or "
      "\"index\" (a Megatron .idx's documents)",
      setting_value("data.documents", fmt::format("\"{}\"", s))));
}

DataKind parse_data_kind(const std::string& s) {
  if (s == "files") return DataKind::kFiles;
  if (s == "random") return DataKind::kRandom;
  if (s == "copy") return DataKind::kCopy;
  throw ConfigError(
      fmt::format("{} is unknown; choose files, random or copy", setting_value("data.kind", s)));
}

const char* data_kind_name(DataKind k) {
  switch (k) {
    case DataKind::kFiles:
      return "files";
    case DataKind::kRandom:
      return "random";
    case DataKind::kCopy:
      return "copy";
  }
  return "?";
}

std::vector<std::string> expand_token_paths(const std::string& path, std::string_view key) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  if (path.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    const int rc = glob(path.c_str(), GLOB_ERR, nullptr, &g);
    if (rc == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    globfree(&g);
    if (rc != 0 && rc != GLOB_NOMATCH)
      throw ConfigError(fmt::format("{}: cannot expand the glob '{}'", setting_ref(key), path));
    if (out.empty())
      throw ConfigError(fmt::format("{}: '{}' matches no file", setting_ref(key), path));
    std::sort(out.begin(), out.end());
    return out;
  }
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file() && is_token_file(e.path())) out.push_back(e.path().string());
    if (ec)
      throw ConfigError(
          fmt::format("{}: cannot list '{}': {}", setting_ref(key), path, ec.message()));
    if (out.empty())
      throw ConfigError(
          fmt::format("{}: the directory '{}' holds no .npy or .bin file", setting_ref(key), path));
    std::sort(out.begin(), out.end());
    return out;
  }
  if (!fs::exists(path, ec)) {
    // A Megatron prefix (what `upipe tokenize DIR OUT` writes: OUT.bin + OUT.idx) is read with its
    // documents only.
    if (fs::exists(path + ".idx", ec) && fs::exists(path + ".bin", ec))
      throw ConfigError(fmt::format(
          "{}: '{}' names a Megatron dataset ({}.bin + {}.idx), which is read with its documents: "
          "add {}",
          setting_ref(key), path, path, path, setting_value("data.documents", "index")));
    throw ConfigError(fmt::format("{}: '{}' does not exist", setting_ref(key), path));
  }
  return {path};
}

void check_data_options(const DataOptions& o) {
  if (o.seq_len < 2)
    throw ConfigError(
        fmt::format("{} must be >= 2, got {}", setting_ref("train.seq_len"), o.seq_len));
  if (o.vocab < 1)
    throw ConfigError(fmt::format("the vocabulary size must be >= 1, got {}", o.vocab));
  if (o.dp_size < 1 || o.micro_steps < 1)
    throw ConfigError(fmt::format("data: DP size ({}) and train.micro_steps ({}) must be >= 1",
                                  o.dp_size, o.micro_steps));
  if (o.kind == DataKind::kCopy && o.seq_len % 2 != 0)
    throw ConfigError(fmt::format(
        "train.seq_len ({}) must be even for data.kind = \"copy\" (two equal halves); try {}",
        o.seq_len, o.seq_len + 1));
  using DK = DocumentsMode::Kind;
  if (o.documents.kind != DK::kNone && o.kind != DataKind::kFiles)
    throw ConfigError(
        fmt::format("{} needs data.kind = \"files\" (the {} task has one document "
                    "per sequence)",
                    setting_ref("data.documents"), data_kind_name(o.kind)));
  if (o.documents.kind == DK::kEos && o.documents.eos >= o.vocab)
    throw ConfigError(fmt::format("{}: the end-of-text id {} is outside the vocabulary [0, {})",
                                  setting_ref("data.documents"), o.documents.eos, o.vocab));
}

DataSource::DataSource(const DataOptions& o) : opt_(o) {
  check_data_options(o);
  using DK = DocumentsMode::Kind;
  if (o.kind != DataKind::kFiles) return;
  if (o.path.empty())
    throw ConfigError(
        "data.path is required when data.kind = \"files\" (a token file, directory or glob)");
  starts_.push_back(0);
  if (o.documents.kind == DK::kIndex) {
    doc_starts_.push_back(0);
    for (const std::string& prefix : indexed_dataset_prefixes(o.path, o.path_key)) {
      const IndexedDataset ds = read_indexed_dataset(prefix);
      for (size_t d = 1; d < ds.doc_starts.size(); ++d)
        doc_starts_.push_back(starts_.back() + ds.doc_starts[d]);
      files_.push_back(ds.bin);
      starts_.push_back(checked_add(starts_.back(), ds.bin.count, "token count"));
    }
  } else {
    for (const std::string& p : expand_token_paths(o.path, o.path_key)) {
      try {
        files_.push_back(inspect_token_file(p));
      } catch (const ConfigError& e) {
        // A Megatron .bin (beside its .idx) has no llm.c header: say how it is read.
        if (!is_megatron_bin(p)) throw;
        throw ConfigError(fmt::format(
            "{} ({} has a Megatron .idx beside it: read that dataset with {})", e.what(), p,
            setting_value("data.documents", "index")));
      }
      starts_.push_back(checked_add(starts_.back(), files_.back().count, "token count"));
    }
  }
  if (total_tokens() < o.seq_len)
    throw ConfigError(fmt::format(
        "{} '{}' holds {} tokens in {} file(s), fewer than {}; give more data or a shorter {}",
        setting_ref(o.path_key), o.path, total_tokens(), files_.size(),
        setting_value("train.seq_len", o.seq_len), setting_ref("train.seq_len")));
  if (o.check_vocab) {
    std::vector<int32_t> buf(static_cast<size_t>(kScanChunk));
    const std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> h(XXH3_createState(),
                                                                             XXH3_freeState);
    UPIPE_CHECK(h && XXH3_64bits_reset(h.get()) == XXH_OK, "cannot start a hash of the data");
    for (const TokenFileInfo& f : files_)
      for (int64_t b = 0; b < f.count; b += kScanChunk) {
        const int64_t n = std::min(kScanChunk, f.count - b);
        read_token_range(f, b, n, o.vocab, buf.data());
        XXH3_64bits_update(h.get(), buf.data(), size_t(n) * sizeof(int32_t));
        max_id_ = std::max(max_id_, *std::max_element(buf.begin(), buf.begin() + n));
      }
    if (!doc_starts_.empty())
      XXH3_64bits_update(h.get(), doc_starts_.data(), doc_starts_.size() * sizeof(int64_t));
    content_hash_ = XXH3_64bits_digest(h.get());
    fingerprint_ = fmt::format("{} tokens{}, xxh3 {:016x}", total_tokens(),
                               doc_starts_.empty()
                                   ? ""
                                   : fmt::format(", {} documents", doc_starts_.size() - 1),
                               content_hash_);
  }
}

int64_t DataSource::global_index(int64_t step, int micro, int dp_rank) const {
  UPIPE_CHECK(
      step >= 0 && micro >= 0 && micro < opt_.micro_steps && dp_rank >= 0 && dp_rank < opt_.dp_size,
      "step {} micro {} dp_rank {} outside the run's {} micro-steps x {} DP ranks", step, micro,
      dp_rank, opt_.micro_steps, opt_.dp_size);
  const int64_t m = checked_add(checked_mul(step, opt_.micro_steps, "sequence index"), micro);
  return checked_add(checked_mul(m, opt_.dp_size, "sequence index"), dp_rank);
}

std::vector<int32_t> DataSource::sample(int64_t step, int micro, int dp_rank) const {
  fault_point("data");
  return sequence(global_index(step, micro, dp_rank));
}

int64_t DataSource::window_start(int64_t index) const {
  UPIPE_CHECK(opt_.kind == DataKind::kFiles, "window_start is for data.kind = files");
  const int64_t choices = total_tokens() - opt_.seq_len + 1;  // >= 1 (checked at construction)
  const double u = uniform_at(sequence_seed(opt_.seed, index), 0);
  return std::min<int64_t>(int64_t(u * double(choices)), choices - 1);
}

std::vector<int32_t> DataSource::sequence(int64_t index) const {
  const int64_t s = opt_.seq_len;
  std::vector<int32_t> ids(static_cast<size_t>(s));
  const uint64_t seed = sequence_seed(opt_.seed, index);
  switch (opt_.kind) {
    case DataKind::kRandom:
      for (int64_t i = 0; i < s; ++i) ids[size_t(i)] = uniform_id(seed, i, opt_.vocab);
      break;
    case DataKind::kCopy: {
      const int64_t h = s / 2;
      for (int64_t i = 0; i < h; ++i) ids[size_t(i)] = uniform_id(seed, i, opt_.vocab);
      std::copy(ids.begin(), ids.begin() + h, ids.begin() + h);
      break;
    }
    case DataKind::kFiles:
      read_stream(window_start(index), s, ids.data());
      break;
  }
  return ids;
}

std::vector<int64_t> DataSource::window_documents(int64_t begin,
                                                  std::span<const int32_t> ids) const {
  const int64_t s = opt_.seq_len;
  UPIPE_CHECK(int64_t(ids.size()) == s, "{} ids for a window of {}", ids.size(), s);
  std::vector<int64_t> lens;
  int64_t at = 0;  // the current document's first row in the window
  switch (opt_.documents.kind) {
    case DocumentsMode::Kind::kNone:
      return lens;
    case DocumentsMode::Kind::kEos:
      for (int64_t i = 0; i < s; ++i)
        if (ids[size_t(i)] == opt_.documents.eos) {
          lens.push_back(i + 1 - at);
          at = i + 1;
        }
      break;
    case DocumentsMode::Kind::kIndex:
      // Document starts strictly inside the window cut it.
      for (auto it = std::upper_bound(doc_starts_.begin(), doc_starts_.end(), begin);
           it != doc_starts_.end() && *it < begin + s; ++it) {
        lens.push_back(*it - begin - at);
        at = *it - begin;
      }
      break;
  }
  if (at < s) lens.push_back(s - at);
  return lens;
}

std::vector<int64_t> DataSource::sequence_documents(int64_t index,
                                                    std::span<const int32_t> ids) const {
  if (!packed()) return {};
  return window_documents(window_start(index), ids);
}

std::vector<int32_t> DataSource::window(int64_t begin) const {
  UPIPE_CHECK(opt_.kind == DataKind::kFiles && begin >= 0 && begin <= total_tokens() - opt_.seq_len,
              "window at {} of a {}-token stream", begin, total_tokens());
  std::vector<int32_t> ids(static_cast<size_t>(opt_.seq_len));
  read_stream(begin, opt_.seq_len, ids.data());
  return ids;
}

void DataSource::read_stream(int64_t begin, int64_t n, int32_t* out) const {
  // The file holding stream position `begin`: the last start <= begin.
  size_t f = size_t(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin()) - 1;
  while (n > 0) {
    UPIPE_CHECK(f < files_.size(), "stream position {} past the {} tokens", begin, total_tokens());
    const int64_t local = begin - starts_[f];
    const int64_t m = std::min(n, files_[f].count - local);
    if (m > 0) read_token_range(files_[f], local, m, opt_.vocab, out);
    out += m, begin += m, n -= m;
    ++f;
  }
}

bool copy_loss_counts(int64_t p, int64_t seq_len) {
  const auto [b, e] = copy_loss_positions(seq_len);
  return p >= b && p < e;
}

std::pair<int64_t, int64_t> copy_loss_positions(int64_t seq_len) {
  return {seq_len / 2, seq_len - 1};
}

}  // namespace upipe
