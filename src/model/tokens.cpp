#include "model/tokens.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/checked.h"
#include "core/errors.h"
#include "core/safe_fs.h"

namespace upipe {
namespace {

// Ids converted per read: bounds the staging buffer (64 KiB of 8-byte ids) whatever the window.
constexpr int64_t kReadChunk = 8192;

// Token files are opened without blocking and must be regular files (core/safe_fs.h).
ReadFile open_token_file(const std::string& path) {
  return ReadFile(path, "token file");
}

// The value of `key` in the header dict ("'descr': '<i4', 'fortran_order': False, 'shape':
// (512,)").
std::string header_field(const std::string& header, const std::string& key,
                         const std::string& path) {
  const size_t k = header.find("'" + key + "'");
  if (k == std::string::npos)
    throw ConfigError(fmt::format("{}: the .npy header has no '{}'", path, key));
  size_t v = header.find(':', k);
  if (v == std::string::npos)
    throw ConfigError(fmt::format("{}: malformed .npy header near '{}'", path, key));
  ++v;
  while (v < header.size() && header[v] == ' ') ++v;
  size_t end = v;
  if (v < header.size() && header[v] == '(')
    end = header.find(')', v) + 1;
  else if (v < header.size() && header[v] == '\'')
    end = header.find('\'', v + 1) + 1;
  else
    end = header.find(',', v);
  if (end == std::string::npos || end == 0 || end > header.size())
    throw ConfigError(fmt::format("{}: malformed .npy header near '{}'", path, key));
  return header.substr(v, end - v);
}

TokenFileInfo inspect_npy(const std::string& path, const ReadFile& f, int64_t size) {
  TokenFileInfo info;
  info.path = path;
  info.format = TokenFormat::kNpy;
  unsigned char pre[12] = {};
  if (size < 10) throw ConfigError(fmt::format("{}: truncated .npy header", path));
  f.read_at(pre, std::min<int64_t>(size, 12), 0);
  // Versions 1.0 (2-byte header length), 2.0 and 3.0 (4-byte; 3.0's header is UTF-8).
  const int major = pre[6], minor = pre[7];
  if (minor != 0 || major < 1 || major > 3)
    throw ConfigError(
        fmt::format("{}: .npy format version {}.{} is not supported; NumPy writes 1.0, 2.0 or 3.0",
                    path, major, minor));
  int64_t hlen = 0, start = 0;
  if (major == 1) {
    hlen = int64_t(pre[8]) | int64_t(pre[9]) << 8;
    start = 10;
  } else {
    if (size < 12) throw ConfigError(fmt::format("{}: truncated .npy header", path));
    for (int i = 0; i < 4; ++i) hlen |= int64_t(pre[8 + i]) << (8 * i);
    start = 12;
  }
  if (start + hlen > size) throw ConfigError(fmt::format("{}: truncated .npy header", path));
  std::string header(static_cast<size_t>(hlen), '\0');
  f.read_at(header.data(), hlen, start);
  const std::string descr = header_field(header, "descr", path);
  if (header_field(header, "fortran_order", path) != "False")
    throw ConfigError(fmt::format("{}: Fortran-ordered arrays are not supported", path));
  const std::string shape = header_field(header, "shape", path);
  int64_t n = 0;
  int used = -1;  // set only when the whole "(N,)" matched: "(1,3)" is 2-D, not 1 id
  if (std::sscanf(shape.c_str(), "(%ld,)%n", &n, &used) != 1 || used != int(shape.size()))
    throw ConfigError(
        fmt::format("{}: token arrays must be 1-D, got shape {}", path, excerpt(shape)));
  if (descr == "'<i4'")
    info.width = 4, info.is_signed = true;
  else if (descr == "'<i8'")
    info.width = 8, info.is_signed = true;
  else if (descr == "'<u2'")
    info.width = 2;
  else if (descr == "'<u4'")
    info.width = 4;
  else
    throw ConfigError(
        fmt::format("{}: token dtype {} is not supported; use int32, int64, uint16 or uint32", path,
                    excerpt(descr)));
  info.data_offset = start + hlen;
  int64_t need = 0;
  if (n < 0 || !mul_fits(need, {n, info.width}) || need > size - info.data_offset)
    throw ConfigError(
        fmt::format("{}: truncated: {} ids of {} bytes do not fit", path, n, info.width));
  info.count = n;
  return info;
}

TokenFileInfo inspect_bin(const std::string& path, const ReadFile& f, int64_t size) {
  TokenFileInfo info;
  info.path = path;
  info.format = TokenFormat::kBin;
  constexpr int64_t header_bytes = kBinHeaderInts * 4;
  if (size < header_bytes)
    throw ConfigError(
        fmt::format("{}: truncated: an llm.c .bin header is {} bytes, the file has {}", path,
                    header_bytes, size));
  int32_t h[3];
  f.read_at(h, sizeof(h), 0);
  if (h[0] == kBinMagicU16 && h[1] == kBinVersionU16)
    info.width = 2;
  else if (h[0] == kBinMagicU32 && h[1] == kBinVersionU32)
    info.width = 4;
  else
    throw ConfigError(fmt::format(
        "{}: unsupported llm.c .bin magic/version {}/{}; expected {}/{} (uint16 ids) or {}/{} "
        "(uint32 ids)",
        path, h[0], h[1], kBinMagicU16, kBinVersionU16, kBinMagicU32, kBinVersionU32));
  if (h[2] < 0)
    throw ConfigError(fmt::format("{}: negative token count {} in the .bin header", path, h[2]));
  info.data_offset = header_bytes;
  info.count = h[2];
  const int64_t need = info.count * info.width;
  if (need != size - header_bytes)
    throw ConfigError(fmt::format(
        "{}: {}: the header says {} ids of {} bytes ({} bytes) but {} bytes follow the header",
        path, need > size - header_bytes ? "truncated" : "trailing bytes", info.count, info.width,
        need, size - header_bytes));
  return info;
}

}  // namespace

TokenFormat token_format_by_magic(std::span<const char> head) {
  if (head.size() >= 6 && std::memcmp(head.data(), "\x93NUMPY", 6) == 0) return TokenFormat::kNpy;
  int32_t m = 0;
  if (head.size() >= 4) std::memcpy(&m, head.data(), 4);
  return m == kBinMagicU16 || m == kBinMagicU32 ? TokenFormat::kBin : TokenFormat::kRaw;
}

TokenFileInfo inspect_token_file(const std::string& path) {
  const ReadFile f = open_token_file(path);
  const int64_t size = f.size();
  char magic[6] = {};
  f.read_at(magic, std::min<int64_t>(size, 6), 0);
  const TokenFormat by = token_format_by_magic({magic, size_t(std::min<int64_t>(size, 6))});
  if (by == TokenFormat::kNpy) return inspect_npy(path, f, size);
  if (by == TokenFormat::kBin || std::filesystem::path(path).extension() == ".bin")
    return inspect_bin(path, f, size);
  throw ConfigError(fmt::format(
      "{} is neither a .npy file (no \\x93NUMPY magic) nor an llm.c .bin token file (magic {} "
      "or {}); to train on a text file, make its tokens first: upipe tokenize {} OUT.bin",
      path, kBinMagicU16, kBinMagicU32, path));
}

void read_token_range(const TokenFileInfo& info, int64_t begin, int64_t n, int64_t vocab,
                      int32_t* out) {
  if (begin < 0 || n < 0 || begin > info.count || n > info.count - begin)
    throw ConfigError(fmt::format("{}: ids [{}, {}) requested, the file has {}", info.path, begin,
                                  checked_add(begin, n), info.count));
  const ReadFile f = open_token_file(info.path);
  std::vector<char> buf(static_cast<size_t>(std::min(n, kReadChunk) * info.width));
  for (int64_t done = 0; done < n;) {
    const int64_t m = std::min(n - done, kReadChunk);
    f.read_at(buf.data(), m * info.width, info.data_offset + (begin + done) * info.width);
    for (int64_t i = 0; i < m; ++i) {
      const char* p = buf.data() + i * info.width;
      int64_t v = 0;
      if (info.width == 2) {
        uint16_t u;
        std::memcpy(&u, p, 2);
        v = u;
      } else if (info.width == 4 && info.is_signed) {
        int32_t s;
        std::memcpy(&s, p, 4);
        v = s;
      } else if (info.width == 4) {
        uint32_t u;
        std::memcpy(&u, p, 4);
        v = u;
      } else {
        std::memcpy(&v, p, 8);
      }
      if (v < 0 || v >= vocab)
        throw ConfigError(fmt::format("{}: token {} at index {} is outside the vocabulary [0, {})",
                                      info.path, v, begin + done + i, vocab));
      out[done + i] = int32_t(v);
    }
    done += m;
  }
}

void check_token_ids(const TokenFileInfo& f, int64_t n, int64_t vocab) {
  std::vector<int32_t> buf(static_cast<size_t>(std::min(n, kReadChunk)));
  for (int64_t b = 0; b < n; b += kReadChunk)
    read_token_range(f, b, std::min(kReadChunk, n - b), vocab, buf.data());
}

std::vector<int32_t> read_tokens(const std::string& path, int64_t vocab) {
  const TokenFileInfo info = inspect_token_file(path);
  std::vector<int32_t> ids(static_cast<size_t>(info.count));
  read_token_range(info, 0, info.count, vocab, ids.data());
  return ids;
}

std::vector<int32_t> read_npy_tokens(const std::string& path, int64_t vocab) {
  const TokenFileInfo info = inspect_token_file(path);
  if (info.format != TokenFormat::kNpy)
    throw ConfigError(fmt::format("{} is not a .npy file (no \\x93NUMPY magic)", path));
  return read_tokens(path, vocab);
}

std::vector<int32_t> read_bin_tokens(const std::string& path, int64_t vocab) {
  const TokenFileInfo info = inspect_token_file(path);
  if (info.format != TokenFormat::kBin)
    throw ConfigError(fmt::format("{} is a .npy file, not an llm.c .bin token file", path));
  return read_tokens(path, vocab);
}

void write_bin_tokens(const std::string& path, std::span<const int32_t> ids, int width) {
  if (width != 2 && width != 4)
    throw ConfigError(fmt::format("{}: .bin ids are 2 or 4 bytes wide, not {}", path, width));
  if (int64_t(ids.size()) > INT32_MAX)
    throw ConfigError(fmt::format(
        "{}: {} ids do not fit one llm.c .bin file (its header counts at most {}); split the input",
        path, ids.size(), INT32_MAX));
  const int64_t limit = width == 2 ? 65536 : (int64_t(1) << 32);
  std::vector<int32_t> header(static_cast<size_t>(kBinHeaderInts), 0);
  header[0] = width == 2 ? kBinMagicU16 : kBinMagicU32;
  header[1] = width == 2 ? kBinVersionU16 : kBinVersionU32;
  header[2] = int32_t(ids.size());
  AtomicFile f(path, "token file");
  f.write(header.data(), kBinHeaderInts * 4);
  std::vector<char> buf;  // one chunk of ids in the file's width
  for (size_t i = 0; i < ids.size();) {
    buf.clear();
    for (const size_t end = std::min(ids.size(), i + size_t(kReadChunk)); i < end; ++i) {
      if (ids[i] < 0 || ids[i] >= limit)
        throw ConfigError(
            fmt::format("{}: id {} at index {} does not fit {} bytes", path, ids[i], i, width));
      const uint32_t u = uint32_t(ids[i]);
      const char* b = reinterpret_cast<const char*>(&u);
      buf.insert(buf.end(), b, b + width);  // little-endian: the low bytes first
    }
    f.write(buf.data(), int64_t(buf.size()));
  }
  f.commit();
}

}  // namespace upipe
