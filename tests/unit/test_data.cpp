// Training data: every kind is a pure function of (seed, sequence index); the DP split of a
// step's global batch does not change which sequences it holds; copy sequences repeat their first
// half and the copy loss covers exactly the predictable predictions; token files are one stream
// read by windows that equal slices of the concatenated files; the byte tokenizer round trips.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <numeric>
#include <set>

#include "train/data.h"
#include "train/export.h"
#include "train/tokenizer.h"
#include "unit/expect_config_error.h"
#include "unit/temp_dir.h"

namespace upipe {
namespace {

DataOptions opts(DataKind kind, int64_t s, int64_t v, uint64_t seed = 1) {
  DataOptions o;
  o.kind = kind;
  o.seq_len = s;
  o.vocab = v;
  o.seed = seed;
  return o;
}

TEST(Data, KindNames) {
  EXPECT_EQ(parse_data_kind("files"), DataKind::kFiles);
  EXPECT_EQ(parse_data_kind("random"), DataKind::kRandom);
  EXPECT_EQ(parse_data_kind("copy"), DataKind::kCopy);
  EXPECT_STREQ(data_kind_name(DataKind::kCopy), "copy");
  expect_config_error([] { parse_data_kind("text"); },
                      {"kind text is unknown; choose files, random or copy"});
}

TEST(Data, RandomIsAPureFunctionOfSeedAndIndex) {
  const DataSource a(opts(DataKind::kRandom, 4096, 1000)), b(opts(DataKind::kRandom, 4096, 1000));
  const std::vector<int32_t> s0 = a.sequence(0);
  EXPECT_EQ(s0, b.sequence(0));  // another source, same options: same ids
  EXPECT_EQ(s0, a.sequence(0));  // the same source asked again
  EXPECT_NE(s0, a.sequence(1));
  EXPECT_NE(s0, DataSource(opts(DataKind::kRandom, 4096, 1000, 2)).sequence(0));
  ASSERT_EQ(s0.size(), 4096u);
  // Uniform over [0, V): every id in range, the mean near (V - 1) / 2 (4096 draws: sd ~ 4.5).
  double sum = 0;
  for (int32_t t : s0) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, 1000);
    sum += t;
  }
  EXPECT_NEAR(sum / 4096, 499.5, 25);
  const std::set<int32_t> distinct(s0.begin(), s0.end());
  EXPECT_GT(distinct.size(), 950u);  // 4096 draws from 1000 values hit almost all of them
}

TEST(Data, StepsMicroStepsAndDpRanksIndexTheGlobalBatch) {
  DataOptions o = opts(DataKind::kRandom, 64, 500);
  o.dp_size = 2, o.micro_steps = 3;
  const DataSource d(o);
  EXPECT_EQ(d.global_index(0, 0, 0), 0);
  EXPECT_EQ(d.global_index(0, 0, 1), 1);
  EXPECT_EQ(d.global_index(0, 1, 0), 2);
  EXPECT_EQ(d.global_index(2, 1, 1), (2 * 3 + 1) * 2 + 1);
  EXPECT_EQ(d.sample(2, 1, 1), d.sequence(15));
  // Step k holds sequences [6k, 6k + 6) however they are split: DP 2 x 1 micro-step and DP 1 x 2
  // micro-steps read the same sequences per step (the DP x CP = CP test relies on this).
  DataOptions dp2 = opts(DataKind::kCopy, 64, 500), dp1 = dp2;
  dp2.dp_size = 2, dp2.micro_steps = 1;
  dp1.dp_size = 1, dp1.micro_steps = 2;
  const DataSource a(dp2), b(dp1);
  for (int64_t step = 0; step < 3; ++step) {
    EXPECT_EQ(a.sample(step, 0, 0), b.sample(step, 0, 0));
    EXPECT_EQ(a.sample(step, 0, 1), b.sample(step, 1, 0));
  }
  // Every (step, micro, rank) of a run reads a different sequence.
  std::set<std::vector<int32_t>> seen;
  for (int64_t step = 0; step < 4; ++step)
    for (int m = 0; m < 3; ++m)
      for (int r = 0; r < 2; ++r) seen.insert(d.sample(step, m, r));
  EXPECT_EQ(seen.size(), 24u);
}

