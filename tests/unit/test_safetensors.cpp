// safetensors: writer → reader round trips (F32, BF16, conversions, element ranges, tensors
// written piece by piece from a fill function), hand-made F16
// and sharded checkpoints, and every corruption rejected with a one-line ConfigError naming the
// file and the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <utility>

#include "core/errors.h"
#include "model/safetensors.h"
#include "unit/temp_dir.h"

namespace upipe {
namespace {

// A safetensors file from a header text and raw data bytes.
std::string st_bytes(const std::string& header, const std::string& data = "") {
  uint64_t n = header.size();
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s + header + data;
}

template <class T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no ConfigError; expected one containing '" << parts.back() << "'";
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
  }
}

TEST(F16, MatchesTheDefinitionOnEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double sign = (h & 0x8000) ? -1.0 : 1.0;
    float got = f16_to_f32(uint16_t(h));
    if (exp == 31) {
      if (mant == 0)
        EXPECT_EQ(got, float(sign * INFINITY));
      else
        EXPECT_TRUE(std::isnan(got)) << h;
      continue;
    }
    double want =
        exp == 0 ? sign * std::ldexp(mant, -24) : sign * std::ldexp(1024 + mant, exp - 25);
    EXPECT_EQ(got, float(want)) << h;
    EXPECT_EQ(std::signbit(got), sign < 0) << h;
  }
}

TEST(Safetensors, RoundTripF32AndBf16) {
  TempDir dir;
  std::vector<float> a(12);
  for (int i = 0; i < 12; ++i) a[i] = 0.37f * float(i) - 1.1f;
  std::vector<uint16_t> b(5);
  for (int i = 0; i < 5; ++i) b[i] = f32_to_bf16(1.0f / float(i + 3));
  float s = 42.5f;
  std::string path = dir.file("model.safetensors");
  write_safetensors(path,
                    {{"a", DType::kF32, {3, 4}, a.data()},
                     {"b", DType::kBF16, {5}, b.data()},
                     {"scalar", DType::kF32, {}, &s},
                     {"empty", DType::kF32, {0, 4}, nullptr}},
                    {{"format", "pt"}, {"step", "7"}});
  // Only the file itself: the temporary was renamed over it.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
  uint64_t header_len;
  std::FILE* fp = std::fopen(path.c_str(), "rb");
  ASSERT_EQ(std::fread(&header_len, 8, 1, fp), 1u);
  std::fclose(fp);
  EXPECT_EQ(header_len % 8, 0u);  // data section 8-byte aligned

  for (const std::string& p : {path, dir.path().string()}) {
    SafetensorsReader r(p);
    EXPECT_EQ(r.names(), (std::vector<std::string>{"a", "b", "empty", "scalar"}));
    EXPECT_EQ(r.metadata().at("format"), "pt");
    EXPECT_EQ(r.metadata().at("step"), "7");
    EXPECT_EQ(r.tensor("a").dtype, "F32");
    EXPECT_EQ(r.tensor("b").dtype, "BF16");
    EXPECT_EQ(r.tensor("a").shape, (std::vector<int64_t>{3, 4}));

    std::vector<float> a32(12);
    r.read("a", {3, 4}, DType::kF32, a32.data());
    EXPECT_EQ(a32, a);
    std::vector<uint16_t> a16(12);
    r.read("a", {3, 4}, DType::kBF16, a16.data());
    for (int i = 0; i < 12; ++i) EXPECT_EQ(a16[i], f32_to_bf16(a[i]));
    std::vector<uint16_t> b16(5);
    r.read("b", {5}, DType::kBF16, b16.data());
    EXPECT_EQ(b16, b);
    std::vector<float> b32(5);
    r.read("b", {5}, DType::kF32, b32.data());
    for (int i = 0; i < 5; ++i) EXPECT_EQ(b32[i], bf16_to_f32(b[i]));
    float s2 = 0;
    r.read("scalar", {}, DType::kF32, &s2);
    EXPECT_EQ(s2, s);
    r.read("empty", {0, 4}, DType::kF32, nullptr);
    // Row 1 of a, as a ZeRO-3 shard would read it.
    std::vector<float> row(4);
    r.read_range("a", 4, 4, DType::kF32, row.data());
    EXPECT_EQ(row, std::vector<float>(a.begin() + 4, a.begin() + 8));
    std::vector<uint16_t> row16(2);
    r.read_range("b", 3, 2, DType::kBF16, row16.data());
    EXPECT_EQ(row16[1], b[4]);
  }
}

