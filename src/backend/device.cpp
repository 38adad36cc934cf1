#include "backend/device.h"

#include <cstdio>
#include <exception>

#include "core/check.h"
#include "core/setting_ref.h"

namespace upipe {

Device::Device(const DeviceOptions& opt)
    : backend_(make_backend(opt.kind, opt.plans_for)),
      mem_backing_(backend_->make_device_allocator()),
      host_backing_(backend_->make_host_allocator()),
      mem_(std::make_unique<Arena>("device", opt.device_budget, *mem_backing_)),
      host_(std::make_unique<Arena>("host", opt.host_budget, *host_backing_)) {
  // The budgets are settings (memory.device_memory, memory.host_memory): an out-of-memory error
  // names them.
  mem_->set_budget_setting(setting_ref("memory.device_memory"));
  host_->set_budget_setting(setting_ref("memory.host_memory"));
}

Device::~Device() {
  // A failing sync here must not terminate the unwinding that destroys this device. While an
  // error unwinds, the device is usually in that error (reported where it happened); otherwise it
  // is an asynchronous fault of the last queued work that no checked call saw: said here, since
  // nothing else would say it.
  try {
    backend_->sync(Stream{});
  } catch (const std::exception& e) {
    if (std::uncaught_exceptions() == 0)
      std::fprintf(stderr, "[rank %d] the %s device failed after its last checked call: %s\n",
                   log_rank(), backend_kind_name(backend_->kind()), e.what());
  } catch (...) {
  }
}

}  // namespace upipe
