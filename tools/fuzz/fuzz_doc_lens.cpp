// libFuzzer harness: document lengths (--doc-lens) for a sequence of 512 tokens, from a file
// (.npy or .bin of lengths) and, when the input is short text, as the list itself ("100,12,400").
// Every length read lies in [1, 512]. Seeds: tests/fixtures/hf/*/doc_lens.npy and a list.
#include <algorithm>

#include "fuzz_common.h"
#include "model/doc_lens.h"

using namespace upipe;

namespace {

constexpr int64_t kSeqLen = 512;

void lengths(const std::string& spec) {
  fuzz::refused_or_read([&] {
    for (int64_t n : parse_doc_lens(spec, kSeqLen))
      fuzz::require(n >= 1 && n <= kSeqLen, "a length outside [1, seq_len]");
    documents_from(spec, kSeqLen);
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::as_text(data, size);
  lengths(fuzz::write_file("doc_lens", text));
  // A spec that names a file is the case above; only what reads as a list is tried as one.
  if (size < 512 && !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
        return c == ',' || (c >= '0' && c <= '9') || c == ' ';
      }))
    lengths(std::string(text));
  return 0;
}
