// A rank's device: its backend (cpu, meta, later cuda), the device arena (simulated HBM on CPU,
// real HBM on GPU) and the host arena (offload target), both backed by memory the backend
// provides. Everything that touches device memory goes through the backend: the op front-ends
// of this directory, and the copies below.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/backend.h"
#include "backend/work_count.h"
#include "core/arena.h"

namespace upipe {

struct DeviceOptions {
  BackendKind kind = BackendKind::kCpu;
  int64_t device_budget = int64_t(1) << 40;   // bytes
  int64_t host_budget = int64_t(1) << 40;     // bytes
  BackendKind plans_for = BackendKind::kCpu;  // meta: whose workspace sizes to count
};

class Device {
 public:
  explicit Device(const DeviceOptions& opt = {});
  // Waits for the backend's queued work (kernels, asynchronous copies) before the arenas and
  // their backing memory go: the members die in reverse order, arenas before the backend.
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  Backend& backend() const { return *backend_; }
  Arena& mem() { return *mem_; }    // device arena
  Arena& host() { return *host_; }  // host arena

  // Byte copies between or within the arenas, ordered on the default stream (device<->host is
  // the offload path).
  void copy(void* dst, const void* src, int64_t bytes, CopyKind kind) {
    if (bytes > 0) backend_->copy(dst, src, bytes, kind, Stream{});
  }
  // Asynchronous copies (Backend::copy_async's contract): as one queue in issue order; wait(t)
  // orders what is queued after it after copy t and every copy before it; wait_copies() after
  // every copy issued so far. Every ticket is waited on before its buffers are freed.
  CopyTicket copy_async(void* dst, const void* src, int64_t bytes, CopyKind kind) {
    if (bytes <= 0) return CopyTicket{};
    last_copy_ = backend_->copy_async(dst, src, bytes, kind);
    return last_copy_;
  }
  void wait(CopyTicket t) {
    if (t.id > 0) backend_->wait_copy(t);
  }
  void wait_copies() { wait(last_copy_); }

  // The GEMM and attention arithmetic issued on this device so far (work_count.h); a caller that
  // times a span of work resets it before.
  WorkCount& work() { return work_; }

 private:
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Allocator> mem_backing_, host_backing_;
  std::unique_ptr<Arena> mem_, host_;
  CopyTicket last_copy_;
  WorkCount work_;
};

}  // namespace upipe
