#include "model/doc_lens.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <regex>

#include "core/errors.h"
#include "model/tokens.h"

namespace upipe {
namespace {

// A list has a comma or only digits; anything else names a file.
bool is_list(const std::string& s) {
  return s.find(',') != std::string::npos ||
         (!s.empty() && s.find_first_not_of("0123456789 ") == std::string::npos);
}

std::vector<int64_t> parse_list(const std::string& s, int64_t seq_len, const std::string& what) {
  std::vector<int64_t> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t end = std::min(s.find(',', at), s.size());
    std::string item = s.substr(at, end - at);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    int64_t v = 0;
    const auto r = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || r.ec != std::errc() || r.ptr != item.data() + item.size())
      throw ConfigError(fmt::format("{}: '{}' is not a document length (item {} of '{}')", what,
                                    excerpt(item), out.size() + 1, excerpt(s)));
    if (int64_t(out.size()) >= seq_len)
      throw ConfigError(fmt::format("{}: more than {} lengths for a sequence of {} tokens", what,
                                    seq_len, seq_len));
    out.push_back(v);
    at = end + 1;
  }
  return out;
}

// The lengths `spec` reads as, any value.
std::vector<int64_t> read_lengths(const std::string& spec, int64_t seq_len,
                                  const std::string& what) {
  if (is_list(spec)) return parse_list(spec, seq_len, what);
  TokenFileInfo f;
  try {
    f = inspect_token_file(spec);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format(
        "{}: a file of lengths is written as token files are (a 1-D .npy of integers, or an "
        "llm.c .bin with its header; a raw .bin is neither): {}",
        what, e.what()));
  }
  if (f.count > seq_len)
    throw ConfigError(fmt::format("{}: {} holds {} lengths, more than a sequence of {} tokens has",
                                  what, spec, f.count, seq_len));
  // Lengths are read as ids in [0, seq_len]; parse_doc_lens refuses a 0. The token reader's
  // "token X at index I is outside the vocabulary" is said as the length it is.
  std::vector<int32_t> ids(static_cast<size_t>(f.count));
  try {
    read_token_range(f, 0, f.count, std::min<int64_t>(seq_len + 1, INT32_MAX), ids.data());
  } catch (const ConfigError& e) {
    static const std::regex outside("token (-?[0-9]+) at index ([0-9]+) is outside");
    std::cmatch mt;
    if (std::regex_search(e.what(), mt, outside))
      throw ConfigError(
          fmt::format("{}: {}: document {} has length {}; a length must lie in [1, {}]", what, spec,
                      mt[2].str(), mt[1].str(), seq_len));
    throw ConfigError(
        fmt::format("{}: a document length must lie in [1, {}]: {}", what, seq_len, e.what()));
  }
  return std::vector<int64_t>(ids.begin(), ids.end());
}

}  // namespace

std::vector<int64_t> parse_doc_lens(const std::string& spec, int64_t seq_len,
                                    const std::string& what) {
  std::vector<int64_t> lens = read_lengths(spec, seq_len, what);
  for (size_t i = 0; i < lens.size(); ++i)
    if (lens[i] < 1 || lens[i] > seq_len)
      throw ConfigError(fmt::format("{}: document {} has length {}; a length must lie in [1, {}]",
                                    what, i, lens[i], seq_len));
  return lens;
}

std::shared_ptr<const Documents> documents_from(const std::string& spec, int64_t seq_len,
                                                const std::string& what) {
  if (spec.empty()) return nullptr;
  const std::vector<int64_t> lens = parse_doc_lens(spec, seq_len, what);
  return std::make_shared<const Documents>(lens, seq_len, what);
}

}  // namespace upipe
