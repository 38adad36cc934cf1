// libFuzzer harness: parse_json_strict, the JSON parser of every file upipe reads (config.json,
// safetensors headers, index files, checkpoint metadata), and the excerpt its errors quote.
// Seeds: the fixtures' JSON files.
#include "core/strict_json.h"
#include "fuzz_common.h"

using namespace upipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::refused_or_read([&] {
    const nlohmann::json j = parse_json_strict(fuzz::as_text(data, size), "fuzz.json", 4096);
    // At most 80 bytes of the text, then how many more there were.
    fuzz::require(json_excerpt(j).size() <= 80 + 40, "an excerpt longer than asked");
  });
  return 0;
}
