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

ParamMap load_params(Device& dev, const ModelConfig& m, const std::string& dir, DType dtype,
                     uint64_t seed) {
  ParamMap p = allocate_params(dev, m, dtype, Tag::kParams);
  if (!dev.backend().computes()) return p;
  const bool from_file = has_checkpoint(dir);
  std::unique_ptr<SafetensorsReader> reader;
  if (from_file) reader = std::make_unique<SafetensorsReader>(dir);
  uint64_t stream = seed * 1000003;
  for (const HfTensorSpec& s : hf_tensors(m)) {
    std::vector<float> host(static_cast<size_t>(s.numel()));
    ++stream;
    if (from_file) {
      reader->read(s.name, s.shape, DType::kF32, host.data());
    } else if (s.shape.size() == 1) {
      std::fill(host.begin(), host.end(), 1.0f);  // RMSNorm weights
    } else {
      for (size_t i = 0; i < host.size(); ++i) host[i] = float(0.02 * normal_at(stream, i));
    }
    upload(dev, host.data(), p.at(s.name));
  }
  return p;
}

}  // namespace upipe
