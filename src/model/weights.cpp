#include "model/weights.h"

#include <filesystem>
#include <vector>

#include "backend/tensor_ops.h"
#include "core/rng.h"
#include "model/hf_names.h"
#include "model/safetensors.h"

namespace upipe {

bool has_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  return !dir.empty() && fs::is_directory(dir) &&
         (fs::exists(fs::path(dir) / "model.safetensors") ||
          fs::exists(fs::path(dir) / "model.safetensors.index.json"));
}

void param_values(const HfTensorSpec& s, int index, const SafetensorsReader* reader,
                  uint64_t seed, int64_t first, int64_t count, float* dst) {
  UPIPE_CHECK(first >= 0 && count >= 0 && first + count <= s.numel(),
              "elements [{}, {}) of {} with {}", first, first + count, s.name, s.numel());
  if (reader != nullptr) {
    reader->read_range(s.name, first, count, DType::kF32, dst);
  } else if (s.shape.size() == 1) {
    std::fill(dst, dst + count, 1.0f);  // RMSNorm weights
  } else {
    const uint64_t stream = seed * 1000003 + uint64_t(index) + 1;
    for (int64_t i = 0; i < count; ++i) dst[i] = float(0.02 * normal_at(stream, uint64_t(first + i)));
  }
}

ParamMap load_params(Device& dev, const ModelConfig& m, const std::string& dir, DType dtype,
                     uint64_t seed) {
  ParamMap p = allocate_params(dev, m, dtype, Tag::kParams);
  if (!dev.backend().computes()) return p;
  const bool from_file = has_checkpoint(dir);
  std::unique_ptr<SafetensorsReader> reader;
  if (from_file) reader = std::make_unique<SafetensorsReader>(dir);
  const std::vector<HfTensorSpec> specs = hf_tensors(m);
  for (size_t i = 0; i < specs.size(); ++i) {
    const HfTensorSpec& s = specs[i];
    std::vector<float> host(static_cast<size_t>(s.numel()));
    if (from_file)
      reader->read(s.name, s.shape, DType::kF32, host.data());  // checks name and shape
    else
      param_values(s, int(i), nullptr, seed, 0, s.numel(), host.data());
    upload(dev, host.data(), p.at(s.name));
  }
  return p;
}

}  // namespace upipe
