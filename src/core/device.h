// A rank's device: its kind (cpu, meta, later cuda), the device arena (simulated HBM on CPU,
// real HBM on GPU) and the host arena (offload target), and copies between them. Kernels
// dispatch on kind(); on meta they allocate their workspaces (so sizes are counted) and
// compute nothing.
#pragma once

#include <cstdint>
#include <memory>

#include "core/allocator.h"
#include "core/arena.h"

namespace upipe {

enum class DeviceKind { kCpu, kMeta };

struct DeviceOptions {
  DeviceKind kind = DeviceKind::kCpu;
  int64_t device_budget = int64_t(1) << 40;  // bytes
  int64_t host_budget = int64_t(1) << 40;    // bytes
};

class Device {
 public:
  explicit Device(const DeviceOptions& opt = {});
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  DeviceKind kind() const { return kind_; }
  bool is_meta() const { return kind_ == DeviceKind::kMeta; }
  Arena& mem() { return *mem_; }    // device arena
  Arena& host() { return *host_; }  // host arena

  // Byte copies within and between the arenas (device<->host is the offload path). On CPU a
  // memcpy; skipped on meta. A CUDA device will make these cudaMemcpyAsync on its stream.
  void copy(void* dst, const void* src, int64_t bytes);
  void fill_zero(void* dst, int64_t bytes);

 private:
  DeviceKind kind_;
  std::unique_ptr<Allocator> mem_backing_, host_backing_;
  std::unique_ptr<Arena> mem_, host_;
};

const char* device_kind_name(DeviceKind k);

}  // namespace upipe
