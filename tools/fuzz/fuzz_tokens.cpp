// libFuzzer harness: a token file, .npy or llm.c .bin (told apart by the magic), through every
// entry point: its header (inspect_token_file), a check of its ids, all of them read, and a
// window. Every id read lies in the vocabulary (256). Seeds: tests/fixtures/hf/*/tokens.npy and
// .bin files of width 2 and 4 (tools/fuzz/seeds.py).
#include <filesystem>
#include <vector>

#include "fuzz_common.h"
#include "model/tokens.h"

using namespace upipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr int64_t kVocab = 256;
  const std::string p = fuzz::write_file("tokens", fuzz::as_text(data, size));
  fuzz::refused_or_read([&] {
    const TokenFileInfo info = inspect_token_file(p);
    fuzz::require(info.count >= 0 && info.data_offset >= 0, "a negative count or offset");
    fuzz::require(info.data_offset + info.count * info.width <= int64_t(size),
                  "ids past the end of the file");
    check_token_ids(info, info.count, kVocab);
    const std::vector<int32_t> ids = read_tokens(p, kVocab);
    fuzz::require(int64_t(ids.size()) == info.count, "read_tokens' count is not the header's");
    for (int32_t id : ids) fuzz::require(id >= 0 && id < kVocab, "an id outside the vocabulary");
    if (info.count > 2) {
      std::vector<int32_t> mid(size_t(info.count - 2));
      read_token_range(info, 1, info.count - 2, kVocab, mid.data());
      fuzz::require(std::equal(mid.begin(), mid.end(), ids.begin() + 1), "a window differs");
    }
  });
  return 0;
}
