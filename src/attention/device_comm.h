// The communicator a rank's strategies, decoder and trainer talk through on a device. On the CPU
// device memory is host memory, so it is the world itself. On a GPU, by UPIPE_CUDA_COMM:
//   auto (default)  where every rank has its own GPU (decided collectively: one rank on a GPU, or
//                   a node of GPUs with a rank each) the routed communicator (comm/routed/): a
//                   call whose buffers are all device memory runs on NCCL, ordered after the
//                   compute stream; one with a host buffer (a loss, a norm, a flag) on the staged
//                   communicator; elsewhere (ranks sharing a GPU) the staged communicator alone;
//   nccl            the routed communicator, refused on every rank alike where NCCL cannot run;
//   staged          the host-staged communicator over the world (comm/staged/: every buffer goes
//                   device -> pinned host -> MPI -> device on the compute stream; copies use
//                   cudaMemcpyDefault, so host values pass through it too): correct for any
//                   number of ranks per GPU.
// UPIPE_STAGED_COMM=1 puts the CPU on the staged path too (memcpy copies), UPIPE_STAGED_COMM=routed
// on the routed one (an MPI group for NCCL, the device arena's blocks for device memory), to test
// them. It lives here because it is the first module that sees both comm and backend.
#pragma once

#include <memory>

#include "backend/device.h"
#include "comm/communicator.h"

namespace upipe {

class DeviceCopier;

class DeviceComm {
 public:
  // Collective over world on a GPU (the NCCL decision and set-up).
  DeviceComm(Device& dev, Communicator& world);
  ~DeviceComm();
  DeviceComm(const DeviceComm&) = delete;
  DeviceComm& operator=(const DeviceComm&) = delete;
  Communicator& get() { return *use_; }
  operator Communicator&() { return *use_; }

 private:
  std::unique_ptr<DeviceCopier> copier_;
  std::unique_ptr<Communicator> nccl_, staged_;  // the routed communicator's two (outlive own_)
  std::unique_ptr<Communicator> own_;
  Communicator* use_;
};

}  // namespace upipe
