// Token files: llm.c .bin (uint16 and uint32 layouts) written and read back, windows read from
// the middle of a file, .npy read through the same path, the format told by the magic not the
// name, and every broken file refused with a one-line ConfigError naming the file.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "model/tokens.h"
#include "unit/expect_config_error.h"
#include "unit/temp_dir.h"

namespace upipe {
namespace {

template <class T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// An llm.c .bin file by hand: header {magic, version, count} then the ids as T.
template <class T>
std::string bin_bytes(int32_t magic, int32_t version, int32_t count, const std::vector<T>& ids) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic, header[1] = version, header[2] = count;
  return raw(header) + raw(ids);
}

// A version-1 .npy of a 1-D array with dtype `descr`.
std::string npy_bytes(const std::string& descr, int64_t n, const std::string& data) {
  std::string h =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + std::to_string(n) + ",), }";
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string s("\x93NUMPY\x01\x00", 8);
  s += char(h.size() & 0xff), s += char(h.size() >> 8);
  return s + h + data;
}

TEST(Tokens, BinU16MatchesHandWrittenHeader) {
  TempDir d;
  const std::vector<uint16_t> ids = {0, 1, 255, 65535, 7};
  const std::string p = d.write("a.bin", bin_bytes(20240520, 1, 5, ids));
  const TokenFileInfo info = inspect_token_file(p);
  EXPECT_EQ(info.format, TokenFormat::kBin);
  EXPECT_EQ(info.width, 2);
  EXPECT_EQ(info.count, 5);
  EXPECT_EQ(info.data_offset, 1024);
  EXPECT_EQ(read_tokens(p, 65536), (std::vector<int32_t>{0, 1, 255, 65535, 7}));
  EXPECT_EQ(read_bin_tokens(p, 65536), read_tokens(p, 65536));
}

TEST(Tokens, BinU32Llama3Layout) {
  TempDir d;
  const std::vector<uint32_t> ids = {128255, 0, 70000};
  const std::string p = d.write("l3.bin", bin_bytes(20240801, 7, 3, ids));
  EXPECT_EQ(inspect_token_file(p).width, 4);
  EXPECT_EQ(read_tokens(p, 128256), (std::vector<int32_t>{128255, 0, 70000}));
}

TEST(Tokens, WriteReadRoundTripBothWidths) {
  TempDir d;
  std::vector<int32_t> ids(20000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7919) % 50000);
  write_bin_tokens(d.file("w2.bin"), ids, 2);
  EXPECT_EQ(std::filesystem::file_size(d.file("w2.bin")), 1024 + 2 * ids.size());
  EXPECT_EQ(read_tokens(d.file("w2.bin"), 50000), ids);
  ids[3] = 100000;
  write_bin_tokens(d.file("w4.bin"), ids, 4);
  EXPECT_EQ(read_tokens(d.file("w4.bin"), 100001), ids);
  expect_config_error([&] { write_bin_tokens(d.file("bad.bin"), ids, 2); },
                      {"bad.bin", "100000", "index 3", "2 bytes"});
}

TEST(Tokens, ReadRangeReadsOnlyTheWindow) {
  TempDir d;
  std::vector<int32_t> ids(30000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i % 1000);
  write_bin_tokens(d.file("r.bin"), ids, 2);
  ids[0] = 5000;  // out of the vocabulary below, but outside the windows read
  write_bin_tokens(d.file("r.bin"), ids, 2);
  const TokenFileInfo info = inspect_token_file(d.file("r.bin"));
  // Windows longer than one internal read chunk, starting mid-file.
  std::vector<int32_t> out(20000);
  read_token_range(info, 9000, 20000, 1000, out.data());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), ids.begin() + 9000));
  read_token_range(info, 29999, 1, 1000, out.data());
  EXPECT_EQ(out[0], 29999 % 1000);
  expect_config_error([&] { read_token_range(info, 0, 2, 1000, out.data()); },
                      {"r.bin", "token 5000 at index 0", "[0, 1000)"});
  expect_config_error([&] { read_token_range(info, 29990, 20, 1000, out.data()); },
                      {"r.bin", "[29990, 30010)", "30000"});
}

