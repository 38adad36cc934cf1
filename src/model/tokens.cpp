#include "model/tokens.h"

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "core/errors.h"

namespace upipe {
namespace {

// The value of `key` in the header dict ("'descr': '<i4', 'fortran_order': False, 'shape':
// (512,)").
std::string header_field(const std::string& header, const std::string& key,
                         const std::string& path) {
  const size_t k = header.find("'" + key + "'");
  if (k == std::string::npos)
    throw ConfigError(fmt::format("{}: the .npy header has no '{}'", path, key));
  size_t v = header.find(':', k) + 1;
  while (v < header.size() && header[v] == ' ') ++v;
  size_t end = v;
  if (header[v] == '(')
    end = header.find(')', v) + 1;
  else if (header[v] == '\'')
    end = header.find('\'', v + 1) + 1;
  else
    end = header.find(',', v);
  return header.substr(v, end - v);
}

}  // namespace

std::vector<int32_t> read_npy_tokens(const std::string& path, int64_t vocab) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ConfigError(fmt::format("cannot open token file {}", path));
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    throw ConfigError(fmt::format("{} is not a .npy file (no \\x93NUMPY magic)", path));
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t hlen = 0, start = 0;
  if (major == 1) {
    hlen = size_t(static_cast<unsigned char>(bytes[8])) |
           size_t(static_cast<unsigned char>(bytes[9])) << 8;
    start = 10;
  } else {
    if (bytes.size() < 12) throw ConfigError(fmt::format("{}: truncated .npy header", path));
    for (int i = 0; i < 4; ++i) hlen |= size_t(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    start = 12;
  }
  if (start + hlen > bytes.size())
    throw ConfigError(fmt::format("{}: truncated .npy header", path));
  const std::string header = bytes.substr(start, hlen);
  const std::string descr = header_field(header, "descr", path);
  if (header_field(header, "fortran_order", path) != "False")
    throw ConfigError(fmt::format("{}: Fortran-ordered arrays are not supported", path));
  const std::string shape = header_field(header, "shape", path);
  int64_t n = 0;
  if (std::sscanf(shape.c_str(), "(%ld,)", &n) != 1 || shape.find(',') != shape.rfind(','))
    throw ConfigError(fmt::format("{}: token arrays must be 1-D, got shape {}", path, shape));
  int width = 0;
  bool is_signed = false;
  if (descr == "'<i4'")
    width = 4, is_signed = true;
  else if (descr == "'<i8'")
    width = 8, is_signed = true;
  else if (descr == "'<u2'")
    width = 2;
  else if (descr == "'<u4'")
    width = 4;
  else
    throw ConfigError(fmt::format(
        "{}: token dtype {} is not supported; use int32, int64, uint16 or uint32", path, descr));
  const size_t data = start + hlen;
  if (n < 0 || data + size_t(n) * size_t(width) > bytes.size())
    throw ConfigError(fmt::format("{}: truncated: {} ids of {} bytes do not fit", path, n, width));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const char* p = bytes.data() + data + size_t(i) * size_t(width);
    int64_t v = 0;
    if (width == 2) {
      uint16_t u;
      std::memcpy(&u, p, 2);
      v = u;
    } else if (width == 4 && is_signed) {
      int32_t s;
      std::memcpy(&s, p, 4);
      v = s;
    } else if (width == 4) {
      uint32_t u;
      std::memcpy(&u, p, 4);
      v = u;
    } else {
      std::memcpy(&v, p, 8);
    }
    if (v < 0 || v >= vocab)
      throw ConfigError(fmt::format("{}: token {} at index {} is outside the vocabulary [0, {})",
                                    path, v, i, vocab));
    ids[size_t(i)] = int32_t(v);
  }
  return ids;
}

}  // namespace upipe
