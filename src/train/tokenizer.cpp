#include "train/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "core/errors.h"
#include "core/safe_fs.h"
#include "model/tokens.h"

namespace upipe {
namespace {
constexpr int64_t kChunk = int64_t(1) << 16;  // bytes per read
}  // namespace

int64_t tokenize_bytes(const std::string& in, const std::string& out) {
  const ReadFile src(in, "text file");
  if (same_file(in, out))
    throw ConfigError(
        fmt::format("the output {} is the input {}: writing it would destroy the "
                    "text; choose another output",
                    out, in));
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

}  // namespace upipe