TEST(Safetensors, LargeTensorConvertsAcrossChunks) {
  TempDir dir;
  std::vector<float> x(200003);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.001f;
  std::string path = dir.file("x.safetensors");
  write_safetensors(path, {{"x", DType::kF32, {int64_t(x.size())}, x.data()}});
  SafetensorsReader r(path);
  std::vector<uint16_t> y(x.size());
  r.read("x", {int64_t(x.size())}, DType::kBF16, y.data());
  for (size_t i = 0; i < x.size(); i += 997) EXPECT_EQ(y[i], f32_to_bf16(x[i])) << i;
  EXPECT_EQ(y.back(), f32_to_bf16(x.back()));
}

TEST(Safetensors, FilledTensorsAreWrittenPieceByPiece) {
  // A tensor of 2.5 write chunks from `fill` (a bf16 one, and a small one beside it): the writer
  // asks for consecutive pieces of at most kSafetensorsWriteChunk elements and writes what they
  // hold; the file is the same as one written from whole buffers.
  TempDir dir;
  const int64_t n = kSafetensorsWriteChunk * 5 / 2 + 3;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(i % 1000) * 0.25f - float(i % 7);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
  float small[3] = {1.5f, -2.0f, 3.25f};
  std::vector<std::pair<int64_t, int64_t>> asked;
  auto fill_f32 = [&](int64_t first, int64_t count, void* dst) {
    asked.emplace_back(first, count);
    std::memcpy(dst, x.data() + first, size_t(count) * 4);
  };
  auto fill_bf16 = [&](int64_t first, int64_t count, void* dst) {
    std::memcpy(dst, xb.data() + first, size_t(count) * 2);
  };
  const std::string streamed = dir.file("streamed.safetensors"),
                    whole = dir.file("whole.safetensors");
  write_safetensors(streamed, {{"x", DType::kF32, {n}, nullptr, fill_f32},
                               {"s", DType::kF32, {3}, small},
                               {"xb", DType::kBF16, {n}, nullptr, fill_bf16}});
  write_safetensors(whole, {{"x", DType::kF32, {n}, x.data()},
                            {"s", DType::kF32, {3}, small},
                            {"xb", DType::kBF16, {n}, xb.data()}});
  const std::vector<std::pair<int64_t, int64_t>> want = {
      {0, kSafetensorsWriteChunk},
      {kSafetensorsWriteChunk, kSafetensorsWriteChunk},
      {2 * kSafetensorsWriteChunk, n - 2 * kSafetensorsWriteChunk}};
  EXPECT_EQ(asked, want);
  auto bytes = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string a = bytes(streamed), b = bytes(whole);
  EXPECT_GT(a.size(), size_t(6 * n));
  EXPECT_TRUE(a == b) << "the streamed file differs from the one written from whole buffers";
  std::vector<float> y(x.size());
  SafetensorsReader(streamed).read("x", {n}, DType::kF32, y.data());
  EXPECT_EQ(y, x);
  float one = 1.0f;
  expect_error(
      [&] {
        write_safetensors(dir.file("both.safetensors"), {{"y", DType::kF32, {1}, &one, fill_f32}});
      },
      {"tensor 'y'", "both data and fill"});
}

TEST(Safetensors, AtomicOverwriteAndWriterRefusals) {
  TempDir dir;
  std::string path = dir.file("w.safetensors");
  float one = 1.0f, two = 2.0f;
  write_safetensors(path, {{"x", DType::kF32, {1}, &one}});
  write_safetensors(path, {{"x", DType::kF32, {1}, &two}});
  float got = 0;
  SafetensorsReader(path).read("x", {1}, DType::kF32, &got);
  EXPECT_EQ(got, 2.0f);
  expect_error(
      [&] {
        write_safetensors(path, {{"x", DType::kF32, {1}, &one}, {"x", DType::kF32, {1}, &one}});
      },
      {path, "tensor 'x' given twice"});
  expect_error(
      [&] {
        write_safetensors(path, {{"__metadata__", DType::kF32, {1}, &one}});
      },
      {"invalid tensor name"});
  expect_error(
      [&] {
        write_safetensors(path, {{"y", DType::kF32, {-1}, &one}});
      },
      {"tensor 'y'", "invalid shape [-1]"});
  expect_error(
      [&] {
        write_safetensors(path, {{"y", DType::kF32, {2}, nullptr}});
      },
      {"tensor 'y'", "no data"});
  // The earlier file survives the refused writes, and no temporary is left behind.
  SafetensorsReader(path).read("x", {1}, DType::kF32, &got);
  EXPECT_EQ(got, 2.0f);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
  EXPECT_THROW(
      write_safetensors(dir.file("no/such/dir/w.safetensors"), {{"x", DType::kF32, {1}, &one}}),
      Error);
}