TEST(Data, CopyRepeatsTheFirstHalf) {
  const DataSource d(opts(DataKind::kCopy, 1024, 256, 9));
  for (int64_t g : {0, 1, 77}) {
    const std::vector<int32_t> s = d.sequence(g);
    ASSERT_EQ(s.size(), 1024u);
    EXPECT_TRUE(std::equal(s.begin(), s.begin() + 512, s.begin() + 512));
    for (int32_t t : s) ASSERT_TRUE(t >= 0 && t < 256);
    // The first half is random, not a constant.
    EXPECT_GT(std::set<int32_t>(s.begin(), s.begin() + 512).size(), 100u);
  }
  EXPECT_NE(d.sequence(0), d.sequence(1));
  expect_config_error([] { DataSource(opts(DataKind::kCopy, 1023, 256)); },
                      {"train.seq_len (1023) must be even", "try 1024"});
}

TEST(Data, CopyLossCoversThePredictableHalf) {
  // S = 8: tokens a b c d a b c d. Prediction p reads [0, p] and is labelled token p + 1. The
  // copy loss scores p = 4, 5, 6 (labels b c d at 5, 6, 7: each is token p + 1 - 4, which
  // follows token p - 4 = token p in the first half); p = 3 (label a at 4, the copy's start) is
  // not scored, nor is p = 7 (no label).
  EXPECT_EQ(copy_loss_positions(8), (std::pair<int64_t, int64_t>{4, 7}));
  std::vector<int64_t> scored;
  for (int64_t p = 0; p < 8; ++p)
    if (copy_loss_counts(p, 8)) scored.push_back(p);
  EXPECT_EQ(scored, (std::vector<int64_t>{4, 5, 6}));
  // On real copy data, every scored label equals the token h positions earlier, and the
  // prediction h positions earlier has the same label: the task is an exact lookup.
  const DataSource d(opts(DataKind::kCopy, 64, 256, 3));
  const std::vector<int32_t> s = d.sequence(5);
  int64_t n = 0;
  for (int64_t p = 0; p + 1 < 64; ++p)
    if (copy_loss_counts(p, 64)) {
      EXPECT_EQ(s[size_t(p + 1)], s[size_t(p + 1 - 32)]);
      EXPECT_EQ(s[size_t(p)], s[size_t(p - 32)]);
      ++n;
    }
  EXPECT_EQ(n, 31);  // h - 1 predictions
  EXPECT_FALSE(copy_loss_counts(63, 64));
  EXPECT_FALSE(copy_loss_counts(31, 64));
}

// A corpus of three files (.bin u16, .npy int32, .bin u32) whose stream is 0, 1, 2, ... mod 97.
struct Corpus {
  TempDir dir;
  std::vector<int32_t> stream;
  Corpus() {
    const int64_t sizes[] = {300, 250, 450};
    int64_t next = 0;
    std::vector<std::vector<int32_t>> parts;
    for (int64_t n : sizes) {
      parts.emplace_back();
      for (int64_t i = 0; i < n; ++i) parts.back().push_back(int32_t((next++ * 31) % 97));
      stream.insert(stream.end(), parts.back().begin(), parts.back().end());
    }
    write_bin_tokens(dir.file("a.bin"), parts[0], 2);
    std::string h = "{'descr': '<i4', 'fortran_order': False, 'shape': (250,), }";
    while ((10 + h.size() + 1) % 64 != 0) h += ' ';
    h += '\n';
    std::string npy("\x93NUMPY\x01\x00", 8);
    npy += char(h.size()), npy += '\0';
    npy += h;
    npy.append(reinterpret_cast<const char*>(parts[1].data()), parts[1].size() * 4);
    dir.write("b.npy", npy);
    write_bin_tokens(dir.file("c.bin"), parts[2], 4);
    dir.write("notes.txt", "not a token file");
  }
};

