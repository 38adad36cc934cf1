#include "backend/backend.h"

#include <cmath>
#include <numbers>

#ifndef UPIPE_HAVE_CUDA
#define UPIPE_HAVE_CUDA 0
#endif

#include "backend/cpu/cpu_backend.h"
#include "backend/meta/meta_backend.h"
#include "core/check.h"
#include "core/errors.h"
#if UPIPE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace upipe {

const char* backend_kind_name(BackendKind k) {
  switch (k) {
    case BackendKind::kCpu:
      return "cpu";
    case BackendKind::kMeta:
      return "meta";
    case BackendKind::kCuda:
      return "cuda";
  }
  return "?";
}

bool cuda_backend_built() {
  return UPIPE_HAVE_CUDA != 0;
}

bool cuda_device_available(std::string* why) {
#if UPIPE_HAVE_CUDA
  return cuda_available(why);
#else
  if (why != nullptr) *why = "this upipe was built without the CUDA backend (-DUPIPE_CUDA=ON)";
  return false;
#endif
}

std::string cuda_libraries() {
#if UPIPE_HAVE_CUDA
  return cuda_library_versions();
#else
  return {};
#endif
}

int64_t cuda_driver_used_bytes() {
#if UPIPE_HAVE_CUDA
  return cuda_used_bytes();
#else
  return -1;
#endif
}

BackendKind parse_backend_kind(const std::string& name) {
  if (name == "cpu") return BackendKind::kCpu;
  if (name == "cuda") {
    if (!cuda_backend_built())
      throw ConfigError(
          "backend cuda: this upipe was built without the CUDA backend; rebuild where nvcc is "
          "found (cmake -DUPIPE_CUDA=ON)");
    return BackendKind::kCuda;
  }
  throw ConfigError("backend '" + name + "' is unknown; choose cpu or cuda");
}

namespace {

// The backend a meta device asks: the target's queries, without its device.
std::unique_ptr<Backend> make_queries(BackendKind kind) {
#if UPIPE_HAVE_CUDA
  if (kind == BackendKind::kCuda)
    return std::make_unique<CudaBackend>(CudaBackend::Mode::kQueryOnly);
#endif
  return make_backend(kind);
}

}  // namespace

std::unique_ptr<Backend> make_backend(BackendKind kind, BackendKind plans_for) {
  switch (kind) {
    case BackendKind::kMeta:
      UPIPE_CHECK(plans_for != BackendKind::kMeta, "a meta backend plans for a computing backend");
      return std::make_unique<MetaBackend>(make_queries(plans_for));
    case BackendKind::kCuda:
#if UPIPE_HAVE_CUDA
      return std::make_unique<CudaBackend>();
#else
      parse_backend_kind("cuda");  // throws the error that names the build option
      break;
#endif
    case BackendKind::kCpu:
      break;
  }
  return std::make_unique<CpuBackend>();
}

std::vector<double> RopeParams::inv_freq(int d) const {
  std::vector<double> f(size_t(d / 2));
  for (int i = 0; i < d / 2; ++i) f[size_t(i)] = std::pow(theta, -2.0 * i / d);
  if (!scaling.enabled) return f;
  // Hugging Face transformers' rope_type "llama3" (_compute_llama3_parameters): wavelengths
  // longer than original/low_freq_factor are slowed by `factor`, shorter than
  // original/high_freq_factor kept, and those between interpolated smoothly.
  const RopeScaling& s = scaling;
  const double orig = double(s.original_max_position);
  const double low_wavelen = orig / s.low_freq_factor, high_wavelen = orig / s.high_freq_factor;
  for (double& v : f) {
    const double wavelen = 2 * std::numbers::pi / v;
    if (wavelen > low_wavelen) {
      v /= s.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      v = (1 - smooth) * v / s.factor + smooth * v;
    }
  }
  return f;
}

int64_t RowPositions::total_rows() const {
  int64_t n = 0;
  for (const Run& r : runs) n += r.rows;
  return n;
}

std::vector<int64_t> RowPositions::expand() const {
  std::vector<int64_t> v;
  v.reserve(size_t(total_rows()));
  for (const Run& r : runs)
    for (int64_t t = 0; t < r.rows; ++t) v.push_back(r.pos + t);
  return v;
}

}  // namespace upipe