TEST(Safetensors, HandMadeF16) {
  TempDir dir;
  // 1, -2, 65504 (max), 2^-24 (min subnormal), 1023·2^-24 (max subnormal), inf, -0, 0.33325195
  std::vector<uint16_t> h = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x03FF, 0x7C00, 0x8000, 0x3555};
  std::vector<float> want = {
      1.0f,     -2.0f, 65504.0f,       std::ldexp(1.0f, -24), std::ldexp(1023.0f, -24),
      INFINITY, -0.0f, 0.333251953125f};
  std::string path =
      dir.write("h.safetensors",
                st_bytes(R"({"h":{"dtype":"F16","shape":[2,4],"data_offsets":[0,16]}})", raw(h)));
  SafetensorsReader r(path);
  EXPECT_EQ(r.tensor("h").dtype, "F16");
  EXPECT_TRUE(r.metadata().empty());
  std::vector<float> f(8);
  r.read("h", {2, 4}, DType::kF32, f.data());
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(f[i], want[i]) << i;
    EXPECT_EQ(std::signbit(f[i]), std::signbit(want[i])) << i;
  }
  std::vector<uint16_t> b(8);
  r.read("h", {2, 4}, DType::kBF16, b.data());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(b[i], f32_to_bf16(want[i])) << i;
}

TEST(Safetensors, ShardedIndex) {
  TempDir dir;
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  write_safetensors(dir.file("model-00001-of-00002.safetensors"),
                    {{"model.embed_tokens.weight", DType::kF32, {2, 3}, a.data()},
                     {"unmapped", DType::kF32, {1}, a.data()}});
  std::vector<uint16_t> h = {0x3C00, 0x4000};  // 1, 2 in F16
  dir.write("model-00002-of-00002.safetensors", st_bytes(R"({"__metadata__":{"format":"pt"},
                         "model.norm.weight":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})",
                                                         raw(h)));
  std::string index = dir.write("model.safetensors.index.json", R"({
      "metadata": {"total_size": 28},
      "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                     "model.norm.weight": "model-00002-of-00002.safetensors"}})");
  for (const std::string& p : {index, dir.path().string()}) {
    SafetensorsReader r(p);
    EXPECT_EQ(r.path(), index);
    EXPECT_EQ(r.files().size(), 2u);
    EXPECT_EQ(r.names(),
              (std::vector<std::string>{"model.embed_tokens.weight", "model.norm.weight"}));
    EXPECT_FALSE(r.contains("unmapped"));
    EXPECT_EQ(r.metadata().at("total_size"), "28");
    std::vector<float> e(6), n(2);
    r.read("model.embed_tokens.weight", {2, 3}, DType::kF32, e.data());
    EXPECT_EQ(e, a);
    r.read("model.norm.weight", {2}, DType::kF32, n.data());
    EXPECT_EQ(n, (std::vector<float>{1, 2}));
  }
  // A folder holding model.safetensors beside the index loads model.safetensors, as
  // transformers' from_pretrained does (the two disagreed silently).
  write_safetensors(dir.file("model.safetensors"), {{"only.this", DType::kF32, {1}, a.data()}});
  EXPECT_EQ(SafetensorsReader(dir.path().string()).names(), (std::vector<std::string>{"only.this"}));

  dir.write("bad.safetensors.index.json",
            R"({"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}})");
  expect_error([&] { SafetensorsReader r(dir.file("bad.safetensors.index.json")); },
               {"bad.safetensors.index.json", "tensor 'lm_head.weight'",
                "model-00002-of-00002.safetensors, which does not contain it"});
  dir.write("gone.safetensors.index.json",
            R"({"weight_map": {"x": "model-00009-of-00009.safetensors"}})");
  expect_error([&] { SafetensorsReader r(dir.file("gone.safetensors.index.json")); },
               {"model-00009-of-00009.safetensors", "cannot open"});
  // A mapped tensor that another shard holds too is ambiguous (a loader reading every shard's
  // tensors may load the other one): refused, where the mapped one was read without a word.
  dir.write("twice.safetensors.index.json", R"({"weight_map": {
      "model.norm.weight": "model-00002-of-00002.safetensors",
      "other": "model-00003-of-00003.safetensors"}})");
  write_safetensors(
      dir.file("model-00003-of-00003.safetensors"),
      {{"model.norm.weight", DType::kF32, {2}, a.data()}, {"other", DType::kF32, {1}, a.data()}});
  expect_error([&] { SafetensorsReader r(dir.file("twice.safetensors.index.json")); },
               {"tensor 'model.norm.weight'", "model-00002-of-00002.safetensors",
                "model-00003-of-00003.safetensors holds it too"});
  dir.write("empty.safetensors.index.json", R"({"weight_map": {}})");
  expect_error([&] { SafetensorsReader r(dir.file("empty.safetensors.index.json")); },
               {"empty.safetensors.index.json", "weight_map"});
  dir.write("junk.safetensors.index.json", R"({"weight_map": )");
  expect_error([&] { SafetensorsReader r(dir.file("junk.safetensors.index.json")); },
               {"junk.safetensors.index.json: not valid JSON"});
}

