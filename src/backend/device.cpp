#include "backend/device.h"

namespace upipe {

Device::Device(const DeviceOptions& opt)
    : backend_(make_backend(opt.kind, opt.plans_for)),
      mem_backing_(backend_->make_device_allocator()),
      host_backing_(backend_->make_host_allocator()),
      mem_(std::make_unique<Arena>("device", opt.device_budget, *mem_backing_)),
      host_(std::make_unique<Arena>("host", opt.host_budget, *host_backing_)) {}

Device::~Device() {
  // A failing sync here (a device already in error) must not terminate the unwinding that
  // destroys this device; the error was reported where it happened.
  try {
    backend_->sync(Stream{});
  } catch (...) {
  }
}

}  // namespace upipe
