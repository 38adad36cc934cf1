#include "core/device.h"

#include <cstring>

namespace upipe {

const char* device_kind_name(DeviceKind k) {
  return k == DeviceKind::kCpu ? "cpu" : "meta";
}

Device::Device(const DeviceOptions& opt) : kind_(opt.kind) {
  if (kind_ == DeviceKind::kMeta) {
    mem_backing_ = std::make_unique<MetaAllocator>();
    host_backing_ = std::make_unique<MetaAllocator>();
  } else {
    mem_backing_ = std::make_unique<HostCachingAllocator>();
    host_backing_ = std::make_unique<HostCachingAllocator>();
  }
  mem_ = std::make_unique<Arena>("device", opt.device_budget, *mem_backing_);
  host_ = std::make_unique<Arena>("host", opt.host_budget, *host_backing_);
}

void Device::copy(void* dst, const void* src, int64_t bytes) {
  if (is_meta() || bytes == 0) return;
  std::memcpy(dst, src, size_t(bytes));
}

void Device::fill_zero(void* dst, int64_t bytes) {
  if (is_meta() || bytes == 0) return;
  std::memset(dst, 0, size_t(bytes));
}

}  // namespace upipe
