// Packed training data (train/data.h, train/indexed_dataset.h): Megatron-LM indexed datasets
// written by Megatron-Core itself (tests/fixtures/megatron, tools/make_megatron_fixture.py) read
// document by document, our writer byte-identical to Megatron's, malformed indexes refused before
// anything is allocated, the documents of a window by end-of-text id and by index (pieces at the
// window's ends, empty documents dropped), a pure function of the sequence index, and
// data.documents validated; `upipe tokenize DIR` as one document per file.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "model/tokens.h"
#include "train/data.h"
#include "train/indexed_dataset.h"
#include "train/tokenizer.h"
#include "unit/expect_config_error.h"
#include "unit/temp_dir.h"

namespace upipe {
namespace {

const std::string kFix = std::string(UPIPE_SOURCE_DIR) + "/tests/fixtures/megatron";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Megatron-Core's documents of a fixture dataset (expected.json), empty ones included.
std::vector<std::vector<int64_t>> expected_documents(const std::string& name) {
  nlohmann::json j;
  std::ifstream(kFix + "/expected.json") >> j;
  return j.at(name).get<std::vector<std::vector<int64_t>>>();
}

TEST(MegatronIndex, ReadsTheDocumentsMegatronWrote) {
  for (const std::string name : {"split", "uint16"}) {
    const IndexedDataset ds = read_indexed_dataset(kFix + "/" + name);
    std::vector<int64_t> stream;
    std::vector<int64_t> want_starts{0};
    for (const std::vector<int64_t>& d : expected_documents(name)) {
      if (d.empty()) continue;  // empty documents are dropped
      stream.insert(stream.end(), d.begin(), d.end());
      want_starts.push_back(int64_t(stream.size()));
    }
    EXPECT_EQ(ds.doc_starts, want_starts) << name;
    ASSERT_EQ(ds.bin.count, int64_t(stream.size())) << name;
    std::vector<int32_t> ids(stream.size());
    read_token_range(ds.bin, 0, ds.bin.count, 1 << 20, ids.data());
    EXPECT_EQ(std::vector<int64_t>(ids.begin(), ids.end()), stream) << name;
  }
}

TEST(MegatronIndex, OurWriterIsByteIdenticalToMegatrons) {
  TempDir dir;
  const std::string prefix = dir.file("ours");
  IndexedDatasetWriter w(prefix);
  for (const std::vector<int64_t>& d : expected_documents("uint16")) {
    const std::vector<int32_t> ids(d.begin(), d.end());
    w.add(ids);
    w.end_document();
  }
  w.commit();
  EXPECT_EQ(slurp(prefix + ".idx"), slurp(kFix + "/uint16.idx"));
  EXPECT_EQ(slurp(prefix + ".bin"), slurp(kFix + "/uint16.bin"));
}

TEST(MegatronIndex, MalformedIndexesAreRefused) {
  TempDir dir;
  const std::string good = slurp(kFix + "/split.idx"), bin = slurp(kFix + "/split.bin");
  auto with = [&](const std::string& idx, const std::string& b) {
    std::ofstream(dir.file("t.idx"), std::ios::binary) << idx;
    std::ofstream(dir.file("t.bin"), std::ios::binary) << b;
    return dir.file("t");
  };
  auto patched = [&](size_t at, uint64_t v, int bytes) {
    std::string s = good;
    std::memcpy(s.data() + at, &v, size_t(bytes));
    return s;
  };
  const std::string p = with(good, bin);
  EXPECT_NO_THROW(read_indexed_dataset(p));
  std::string magic = good;
  magic[0] = 'X';
  expect_config_error([&] { read_indexed_dataset(with(magic, bin)); }, {"t.idx", "MMIDIDX"});
  expect_config_error([&] { read_indexed_dataset(with(good.substr(0, 20), bin)); },
                      {"t.idx", "header"});
  expect_config_error([&] { read_indexed_dataset(with(patched(9, 2, 8), bin)); }, {"version 2"});
  expect_config_error([&] { read_indexed_dataset(with(patched(17, 7, 1), bin)); },
                      {"dtype code 7"});
  // Counts far beyond the file: refused from the header, before any allocation.
  expect_config_error([&] { read_indexed_dataset(with(patched(18, uint64_t(1) << 60, 8), bin)); },
                      {"do not fit"});
  expect_config_error([&] { read_indexed_dataset(with(good.substr(0, good.size() - 8), bin)); },
                      {"t.idx", "do not fit"});
  expect_config_error([&] { read_indexed_dataset(with(good + "xyz", bin)); },
                      {"t.idx", "the header says"});
  // The first sequence's length grown by one: the second pointer no longer follows it.
  int32_t len0 = 0;
  std::memcpy(&len0, good.data() + 34, 4);
  expect_config_error([&] { read_indexed_dataset(with(patched(34, uint32_t(len0 + 1), 4), bin)); },
                      {"not contiguous"});
  expect_config_error([&] { read_indexed_dataset(with(good, bin.substr(0, bin.size() - 4))); },
                      {"t.bin", "the index"});
  // Longer than the index says (a .bin written again beside a stale .idx), or by one odd byte:
  // not one dataset either.
  expect_config_error([&] { read_indexed_dataset(with(good, bin + std::string(10000, '\0'))); },
                      {"t.bin", "are not one dataset"});
  expect_config_error([&] { read_indexed_dataset(with(good, bin + "x")); },
                      {"t.bin", "are not one dataset"});
  // An inner document entry far past the sequences, the index still ascending up to it: refused
  // there (it was read as a sequence number, out of bounds, before the decrease after it).
  uint64_t n = 0, m = 0;
  std::memcpy(&n, good.data() + 18, 8);
  std::memcpy(&m, good.data() + 26, 8);
  ASSERT_GE(m, 3u);
  expect_config_error(
      [&] { read_indexed_dataset(with(patched(34 + 12 * n + 8, uint64_t(1) << 40, 8), bin)); },
      {"t.idx", "document index entry 1", "past the"});
}

// A .npy token file of `ids`.
std::string write_npy(const TempDir& dir, const std::string& name,
                      const std::vector<int32_t>& ids) {
  std::string header =
      "{'descr': '<i4', 'fortran_order': False, 'shape': (" + std::to_string(ids.size()) + ",), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string s("\x93NUMPY\x01\x00", 8);
  const uint16_t hl = uint16_t(header.size());
  s.append(reinterpret_cast<const char*>(&hl), 2);
  s += header;
  s.append(reinterpret_cast<const char*>(ids.data()), ids.size() * 4);
  return dir.write(name, s);
}

DataOptions files_options(const std::string& path, int64_t s, const std::string& docs) {
  DataOptions o;
  o.kind = DataKind::kFiles;
  o.path = path;
  o.seq_len = s;
  o.vocab = 1 << 16;
  o.documents = parse_documents_mode(docs);
  return o;
}

TEST(PackedData, EndOfTextIdsEndDocuments) {
  TempDir dir;
  std::vector<int32_t> ids(64);
  std::iota(ids.begin(), ids.end(), 10);
  for (int64_t at : {3, 4, 20, 47}) ids[size_t(at)] = 1;  // EOS = 1
  const DataSource src(files_options(write_npy(dir, "t.npy", ids), 32, "eos:1"));
  // Window [0, 32): documents end after rows 3, 4 and 20; the rest is a piece.
  EXPECT_EQ(src.window_documents(0, src.window(0)), (std::vector<int64_t>{4, 1, 16, 11}));
  // Window [21, 53): a piece up to the EOS at 47, then a piece of the next document.
  EXPECT_EQ(src.window_documents(21, src.window(21)), (std::vector<int64_t>{27, 5}));
  // Window [5, 37) starts right after an EOS.
  EXPECT_EQ(src.window_documents(5, src.window(5)), (std::vector<int64_t>{16, 16}));
  for (int64_t i = 0; i < 20; ++i) {  // a pure function of the sequence index
    const std::vector<int32_t> seq = src.sequence(i);
    const std::vector<int64_t> lens = src.sequence_documents(i, seq);
    EXPECT_EQ(lens, src.window_documents(src.window_start(i), src.window(src.window_start(i))));
    EXPECT_EQ(std::accumulate(lens.begin(), lens.end(), int64_t(0)), 32);
    EXPECT_EQ(lens,
              DataSource(files_options(dir.file("t.npy"), 32, "eos:1")).sequence_documents(i, seq));
  }
  const DataSource plain(files_options(dir.file("t.npy"), 32, "none"));
  EXPECT_TRUE(plain.sequence_documents(0, plain.sequence(0)).empty());
}

TEST(PackedData, IndexDocumentsCutWindows) {
  const DataSource src(files_options(kFix + "/split.idx", 24, "index"));
  std::vector<int64_t> starts{0};  // document starts in the stream (empty documents dropped)
  for (const std::vector<int64_t>& d : expected_documents("split"))
    if (!d.empty()) starts.push_back(starts.back() + int64_t(d.size()));
  ASSERT_EQ(src.total_tokens(), starts.back());
  for (int64_t begin = 0; begin + 24 <= src.total_tokens(); begin += 7) {
    std::vector<int64_t> want;
    int64_t at = begin;
    for (int64_t s : starts)
      if (s > begin && s < begin + 24) {
        want.push_back(s - at);
        at = s;
      }
    want.push_back(begin + 24 - at);
    EXPECT_EQ(src.window_documents(begin, src.window(begin)), want) << "window at " << begin;
  }
}

TEST(PackedData, DocumentsModeIsValidated) {
  EXPECT_EQ(parse_documents_mode("none").kind, DocumentsMode::Kind::kNone);
  EXPECT_EQ(parse_documents_mode("index").kind, DocumentsMode::Kind::kIndex);
  EXPECT_EQ(parse_documents_mode("eos:50256").eos, 50256);
  for (const char* bad : {"eos:", "eos:-1", "eos:1x", "EOS:1", "idx"})
    expect_config_error([&] { parse_documents_mode(bad); }, {"--documents", bad});
  DataOptions copy;
  copy.kind = DataKind::kCopy;
  copy.seq_len = 16;
  copy.vocab = 100;
  copy.documents = parse_documents_mode("eos:1");
  expect_config_error([&] { DataSource{copy}; }, {"--documents", "files"});
  TempDir dir;
  DataOptions o = files_options(write_npy(dir, "t.npy", std::vector<int32_t>(40, 2)), 16, "eos:9");
  o.vocab = 9;
  expect_config_error([&] { DataSource{o}; }, {"end-of-text id 9", "vocabulary"});
}

TEST(PackedData, TokenizeADirectoryOneDocumentPerFile) {
  TempDir in, out;
  in.write("b.txt", "second");
  in.write("a.txt", "first!");
  in.write("c.txt", "");
  // Token files are ids already, not text (they were read as documents of header bytes).
  in.write("d.npy", std::string("\x93NUMPY\x01\x00", 8) + std::string(120, ' '));
  const int32_t llmc[3] = {kBinMagicU16, kBinVersionU16, 0};
  in.write("e.bin", std::string(reinterpret_cast<const char*>(llmc), sizeof llmc) +
                        std::string(1024 - sizeof llmc, '\0'));
  const TokenizedDocuments r = tokenize_documents(in.path().string(), out.file("corpus.bin"));
  EXPECT_EQ(r.prefix, out.file("corpus"));
  EXPECT_EQ(r.documents, 2);  // a.txt, b.txt; c.txt empty, d.npy and e.bin tokens: left out
  EXPECT_EQ(r.tokens, 12);
  EXPECT_EQ(left_out(r), "2 token files (.npy, llm.c .bin: ids already), 1 empty file");
  const IndexedDataset ds = read_indexed_dataset(r.prefix);
  EXPECT_EQ(ds.doc_starts, (std::vector<int64_t>{0, 6, 12}));
  // One token file as the input of one text: refused, naming what reads it.
  expect_config_error([&] { tokenize_bytes(in.file("e.bin"), out.file("e2.bin")); },
                      {"is an llm.c .bin token file, not text", "--data-path"});
  std::vector<int32_t> ids(12);
  read_token_range(ds.bin, 0, 12, 256, ids.data());
  EXPECT_EQ(std::string(ids.begin(), ids.end()), "first!second");
  TempDir again;  // a previous output among the inputs
  again.write("doc.txt", "text");
  again.write("out.bin", "old");
  expect_config_error([&] { tokenize_documents(again.path().string(), again.file("out")); },
                      {"one of the inputs"});
}

}  // namespace
}  // namespace upipe
