#include "backend/device.h"

namespace upipe {

Device::Device(const DeviceOptions& opt)
    : backend_(make_backend(opt.kind, opt.plans_for)),
      mem_backing_(backend_->make_device_allocator()),
      host_backing_(backend_->make_host_allocator()),
      mem_(std::make_unique<Arena>("device", opt.device_budget, *mem_backing_)),
      host_(std::make_unique<Arena>("host", opt.host_budget, *host_backing_)) {}

}  // namespace upipe
