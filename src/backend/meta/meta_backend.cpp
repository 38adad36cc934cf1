#include "backend/meta/meta_backend.h"

namespace upipe {

std::unique_ptr<Allocator> MetaBackend::make_device_allocator() const {
  return std::make_unique<MetaAllocator>();
}

std::unique_ptr<Allocator> MetaBackend::make_host_allocator() const {
  return std::make_unique<MetaAllocator>();
}

}  // namespace upipe
