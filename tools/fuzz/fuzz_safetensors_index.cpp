// libFuzzer harness: a sharded checkpoint's model.safetensors.index.json (SafetensorsReader on
// its directory), beside two good shards the harness writes once (model-00001-of-00002 holds
// model.a.weight F32 [2,3] and model.b.weight BF16 [4]; model-00002-of-00002 model.e.weight F32
// [8]). Seeds: the index of those shards, and variants (tools/fuzz/seeds.py).
#include <filesystem>
#include <vector>

#include "fuzz_common.h"
#include "model/safetensors.h"

using namespace upipe;

namespace {

void write_shards() {
  std::vector<float> a(6, 1.5f), e(8, -2.0f);
  std::vector<uint16_t> b(4, 0x3f80);
  write_safetensors((fuzz::scratch() / "model-00001-of-00002.safetensors").string(),
                    {{"model.a.weight", DType::kF32, {2, 3}, a.data()},
                     {"model.b.weight", DType::kBF16, {4}, b.data()}});
  write_safetensors((fuzz::scratch() / "model-00002-of-00002.safetensors").string(),
                    {{"model.e.weight", DType::kF32, {8}, e.data()}});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool shards = (write_shards(), true);
  (void)shards;
  fuzz::write_file("model.safetensors.index.json", fuzz::as_text(data, size));
  fuzz::refused_or_read([&] {
    const SafetensorsReader r(fuzz::scratch().string());
    for (const std::string& name : r.names()) {
      const SafetensorsTensor& t = r.tensor(name);
      fuzz::require(t.file >= 0 && size_t(t.file) < r.files().size(), "a tensor of no shard");
      fuzz::require(t.offset >= 0 && t.offset + t.nbytes <=
                                         int64_t(std::filesystem::file_size(r.files()[t.file])),
                    "a tensor outside its shard");
      std::vector<float> v(size_t(t.numel));
      r.read(name, t.shape, DType::kF32, v.data());
    }
  });
  return 0;
}
