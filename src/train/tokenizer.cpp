#include "train/tokenizer.h"

#include <fmt/format.h>

#include <climits>
#include <fstream>
#include <vector>

#include "core/errors.h"
#include "model/tokens.h"

namespace upipe {
namespace {
constexpr int64_t kChunk = int64_t(1) << 16;  // bytes per read
}  // namespace

int64_t tokenize_bytes(const std::string& in, const std::string& out) {
  std::ifstream src(in, std::ios::binary);
  if (!src) throw ConfigError(fmt::format("cannot read text file {}", in));
  std::ofstream dst(out, std::ios::binary | std::ios::trunc);
  if (!dst) throw ConfigError(fmt::format("cannot write token file {}", out));
  std::vector<int32_t> header(static_cast<size_t>(kBinHeaderInts), 0);
  header[0] = kBinMagicU16;
  header[1] = kBinVersionU16;
  dst.write(reinterpret_cast<const char*>(header.data()), kBinHeaderInts * 4);
  std::vector<char> bytes(static_cast<size_t>(kChunk));
  std::vector<uint16_t> ids(static_cast<size_t>(kChunk));
  int64_t count = 0;
  while (src) {
    src.read(bytes.data(), kChunk);
    const int64_t n = src.gcount();
    if (src.bad()) throw ConfigError(fmt::format("cannot read text file {}", in));
    for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = static_cast<unsigned char>(bytes[size_t(i)]);
    dst.write(reinterpret_cast<const char*>(ids.data()), n * 2);
    count += n;
    if (count > INT32_MAX)
      throw ConfigError(fmt::format(
          "{} has more than {} bytes, the most one llm.c .bin file counts; split the text", in,
          INT32_MAX));
  }
  header[2] = int32_t(count);
  dst.seekp(0);
  dst.write(reinterpret_cast<const char*>(header.data()), 3 * 4);
  dst.flush();
  if (!dst) throw ConfigError(fmt::format("cannot write token file {}", out));
  return count;
}

}  // namespace upipe
