// libFuzzer harness: `upipe tokenize`'s input handling (tokenize_documents on a directory,
// tokenize_bytes on a file). Structure-aware: the input spells a directory, entry by entry (a kind
// byte, a name of up to 31 bytes of any value but '/' and NUL, a content of up to 255 bytes):
// regular and hidden files, empty ones, subdirectories, symbolic links to a file, to a directory
// and dangling, earlier tokenize outputs (a Megatron .idx with or without its .bin); its last byte
// picks the output (beside the directory, inside it, over one of its files, with --force or
// not). What reads is checked against the directory: the dataset holds, in name order, the bytes
// of exactly the regular files that are documents. Seeds: tools/fuzz/seeds.py.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "model/tokens.h"
#include "train/indexed_dataset.h"
#include "train/tokenizer.h"

using namespace upipe;
namespace fs = std::filesystem;

namespace {

void put(const fs::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// Reads `n` bytes of the input (fewer at its end).
std::string_view take(std::string_view& in, size_t n) {
  const std::string_view s = in.substr(0, std::min(n, in.size()));
  in.remove_prefix(s.size());
  return s;
}

std::string name_of(std::string_view raw) {
  std::string n;
  for (const char c : raw) n += c == '/' || c == '\0' ? '_' : c;
  if (n.empty() || n == "." || n == "..") n = "f" + n;
  return n;
}

// Builds the directory `in` the input spells (a name already there is skipped).
void build(const fs::path& in, std::string_view spec) {
  std::vector<fs::path> files;
  std::error_code ec;
  while (spec.size() >= 2) {
    const uint8_t kind = uint8_t(spec[0]);
    spec.remove_prefix(1);
    const std::string name = name_of(take(spec, uint8_t(take(spec, 1)[0]) % 32));
    const std::string_view body = spec.empty() ? "" : take(spec, uint8_t(take(spec, 1)[0]));
    const fs::path p = in / name;
    if (fs::exists(fs::symlink_status(p, ec))) continue;
    switch (kind % 8) {
      case 0:
      case 1:
        put(p, body);
        files.push_back(p);
        break;
      case 2:
        put(in / ("." + name), body);
        break;
      case 3:
        fs::create_directory(p, ec);
        put(p / "inner", body);
        break;
      case 4:
        if (!files.empty()) fs::create_symlink(files[body.size() % files.size()].filename(), p, ec);
        break;
      case 5:
        fs::create_directory_symlink(body.empty() ? "." : "..", p, ec);
        break;
      case 6:
        fs::create_symlink("missing", p, ec);
        break;
      case 7: {  // a tokenize output: .idx with the magic, with its .bin unless body is odd
        put(p.string() + ".idx", std::string(kMegatronIdxMagic, 9) + std::string(body));
        if (body.size() % 2 == 0) put(p.string() + ".bin", body);
        break;
      }
    }
  }
}

// What the directory's documents are: its regular files (links followed) that are not hidden,
// empty, token files or a Megatron index (with the magic) or that index's .bin, in name order.
std::vector<std::string> documents(const fs::path& in) {
  std::map<std::string, std::string> files;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(in)) {
    const std::string n = e.path().filename().string();
    if (!fs::is_regular_file(e.path(), ec) || n.starts_with(".")) continue;
    std::ifstream f(e.path(), std::ios::binary);
    files[e.path().string()] = std::string(std::istreambuf_iterator<char>(f), {});
  }
  std::vector<std::string> dataset;
  for (const auto& [p, text] : files)
    if (fs::path(p).extension() == ".idx" && text.starts_with(std::string(kMegatronIdxMagic, 9))) {
      dataset.push_back(p);
      dataset.push_back(fs::path(p).replace_extension(".bin").string());
    }
  // Nor empty files, nor token files (.npy, llm.c .bin by their magic).
  auto tokens = [](const std::string& t) {
    int32_t magic = 0;
    if (t.size() >= 4) std::memcpy(&magic, t.data(), 4);
    return t.starts_with("\x93NUMPY") || magic == kBinMagicU16 || magic == kBinMagicU32;
  };
  std::vector<std::string> docs;
  for (const auto& [p, text] : files)
    if (std::find(dataset.begin(), dataset.end(), p) == dataset.end() && !text.empty() &&
        !tokens(text))
      docs.push_back(text);
  return docs;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t pick = data[size - 1];
  const fs::path root = fuzz::scratch() / "t", in = root / "in";
  fs::remove_all(root);
  fs::create_directories(in);
  build(in, fuzz::as_text(data, size - 1));
  // The output: beside the directory, inside it, or over its first entry; existing or not.
  std::string out = (root / "out").string();
  if (pick % 4 == 1) out = (in / "out").string();
  if (pick % 4 == 2 && fs::directory_iterator(in) != fs::directory_iterator())
    out = fs::directory_iterator(in)->path().string();
  if (pick % 4 == 3) out = (root / "out.bin").string();
  const bool force = pick & 4;
  if (pick & 8) put(root / "out.bin", "someone's file");
  const std::vector<std::string> docs = (pick & 16) ? std::vector<std::string>{} : documents(in);
  if (pick & 16) {  // one file, tokenize_bytes
    const fs::path file = fs::directory_iterator(in) != fs::directory_iterator()
                              ? fs::directory_iterator(in)->path()
                              : in / "none";
    fuzz::refused_or_read([&] {
      const int64_t n = tokenize_bytes(file.string(), out, force);
      fuzz::require(n == int64_t(fs::file_size(file)), "a token count other than the bytes");
      fuzz::require(int64_t(fs::file_size(out)) == 1024 + 2 * n, "a .bin of another size");
    });
    return 0;
  }
  fuzz::refused_or_read([&] {
    const TokenizedDocuments r = tokenize_documents(in.string(), out, force);
    fuzz::require(r.documents == int64_t(docs.size()), "another number of documents");
    std::string want;
    for (const std::string& d : docs)
      for (const char c : d) want += std::string{c, '\0'};  // uint16 little-endian
    fuzz::require(slurp(r.prefix + ".bin") == want, "the .bin holds other tokens");
    fuzz::require(r.tokens == int64_t(want.size() / 2), "another number of tokens");
    const IndexedDataset ds = read_indexed_dataset(r.prefix);
    fuzz::require(ds.bin.count == r.tokens, "the dataset reads another number of tokens");
  });
  return 0;
}