TEST(Data, FilesAreOneStreamReadByWindows) {
  Corpus c;
  DataOptions o = opts(DataKind::kFiles, 128, 97, 5);
  o.path = c.dir.path().string();
  const DataSource d(o);
  ASSERT_EQ(d.files().size(), 3u);  // notes.txt is not a token file
  EXPECT_EQ(d.total_tokens(), 1000);
  std::set<int64_t> starts;
  for (int64_t g = 0; g < 200; ++g) {
    const int64_t w = d.window_start(g);
    ASSERT_GE(w, 0);
    ASSERT_LE(w, 1000 - 128);
    starts.insert(w);
    const std::vector<int32_t> s = d.sequence(g);
    ASSERT_TRUE(std::equal(s.begin(), s.end(), c.stream.begin() + w)) << "window at " << w;
  }
  EXPECT_GT(starts.size(), 150u);  // offsets spread over the stream
  // Some windows cross a file boundary (300 and 550).
  EXPECT_TRUE(std::any_of(starts.begin(), starts.end(), [](int64_t w) {
    return (w < 300 && w + 128 > 300) || (w < 550 && w + 128 > 550);
  }));
  // Deterministic: a second source reads the same windows; another seed reads others.
  const DataSource again(o);
  EXPECT_EQ(again.sample(3, 0, 0), d.sample(3, 0, 0));
  o.seed = 6;
  EXPECT_NE(DataSource(o).window_start(3), d.window_start(3));
}

// The fingerprint a checkpoint records says what the stream holds: the same ids in one file of
// another width give the same text; one id changed, or a file more, give another.
TEST(Data, FingerprintIsTheStreamsContent) {
  Corpus c;
  DataOptions o = opts(DataKind::kFiles, 128, 97, 5);
  o.path = c.dir.path().string();
  const std::string fp = DataSource(o).fingerprint();
  EXPECT_EQ(fp.rfind("1000 tokens, xxh3 ", 0), 0u) << fp;
  TempDir one;
  write_bin_tokens(one.file("all.bin"), c.stream, 2);
  o.path = one.file("all.bin");
  EXPECT_EQ(DataSource(o).fingerprint(), fp);
  std::vector<int32_t> edited = c.stream;
  edited[777] = (edited[777] + 1) % 97;
  write_bin_tokens(one.file("all.bin"), edited, 2);
  EXPECT_NE(DataSource(o).fingerprint().substr(fp.find(", xxh3")), fp.substr(fp.find(", xxh3")));
  write_bin_tokens(c.dir.file("d.bin"), std::vector<int32_t>{1, 2, 3}, 2);
  o.path = c.dir.path().string();
  EXPECT_EQ(DataSource(o).fingerprint().rfind("1003 tokens, xxh3 ", 0), 0u);
  // Random and copy data are functions of the settings: no fingerprint.
  EXPECT_EQ(DataSource(opts(DataKind::kCopy, 64, 97, 5)).fingerprint(), "");
}

TEST(Data, FilesByNameAndGlob) {
  Corpus c;
  EXPECT_EQ(expand_token_paths(c.dir.file("c.bin")),
            (std::vector<std::string>{c.dir.file("c.bin")}));
  EXPECT_EQ(expand_token_paths(c.dir.file("*.bin")),
            (std::vector<std::string>{c.dir.file("a.bin"), c.dir.file("c.bin")}));
  EXPECT_EQ(expand_token_paths(c.dir.path().string()).size(), 3u);
  // A window exactly as long as the stream starts at 0.
  DataOptions o = opts(DataKind::kFiles, 750, 97);
  o.path = c.dir.file("*.bin");
  const DataSource d(o);
  EXPECT_EQ(d.total_tokens(), 750);
  EXPECT_EQ(d.window_start(12), 0);
  std::vector<int32_t> want(c.stream.begin(), c.stream.begin() + 300);
  want.insert(want.end(), c.stream.begin() + 550, c.stream.end());
  EXPECT_EQ(d.sequence(12), want);
}

