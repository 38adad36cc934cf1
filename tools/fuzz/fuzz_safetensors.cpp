// libFuzzer harness: one .safetensors file (SafetensorsReader), then every tensor it lists read
// whole and in a range, as a loader would. What opens must keep the reader's contract: each tensor
// inside its file and as large as its shape. Seeds: small files that write_safetensors writes
// (tools/fuzz/seeds.py: F32, BF16, F16 and a scalar, with __metadata__).
#include <filesystem>
#include <vector>

#include "fuzz_common.h"
#include "model/safetensors.h"

using namespace upipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string p = fuzz::write_file("model.safetensors", fuzz::as_text(data, size));
  fuzz::refused_or_read([&] {
    const SafetensorsReader r(p);
    for (const std::string& name : r.names()) {
      const SafetensorsTensor& t = r.tensor(name);
      int64_t numel = 1;
      for (int64_t d : t.shape) {
        fuzz::require(d >= 0, "a dimension below 0");
        numel *= d;
      }
      fuzz::require(numel == t.numel, "numel is not the product of the shape");
      fuzz::require(t.offset >= 0 && t.offset + t.nbytes <= int64_t(size),
                    "a tensor outside its file");
      std::vector<float> v(size_t(t.numel));
      r.read(name, t.shape, DType::kF32, v.data());
      if (t.numel > 1) r.read_range(name, 1, t.numel - 1, DType::kF32, v.data());
    }
  });
  return 0;
}