TEST(Tokens, NpyThroughTheSamePath) {
  TempDir d;
  const std::vector<int32_t> i4 = {3, 1, 4, 1, 5};
  const std::vector<int64_t> i8 = {9, 2, 6};
  const std::vector<uint16_t> u2 = {65535, 0};
  EXPECT_EQ(read_tokens(d.write("a.npy", npy_bytes("<i4", 5, raw(i4))), 10), i4);
  EXPECT_EQ(read_npy_tokens(d.write("b.npy", npy_bytes("<i8", 3, raw(i8))), 10),
            (std::vector<int32_t>{9, 2, 6}));
  EXPECT_EQ(read_tokens(d.write("c.npy", npy_bytes("<u2", 2, raw(u2))), 65536),
            (std::vector<int32_t>{65535, 0}));
  const TokenFileInfo info = inspect_token_file(d.file("b.npy"));
  EXPECT_EQ(info.format, TokenFormat::kNpy);
  EXPECT_EQ(info.width, 8);
  EXPECT_EQ(info.data_offset % 64, 0);
}

TEST(Tokens, FormatComesFromTheMagicNotTheName) {
  TempDir d;
  const std::vector<uint16_t> ids = {1, 2, 3};
  // A .bin file named .npy and a .npy file named .dat are read by their contents.
  EXPECT_EQ(read_tokens(d.write("x.npy", bin_bytes(20240520, 1, 3, ids)), 10),
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(read_tokens(d.write("y.dat", npy_bytes("<u2", 3, raw(ids))), 10),
            (std::vector<int32_t>{1, 2, 3}));
  expect_config_error([&] { read_npy_tokens(d.file("x.npy"), 10); }, {"x.npy", "not a .npy"});
  expect_config_error([&] { read_bin_tokens(d.file("y.dat"), 10); },
                      {"y.dat", "not an llm.c .bin"});
}

TEST(Tokens, BrokenBinFilesAreRefused) {
  TempDir d;
  const std::vector<uint16_t> ids = {1, 2, 3, 4};
  expect_config_error(
      [&] { read_tokens(d.write("short.bin", bin_bytes(20240520, 1, 5, ids)), 10); },
      {"short.bin", "truncated", "5 ids"});
  expect_config_error([&] { read_tokens(d.write("long.bin", bin_bytes(20240520, 1, 3, ids)), 10); },
                      {"long.bin", "trailing bytes", "3 ids"});
  expect_config_error([&] { read_tokens(d.write("head.bin", std::string(100, '\0')), 10); },
                      {"head.bin", "truncated", "1024 bytes"});
  expect_config_error([&] { read_tokens(d.write("magic.bin", bin_bytes(12345, 1, 4, ids)), 10); },
                      {"magic.bin", "magic/version 12345/1", "20240520/1"});
  expect_config_error([&] { read_tokens(d.write("ver.bin", bin_bytes(20240520, 2, 4, ids)), 10); },
                      {"ver.bin", "magic/version 20240520/2"});
  expect_config_error([&] { read_tokens(d.write("neg.bin", bin_bytes(20240520, 1, -1, ids)), 10); },
                      {"neg.bin", "negative token count -1"});
  expect_config_error([&] { read_tokens(d.write("vocab.bin", bin_bytes(20240520, 1, 4, ids)), 4); },
                      {"vocab.bin", "token 4 at index 3", "[0, 4)"});
  expect_config_error([&] { read_tokens(d.write("junk.txt", "hello world"), 10); },
                      {"junk.txt", "neither a .npy file", "20240520"});
  expect_config_error([&] { read_tokens(d.file("missing.bin"), 10); },
                      {"cannot open token file", "missing.bin"});
}

TEST(Tokens, BrokenNpyFilesAreRefused) {
  TempDir d;
  const std::vector<int32_t> i4 = {1, 2, 3};
  expect_config_error([&] { read_tokens(d.write("t.npy", npy_bytes("<i4", 4, raw(i4))), 10); },
                      {"t.npy", "truncated"});
  expect_config_error([&] { read_tokens(d.write("f.npy", npy_bytes("<f4", 3, raw(i4))), 10); },
                      {"f.npy", "'<f4'", "not supported"});
  expect_config_error([&] { read_tokens(d.write("v.npy", npy_bytes("<i4", 3, raw(i4))), 3); },
                      {"v.npy", "token 3 at index 2"});
  std::string two_d = npy_bytes("<i4", 3, raw(i4));
  two_d.replace(two_d.find("(3,)"), 4, "(1,3)");
  expect_config_error([&] { read_tokens(d.write("m.npy", two_d), 10); }, {"m.npy", "1-D"});
  expect_config_error(
      [&] { read_tokens(d.write("h.npy", std::string("\x93NUMPY\x01\x00\xff\x00", 10)), 10); },
      {"h.npy", "truncated .npy header"});
}

}  // namespace
}  // namespace upipe