TEST(Data, FileErrorsNameThePath) {
  Corpus c;
  DataOptions o = opts(DataKind::kFiles, 1001, 97);
  o.path = c.dir.path().string();
  expect_config_error([&] { DataSource{o}; },
                      {"holds 1000 tokens in 3 file(s)", "fewer than --seq-len 1001"});
  o.seq_len = 16;
  o.path = c.dir.file("*.none");
  expect_config_error([&] { DataSource{o}; }, {"path: ", "*.none", "matches no file"});
  o.path = c.dir.file("missing.bin");
  expect_config_error([&] { DataSource{o}; }, {"path: ", "missing.bin", "does not exist"});
  // The held-out data's errors name the setting it came from.
  DataOptions v = o;
  v.path_key = "data.val_path";
  expect_config_error([&] { DataSource{v}; }, {"--val-path", "missing.bin", "does not exist"});
  v.path = c.dir.path().string();
  v.seq_len = 1001;
  expect_config_error([&] { DataSource{v}; }, {"--val-path '", "holds 1000 tokens"});
  o.path = "";
  expect_config_error([&] { DataSource{o}; }, {"data.path is required"});
  TempDir empty;
  o.path = empty.path().string();
  expect_config_error([&] { DataSource{o}; }, {"holds no .npy or .bin file"});
  // An id outside the model's vocabulary: refused at construction by default...
  o.path = c.dir.path().string();
  o.vocab = 96;
  expect_config_error([&] { DataSource{o}; }, {"token 96 at index", "[0, 96)"});
  // ...or, without the scan, by the first window that reads it.
  o.check_vocab = false;
  const DataSource lazy(o);
  bool threw = false;
  for (int64_t g = 0; g < 50 && !threw; ++g) {
    try {
      lazy.sequence(g);
    } catch (const ConfigError& e) {
      threw = std::string(e.what()).find("[0, 96)") != std::string::npos;
    }
  }
  EXPECT_TRUE(threw);
}

TEST(Data, ByteTokenizerRoundTrips) {
  TempDir d;
  std::string text = "Hello, world!\n\xff\x00\x80 long context";
  text.append(200000, 'x');  // more than one read chunk
  text += "\xc3\xa9nd";
  const std::string in = d.write("in.txt", text);
  EXPECT_EQ(tokenize_bytes(in, d.file("out.bin")), int64_t(text.size()));
  const std::vector<int32_t> ids = read_bin_tokens(d.file("out.bin"), kByteVocab);
  ASSERT_EQ(ids.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i)
    ASSERT_EQ(ids[i], int32_t(static_cast<unsigned char>(text[i]))) << i;
  EXPECT_EQ(inspect_token_file(d.file("out.bin")).width, 2);  // version 1, uint16
  EXPECT_EQ(tokenize_bytes(d.write("empty.txt", ""), d.file("empty.bin")), 0);
  EXPECT_TRUE(read_tokens(d.file("empty.bin"), kByteVocab).empty());
  expect_config_error([&] { tokenize_bytes(d.file("none.txt"), d.file("x.bin")); },
                      {"cannot open text file", "none.txt"});
  expect_config_error([&] { tokenize_bytes(in, d.file("no/such/dir/x.bin")); },
                      {"cannot create token file", "x.bin"});
}

// tokenize DIR reads the directory's visible regular files, one level; what it leaves out
// (subdirectories, hidden files, an earlier tokenize's dataset, a FIFO) is counted and said.
TEST(Data, TokenizeDirSaysWhatItLeavesOut) {
  TempDir d, out;
  const std::filesystem::path in = d.path() / "corpus";
  std::filesystem::create_directories(in / "sub");
  d.write("corpus/a.txt", "first");
  d.write("corpus/b.txt", "second");
  d.write("corpus/sub/c.txt", "not read");
  d.write("corpus/.gitignore", "*.o");
  ASSERT_EQ(::mkfifo((in / "fifo").c_str(), 0644), 0);
  TokenizedDocuments r = tokenize_documents(in.string(), (in / "old").string());
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(r.tokens, 11);
  EXPECT_EQ(left_out(r),
            "1 subdirectory (one level is read), 1 hidden file (.gitignore), 1 entry that is not "
            "a regular file");
  // Its output inside the directory is no document of the next run.
  r = tokenize_documents(in.string(), out.file("new"));
  EXPECT_EQ(r.documents, 2);
  EXPECT_NE(left_out(r).find("1 token dataset (.bin + .idx)"), std::string::npos) << left_out(r);
  TempDir empty;
  std::filesystem::create_directories(empty.path() / "only" / "sub");
  expect_config_error(
      [&] { tokenize_documents((empty.path() / "only").string(), out.file("x")); },
      {"holds no file to read as a document (left out: 1 subdirectory"});
}

