#include "train/tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/errors.h"
#include "core/join.h"
#include "core/safe_fs.h"
#include "model/tokens.h"
#include "train/indexed_dataset.h"

namespace upipe {
namespace {
constexpr int64_t kChunk = int64_t(1) << 16;  // bytes per read

// The UTF-8 encoding of code point c (< 0x800: every character of the byte alphabet).
std::string utf8(int c) {
  if (c < 0x80) return std::string(1, char(c));
  return {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
}

// GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the other 68 bytes
// for the code points from 256 up, in byte order.
std::vector<int> byte_alphabet() {
  std::vector<int> cp(256, -1);
  auto keep = [&](int a, int b) {
    for (int x = a; x <= b; ++x) cp[size_t(x)] = x;
  };
  keep('!', '~');
  keep(0xA1, 0xAC);
  keep(0xAE, 0xFF);
  int next = 256;
  for (int& c : cp)
    if (c < 0) c = next++;
  return cp;
}

}  // namespace

std::string byte_tokenizer_json() {
  using nlohmann::ordered_json;
  const std::vector<int> cp = byte_alphabet();
  ordered_json vocab = ordered_json::object();
  for (int b = 0; b < int(kByteVocab); ++b) vocab[utf8(cp[size_t(b)])] = b;
  const ordered_json byte_level = {{"type", "ByteLevel"},
                                   {"add_prefix_space", false},
                                   {"trim_offsets", false},
                                   {"use_regex", false}};
  const ordered_json j = {{"version", "1.0"},
                          {"truncation", nullptr},
                          {"padding", nullptr},
                          {"added_tokens", ordered_json::array()},
                          {"normalizer", nullptr},
                          {"pre_tokenizer", byte_level},
                          {"post_processor", nullptr},
                          {"decoder", byte_level},
                          {"model",
                           {{"type", "BPE"},
                            {"dropout", nullptr},
                            {"unk_token", nullptr},
                            {"continuing_subword_prefix", nullptr},
                            {"end_of_word_suffix", nullptr},
                            {"fuse_unk", false},
                            {"byte_fallback", false},
                            {"ignore_merges", false},
                            {"vocab", vocab},
                            {"merges", ordered_json::array()}}}};
  return j.dump(1) + "\n";
}

std::string byte_tokenizer_config_json(int64_t max_len) {
  const nlohmann::ordered_json j = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                    {"model_max_length", max_len},
                                    {"clean_up_tokenization_spaces", false}};
  return j.dump(2) + "\n";
}

namespace {

// An output file that exists is someone's (a corpus from another tool, a text named .bin by
// mistake): replaced only when the user says so. (A symlink, FIFO or directory there is refused
// by the writer whatever the user says.)
void check_new_output(const std::string& out, bool replace) {
  std::error_code ec;
  if (!replace && std::filesystem::is_regular_file(std::filesystem::symlink_status(out, ec)))
    throw ConfigError(fmt::format(
        "{} already exists; tokenize does not replace a file it was not told to: choose another "
        "output, remove it, or pass --force to replace it",
        out));
}

}  // namespace

// What a file that is already tokens is ("a NumPy .npy", "an llm.c .bin"), by its magic; "" for
// anything else. Its bytes read as text would be a document of header and id bytes.
std::string token_file_kind(const ReadFile& f) {
  char head[6] = {};
  const int64_t n = std::min<int64_t>(f.size(), sizeof head);
  f.read_at(head, n, 0);
  switch (token_format_by_magic({head, size_t(n)})) {
    case TokenFormat::kNpy:
      return "a NumPy .npy";
    case TokenFormat::kBin:
      return "an llm.c .bin";
    case TokenFormat::kRaw:
      break;
  }
  return "";
}

int64_t tokenize_bytes(const std::string& in, const std::string& out, bool replace) {
  const ReadFile src(in, "text file");
  if (const std::string kind = token_file_kind(src); !kind.empty())
    throw ConfigError(fmt::format(
        "{} is {} token file, not text: it holds token ids already (train reads it as it is: "
        "--data-kind files --data-path {})",
        in, kind, in));
  if (same_file(in, out))
    throw ConfigError(
        fmt::format("the output {} is the input {}: writing it would destroy the "
                    "text; choose another output",
                    out, in));
  check_new_output(out, replace);
  if (src.size() > INT32_MAX)
    throw ConfigError(fmt::format(
        "{} has more than {} bytes, the most one llm.c .bin file counts; split the text", in,
        INT32_MAX));
  AtomicFile dst(out, "token file");
  std::vector<int32_t> header(static_cast<size_t>(kBinHeaderInts), 0);
  header[0] = kBinMagicU16;
  header[1] = kBinVersionU16;
  header[2] = int32_t(src.size());
  dst.write(header.data(), kBinHeaderInts * 4);
  std::vector<char> bytes(static_cast<size_t>(kChunk));
  std::vector<uint16_t> ids(static_cast<size_t>(kChunk));
  for (int64_t at = 0; at < src.size(); at += kChunk) {
    const int64_t n = std::min(kChunk, src.size() - at);
    src.read_at(bytes.data(), n, at);
    for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = static_cast<unsigned char>(bytes[size_t(i)]);
    dst.write(ids.data(), n * 2);
  }
  dst.commit();
  return src.size();
}

std::string left_out(const TokenizedDocuments& r) {
  return join(r.skipped);
}

TokenizedDocuments tokenize_documents(const std::string& dir, const std::string& out,
                                      bool replace) {
  namespace fs = std::filesystem;
  TokenizedDocuments r;
  const fs::path o(out);
  r.prefix = o.extension() == ".bin" || o.extension() == ".idx"
                 ? (o.parent_path() / o.stem()).string()
                 : out;
  // The documents: the directory's regular files (symlinks followed), one level, without hidden
  // files (.gitignore, editor swap files) and token datasets (an earlier tokenize's OUT.bin +
  // OUT.idx); what is left out is counted and said.
  std::vector<std::string> files;
  std::vector<std::string> hidden;
  int64_t dirs = 0, other = 0;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code ignored;
    if (e.is_directory(ignored))
      ++dirs;
    else if (!e.is_regular_file(ignored))
      ++other;
    else if (name.starts_with("."))
      hidden.push_back(name);
    else
      files.push_back(e.path().string());
  }
  if (ec) throw ConfigError(fmt::format("cannot list the directory {}: {}", dir, ec.message()));
  std::sort(files.begin(), files.end());
  std::sort(hidden.begin(), hidden.end());
  // An earlier tokenize's output (an .idx with Megatron's magic, and its .bin): not a document.
  std::vector<std::string> dataset_files;
  int64_t datasets = 0, lone_indexes = 0;
  for (const std::string& f : files) {
    if (fs::path(f).extension() != ".idx") continue;
    char magic[9] = {};
    const ReadFile idx(f, "index file");
    if (idx.size() >= 9) idx.read_at(magic, 9, 0);
    if (std::memcmp(magic, kMegatronIdxMagic, sizeof magic) != 0) continue;
    dataset_files.push_back(f);
    const std::string bin = fs::path(f).replace_extension(".bin").string();
    if (std::find(files.begin(), files.end(), bin) != files.end()) {
      dataset_files.push_back(bin);
      ++datasets;
    } else {
      ++lone_indexes;
    }
  }
  std::erase_if(files, [&](const std::string& f) {
    return std::find(dataset_files.begin(), dataset_files.end(), f) != dataset_files.end();
  });
  // Token files (.npy, llm.c .bin: ids already, not text) and empty files (a document of no
  // tokens, which readers drop): no documents either.
  int64_t token_files = 0, empty = 0;
  std::erase_if(files, [&](const std::string& f) {
    const ReadFile file(f, "text file");
    if (file.size() == 0) return ++empty, true;
    if (!token_file_kind(file).empty()) return ++token_files, true;
    return false;
  });
  if (dirs)
    r.skipped.push_back(fmt::format("{} subdirector{} (one level is read)", dirs,
                                    dirs == 1 ? "y" : "ies"));
  if (!hidden.empty())
    r.skipped.push_back(fmt::format("{} hidden file{} ({}{})", hidden.size(),
                                    hidden.size() == 1 ? "" : "s", hidden.front(),
                                    hidden.size() > 1 ? ", ..." : ""));
  if (datasets)
    r.skipped.push_back(fmt::format("{} token dataset{} (.bin + .idx)", datasets,
                                    datasets == 1 ? "" : "s"));
  if (lone_indexes)
    r.skipped.push_back(fmt::format("{} Megatron .idx without its .bin", lone_indexes));
  if (token_files)
    r.skipped.push_back(fmt::format("{} token file{} (.npy, llm.c .bin: ids already)", token_files,
                                    token_files == 1 ? "" : "s"));
  if (empty) r.skipped.push_back(fmt::format("{} empty file{}", empty, empty == 1 ? "" : "s"));
  if (other)
    r.skipped.push_back(fmt::format("{} entr{} that {} not a regular file", other,
                                    other == 1 ? "y" : "ies", other == 1 ? "is" : "are"));
  if (files.empty())
    throw ConfigError(fmt::format("the directory {} holds no file to read as a document{}", dir,
                                  r.skipped.empty() ? "" : " (left out: " + left_out(r) + ")"));
  for (const std::string& f : files)
    for (const char* ext : {".bin", ".idx"})
      if (same_file(f, r.prefix + ext))
        throw ConfigError(
            fmt::format("the output {}{} is one of the inputs in {}: choose an output outside it",
                        r.prefix, ext, dir));
  for (const char* ext : {".bin", ".idx"}) check_new_output(r.prefix + ext, replace);
  // A document is one index entry, of fewer than 2^31 ids: said before anything is written (the
  // writer refused it only after 4 GiB of ids, without naming the file).
  for (const std::string& f : files)
    if (const int64_t n = ReadFile(f, "text file").size(); n > INT32_MAX)
      throw ConfigError(fmt::format(
          "{} has {} bytes, more than one document of a Megatron index holds ({} tokens); split "
          "it into several files",
          f, n, INT32_MAX));
  IndexedDatasetWriter w(r.prefix);
  std::vector<char> bytes(static_cast<size_t>(kChunk));
  std::vector<int32_t> ids(static_cast<size_t>(kChunk));
  for (const std::string& f : files) {
    const ReadFile src(f, "text file");
    for (int64_t at = 0; at < src.size(); at += kChunk) {
      const int64_t n = std::min(kChunk, src.size() - at);
      src.read_at(bytes.data(), n, at);
      for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = static_cast<unsigned char>(bytes[size_t(i)]);
      w.add(std::span<const int32_t>(ids.data(), size_t(n)));
    }
    w.end_document();
  }
  w.commit();
  r.documents = w.documents();
  r.tokens = w.tokens();
  return r;
}

}  // namespace upipe