TEST(Safetensors, CorruptFilesNameFileAndTensor) {
  TempDir dir;
  auto open_bytes = [&](const std::string& name, const std::string& bytes) {
    std::string p = dir.write(name, bytes);
    return [p] { SafetensorsReader r(p); };
  };
  std::string f32x4 = raw(std::vector<float>{1, 2, 3, 4});
  expect_error(open_bytes("short.safetensors", "abc"), {"short.safetensors", "truncated: 3 bytes"});
  std::string big(8, '\0');
  big[0] = char(0xe8), big[1] = char(0x03);  // 1000
  expect_error(open_bytes("len.safetensors", big + "{}"),
               {"len.safetensors", "header length 1000 exceeds the file (10 bytes)"});
  expect_error(open_bytes("json.safetensors", st_bytes(R"({"w": {"dtype": )")),
               {"json.safetensors header: not valid JSON"});
  // A number no double holds: nlohmann::json's out_of_range, not a parse_error (it escaped as one
  // before, an internal error instead of the file's).
  expect_error(open_bytes("huge.safetensors", st_bytes(R"({"w": {"dtype": 1e999}})")),
               {"huge.safetensors header: not valid JSON", "number overflow"});
  expect_error(open_bytes("arr.safetensors", st_bytes("[]")),
               {"arr.safetensors", "not a JSON object"});
  expect_error(open_bytes("past.safetensors",
                          st_bytes(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})",
                                   f32x4.substr(0, 12))),
               {"past.safetensors", "tensor 'w'", "run past the data section (12 bytes)"});
  expect_error(
      open_bytes("size.safetensors",
                 st_bytes(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", f32x4)),
      {"size.safetensors", "tensor 'w'", "hold 12 bytes but F32 [2, 2] needs 16"});
  expect_error(
      open_bytes("long.safetensors",
                 st_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", f32x4)),
      {"long.safetensors", "tensor 'w'", "hold 16 bytes but F32 [3] needs 12"});
  expect_error(open_bytes("overlap.safetensors",
                          st_bytes(R"({"u":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},
                              "v":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                   f32x4)),
               {"overlap.safetensors", "tensor 'v'", "overlaps tensor 'u'"});
  // The tensors fill the data section in order, as the reference reader requires: a header that
  // points a tensor at other bytes (its own left to no tensor) or leaves bytes at the end.
  expect_error(
      open_bytes("hole.safetensors",
                 st_bytes(R"({"u":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                              "v":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                          f32x4)),
      {"hole.safetensors", "tensor 'v'", "data_offsets start at 8, but tensor 'u' ends at 4"});
  expect_error(
      open_bytes("start.safetensors",
                 st_bytes(R"({"v":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", f32x4)),
      {"start.safetensors", "tensor 'v'", "but nothing ends at 0"});
  expect_error(
      open_bytes("tail.safetensors",
                 st_bytes(R"({"v":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f32x4)),
      {"tail.safetensors", "the tensors cover 8 of the data section's 16 bytes"});
  expect_error(
      open_bytes("rev.safetensors",
                 st_bytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", f32x4)),
      {"rev.safetensors", "tensor 'w'", "reversed"});
  expect_error(
      open_bytes("dtype.safetensors",
                 st_bytes(R"({"w":{"dtype":"Q4","shape":[4],"data_offsets":[0,2]}})", f32x4)),
      {"dtype.safetensors", "tensor 'w'", "unknown dtype 'Q4'"});
  expect_error(
      open_bytes("neg.safetensors",
                 st_bytes(R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", f32x4)),
      {"neg.safetensors", "tensor 'w'", "negative dim"});
  expect_error(open_bytes("noff.safetensors", st_bytes(R"({"w":{"dtype":"F32","shape":[4]}})")),
               {"noff.safetensors", "tensor 'w'", "data_offsets"});
  expect_error(open_bytes("meta.safetensors", st_bytes(R"({"__metadata__":{"step":7}})")),
               {"meta.safetensors", "\"__metadata__\".step is not a string"});
  // Names, dtypes and metadata keys of the file are quoted as excerpts: each of 3000 characters
  // made a refusal of over 3000 (past the 2000 a message may have).
  const std::string l(3000, 'n');
  for (const std::string& header :
       {R"({")" + l + R"(":5})",
        R"({"w":{"dtype":")" + l + R"(","shape":[4],"data_offsets":[0,16]}})",
        R"({"__metadata__":{")" + l + R"(":7}})",
        R"({")" + l + R"(":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},
            "v":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})"}) {
    try {
      SafetensorsReader r(dir.write("names.safetensors", st_bytes(header, f32x4)));
      ADD_FAILURE() << "not refused";
    } catch (const ConfigError& e) {
      EXPECT_LT(std::string(e.what()).size(), 2000u) << e.what();
      EXPECT_NE(std::string(e.what()).find("names.safetensors"), std::string::npos) << e.what();
    }
  }
  expect_error([&] { SafetensorsReader r(dir.file("absent.safetensors")); },
               {"absent.safetensors", "cannot open"});
  TempDir empty_dir;
  expect_error([&] { SafetensorsReader r(empty_dir.path().string()); },
               {empty_dir.path().string(), "neither model.safetensors.index.json"});

  // A writer-made file cut short: the tensor whose bytes are missing is named.
  std::vector<float> a(8, 1.0f), b(8, 2.0f);
  std::string good = dir.file("good.safetensors");
  write_safetensors(
      good, {{"first", DType::kF32, {8}, a.data()}, {"second", DType::kF32, {2, 4}, b.data()}});
  std::filesystem::resize_file(good, std::filesystem::file_size(good) - 4);
  expect_error([&] { SafetensorsReader r(good); },
               {"good.safetensors", "tensor 'second'", "truncated"});
}

TEST(Safetensors, ReadRefusals) {
  TempDir dir;
  std::vector<float> a(12, 0.5f);
  std::vector<int64_t> ids = {1, 2};
  std::string path = dir.write("m.safetensors",
                               st_bytes(R"({"a":{"dtype":"F32","shape":[3,4],"data_offsets":[0,48]},
                   "ids":{"dtype":"I64","shape":[2],"data_offsets":[48,64]}})",
                                        raw(a) + raw(ids)));
  SafetensorsReader r(path);
  std::vector<float> out(12);
  expect_error(
      [&] {
        r.read("a", {4, 3}, DType::kF32, out.data());
      },
      {path, "tensor 'a'", "has shape [3, 4], expected [4, 3]"});
  expect_error([&] { r.read("missing.weight", {1}, DType::kF32, out.data()); },
               {path, "tensor 'missing.weight'", "not found"});
  expect_error([&] { r.read("ids", {2}, DType::kF32, out.data()); },
               {path, "tensor 'ids'", "dtype I64 cannot be read"});
  // The pre-check every rank runs before any rank reads its part refuses the dtype too.
  expect_error([&] { r.check_shape("ids", {2}); },
               {path, "tensor 'ids'", "dtype I64 cannot be read"});
  expect_error([&] { r.read_range("a", 10, 4, DType::kF32, out.data()); },
               {path, "tensor 'a'", "elements [10, 14) are outside its 12 elements"});
  // Moving the reader keeps it usable.
  SafetensorsReader moved = std::move(r);
  moved.read("a", {3, 4}, DType::kF32, out.data());
  EXPECT_EQ(out, a);
}

}  // namespace
}  // namespace upipe