// A file of 2^31 bytes or more is more than one document of the index holds: refused naming it,
// before anything is written (it was refused after writing 4 GiB, naming only the output).
TEST(Data, TokenizeDirRefusesADocumentTooLongAtOnce) {
  TempDir d, out;
  const std::filesystem::path in = d.path() / "corpus";
  std::filesystem::create_directories(in);
  d.write("corpus/a.txt", "first");
  d.write("corpus/huge.txt", "");
  std::filesystem::resize_file(in / "huge.txt", uint64_t(1) << 31);  // sparse: nothing to read
  expect_config_error([&] { tokenize_documents(in.string(), out.file("x")); },
                      {"huge.txt", "2147483648 bytes", "split it"});
  EXPECT_FALSE(std::filesystem::exists(out.file("x.bin")));
  EXPECT_FALSE(std::filesystem::exists(out.file("x.idx")));
}

// Export's shards, cut as transformers' save_pretrained cuts them: tensors in order, a new shard
// where the next would pass the bound, a tensor larger than the bound alone; no bound, one shard.
TEST(Export, ShardsAreCutAsSavePretrainedCutsThem) {
  auto item = [](int64_t elements) {
    return SafetensorsWriteItem{"t", DType::kF32, {elements}, nullptr, nullptr};
  };
  const std::vector<SafetensorsWriteItem> items = {item(100), item(100), item(300), item(50),
                                                   item(10)};
  EXPECT_EQ(tensor_bytes(items[2]), 1200);
  using Shards = std::vector<std::vector<size_t>>;
  EXPECT_EQ(shard_tensors(items, 0), (Shards{{0, 1, 2, 3, 4}}));
  EXPECT_EQ(shard_tensors(items, 800), (Shards{{0, 1}, {2}, {3, 4}}));  // 1200 B alone
  EXPECT_EQ(shard_tensors(items, 1600), (Shards{{0, 1}, {2, 3, 4}}));
  EXPECT_EQ(shard_tensors(items, 1 << 20), (Shards{{0, 1, 2, 3, 4}}));
}

// The output is never the input (under any name), a symlink or a special file; the input is never
// a FIFO (it would block) — and the input survives every refusal.
TEST(Data, TokenizerNeverDestroysItsInput) {
  TempDir d;
  const std::string text = "keep this text";
  const std::string in = d.write("in.txt", text);
  std::filesystem::create_symlink(in, d.file("alias.txt"));
  expect_config_error([&] { tokenize_bytes(in, in); }, {"is the input", "in.txt"});
  expect_config_error([&] { tokenize_bytes(in, d.file("alias.txt")); }, {"is the input"});
  expect_config_error([&] { tokenize_bytes(in, d.path().string() + "/./in.txt"); },
                      {"is the input"});
  std::ifstream f(in, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), text);
  const std::string other = d.write("other.bin", "x");
  std::filesystem::create_symlink(other, d.file("link.bin"));
  expect_config_error([&] { tokenize_bytes(in, d.file("link.bin")); }, {"a symlink"});
  ASSERT_EQ(::mkfifo(d.file("fifo").c_str(), 0644), 0);
  expect_config_error([&] { tokenize_bytes(d.file("fifo"), d.file("o.bin")); }, {"a FIFO"});
  expect_config_error([&] { tokenize_bytes(in, d.file("fifo")); }, {"a FIFO"});
}

}  // namespace
}  // namespace upipe
