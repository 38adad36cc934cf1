// The NCCL communicator (comm/nccl) on real ranks. Where NCCL cannot run (no GPU: these build
// machines, whose cudaGetDeviceCount fails with "CUDA driver version is insufficient") the GPU
// tests skip with that reason, and what needs no GPU still runs: the reason's text, the refusal
// on every rank, the shared-GPU rule. On GPUs, every collective check of comm_checks.h runs on
// device memory, the counters equal the fake backend's replay (mpi_comm's rules), and
// non-blocking results reach a compute stream through NcclWork::wait_on. The staged communicator
// with the CudaCopier (what ranks sharing a GPU, the decoder and the trainer use) runs the same
// checks on any number of ranks per GPU, in order with a compute stream.
#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <vector>

#include "comm/nccl/cuda_copier.h"
#include "comm/nccl/nccl_comm.h"
#include "comm/staged/staged_comm.h"
#include "core/check.h"
#include "core/errors.h"
#include "multirank/comm_checks.h"
#include "multirank/mpi_test_main.h"

namespace upipe {
namespace {

using test::exercise;
using test::world;

void cuda_ok(cudaError_t rc, const char* what) {
  UPIPE_CHECK(rc == cudaSuccess, "{}: {}", what, cudaGetErrorString(rc));
}

int visible_gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Why this job cannot run the GPU tests ("" when it can): NCCL unavailable, or fewer GPUs than
// ranks (NCCL refuses two ranks on one GPU). Every rank gets the same answer.
std::string gpu_skip_reason() {
  std::string why = nccl_unavailable_reason();
  float cannot = why.empty() ? 0.0f : 1.0f;
  world().all_reduce(&cannot, 1, DType::kF32, ReduceOp::kMax);
  if (!why.empty()) return why;
  if (cannot > 0) return "NCCL cannot run on another rank";
  const int n = visible_gpus();
  if (n < world().size())
    return fmt::format("needs one GPU per rank: {} ranks, {} GPUs", world().size(), n);
  return {};
}

// Why this job cannot run the staged communicator on GPUs ("" when every rank sees one; ranks may
// share it). Every rank gets the same answer.
std::string no_gpu_reason() {
  const bool mine = visible_gpus() > 0;
  float cannot = mine ? 0.0f : 1.0f;
  world().all_reduce(&cannot, 1, DType::kF32, ReduceOp::kMax);
  if (!mine) return nccl_unavailable_reason();
  return cannot > 0 ? "no GPU on another rank" : "";
}

#define SKIP_WITHOUT_GPUS()                     \
  do {                                          \
    const std::string why_ = gpu_skip_reason(); \
    if (!why_.empty()) GTEST_SKIP() << why_;    \
  } while (0)

// Staging the other way round: the checks of comm_checks.h pass host buffers, and this copier
// stages them in device memory (to_host uploads into the staging buffer, to_device downloads
// from it, the staging buffer is cudaMalloc'd), so a StagedCommunicator over NCCL hands NCCL
// device buffers holding exactly the checks' data.
class UploadCopier final : public DeviceCopier {
 public:
  void to_host(void* staging, const void* user, int64_t bytes) override {
    cuda_ok(cudaMemcpyAsync(staging, user, size_t(bytes), cudaMemcpyHostToDevice, nullptr),
            "upload");
  }
  void to_device(void* user, const void* staging, int64_t bytes) override {
    cuda_ok(cudaMemcpyAsync(user, staging, size_t(bytes), cudaMemcpyDeviceToHost, nullptr),
            "download");
  }
  void sync() override { cuda_ok(cudaStreamSynchronize(nullptr), "sync"); }
  void* alloc_host(int64_t bytes) override {
    void* p = nullptr;
    cuda_ok(cudaMalloc(&p, size_t(bytes)), "cudaMalloc");
    return p;
  }
  void free_host(void* p, int64_t) override { cuda_ok(cudaFree(p), "cudaFree"); }
};

TEST(NcclComm, UnavailableReasonNamesTheMissingGpu) {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  const std::string why = nccl_unavailable_reason();
  if (rc != cudaSuccess) {
    EXPECT_EQ(why, std::string("no GPU: cudaGetDeviceCount failed: ") + cudaGetErrorString(rc));
  } else if (n == 0) {
    EXPECT_EQ(why, "no GPU: cudaGetDeviceCount found 0 devices");
  } else {
    EXPECT_EQ(why, "");
  }
}

// Without a GPU every rank refuses alike (an Error, so the job ends by the clean path), with the
// reason in the message.
TEST(NcclComm, EveryRankRefusesWithoutAGpu) {
  const std::string why = nccl_unavailable_reason();
  if (why.empty()) GTEST_SKIP() << "a GPU is visible";
  try {
    make_nccl_comm(world(), 0);
    ADD_FAILURE() << "make_nccl_comm succeeded without a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

TEST(NcclComm, RanksSharingAGpuAreFoundByUuid) {
  using Uuid = std::array<uint8_t, 16>;
  const Uuid a{1}, b{2}, c{3};
  EXPECT_EQ(ranks_sharing_gpu(std::vector<Uuid>{}), std::make_pair(-1, -1));
  EXPECT_EQ(ranks_sharing_gpu(std::vector<Uuid>{a, b, c}), std::make_pair(-1, -1));
  EXPECT_EQ(ranks_sharing_gpu(std::vector<Uuid>{a, b, c, b, a}), std::make_pair(1, 3));
  EXPECT_EQ(ranks_sharing_gpu(std::vector<Uuid>{a, a}), std::make_pair(0, 1));
}

// More ranks than GPUs: make_nccl_comm refuses on every rank and names the staged communicator.
TEST(NcclComm, RanksSharingAGpuAreRefused) {
  const std::string why = nccl_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const int gpus = visible_gpus();
  if (world().size() <= gpus) GTEST_SKIP() << "every rank has its own GPU";
  try {
    make_nccl_comm(world(), world().rank() % gpus);
    ADD_FAILURE() << "make_nccl_comm accepted two ranks on one GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("staged communicator"), std::string::npos) << e.what();
  }
}

TEST(NcclComm, PassesTheCollectiveChecksOnDeviceMemory) {
  SKIP_WITHOUT_GPUS();
  auto nccl = make_nccl_comm(world(), world().rank());
  EXPECT_EQ(nccl->backend(), "nccl");
  UploadCopier up;
  StagedCommunicator s(*nccl, up);
  exercise(s, true);
  test::exercise_overlap(s);
  test::exercise_grid_split(s);
}

// The same calls on NCCL and on MPI: the same counters (mpi_comm's rules); the staged wrapper
// counts what NCCL counts.
TEST(NcclComm, CountsWhatMpiCounts) {
  SKIP_WITHOUT_GPUS();
  auto nccl = make_nccl_comm(world(), world().rank());
  UploadCopier up;
  StagedCommunicator s(*nccl, up);
  nccl->reset_stats();
  exercise(s, true);
  test::exercise_overlap(s);
  world().reset_stats();  // after make_nccl_comm's own MPI calls
  exercise(world(), true);
  test::exercise_overlap(world());
  test::expect_same_stats(nccl->stats(), world().stats(), "nccl vs mpi");
  test::expect_same_stats(s.stats(), nccl->stats(), "staged(nccl) vs nccl");
}

// Queues a 64 MiB upload of rank + 1 on `compute` (after a memset of zeros), then runs
// collectives(dev, gathered, count): an all-gather of dev into gathered and an in-place all-reduce
// sum of dev, each in order with the compute stream; checks what reaches the host through it.
void check_ordered_with(cudaStream_t compute, int r, int n,
                        const std::function<void(float*, float*, int64_t)>& collectives) {
  const int64_t count = int64_t(1) << 24;  // 64 MiB of fp32: the upload takes milliseconds
  float* host = nullptr;
  float* dev = nullptr;
  float* gathered = nullptr;
  cuda_ok(cudaMallocHost(&host, size_t(count) * 4), "cudaMallocHost");
  cuda_ok(cudaMalloc(&dev, size_t(count) * 4), "cudaMalloc");
  cuda_ok(cudaMalloc(&gathered, size_t(count) * 4 * size_t(n)), "cudaMalloc");
  cuda_ok(cudaMemsetAsync(dev, 0, size_t(count) * 4, compute), "memset");
  for (int64_t i = 0; i < count; ++i) host[i] = float(r + 1);
  cuda_ok(cudaMemcpyAsync(dev, host, size_t(count) * 4, cudaMemcpyHostToDevice, compute), "up");
  collectives(dev, gathered, count);
  std::vector<float> all(size_t(count) * size_t(n));
  cuda_ok(cudaMemcpyAsync(all.data(), gathered, all.size() * 4, cudaMemcpyDeviceToHost, compute),
          "down gathered");
  cuda_ok(cudaMemcpyAsync(host, dev, size_t(count) * 4, cudaMemcpyDeviceToHost, compute), "down");
  cuda_ok(cudaStreamSynchronize(compute), "sync");
  const float want = float(n * (n + 1) / 2);
  for (int64_t i = 0; i < count; i += 4099) ASSERT_EQ(host[i], want) << i;
  EXPECT_EQ(host[count - 1], want);
  for (int q = 0; q < n; ++q) {
    const float* block = all.data() + size_t(q) * size_t(count);
    for (int64_t i = 0; i < count; i += 4099) ASSERT_EQ(block[i], float(q + 1)) << q << " " << i;
    EXPECT_EQ(block[count - 1], float(q + 1)) << q;
  }
  cuda_ok(cudaFree(gathered), "cudaFree");
  cuda_ok(cudaFree(dev), "cudaFree");
  cuda_ok(cudaFreeHost(host), "cudaFreeHost");
}

// The comm stream waits for the compute stream's work before reading (a large upload queued on
// the compute stream just before the call), and a non-blocking result reaches a compute stream
// through wait_on without the host waiting; destroying the handed-over Work does not block.
// An all-reduce in place (the sum of every rank's upload) and an all-gather out of place: on one
// rank NCCL runs the first as nothing and the second as a copy on its stream, so only the copy
// can see an upload the comm stream did not wait for (it would copy the memset's zeros).
TEST(NcclComm, OrdersWithTheComputeStream) {
  SKIP_WITHOUT_GPUS();
  auto comm = make_nccl_comm(world(), world().rank());
  auto& nccl = dynamic_cast<NcclCommunicator&>(*comm);
  cudaStream_t compute = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "stream");
  nccl.set_compute_stream(compute);
  check_ordered_with(compute, nccl.rank(), nccl.size(),
                     [&](float* dev, float* gathered, int64_t count) {
                       {
                         auto g = nccl.iall_gather(dev, gathered, count * 4);
                         dynamic_cast<NcclWork&>(*g).wait_on(compute);
                       }
                       auto w = nccl.iall_reduce(dev, count, DType::kF32, ReduceOp::kSum);
                       dynamic_cast<NcclWork&>(*w).wait_on(compute);
                     });
  cuda_ok(cudaStreamDestroy(compute), "stream destroy");
}

// A compute stream on this rank's GPU (rank % GPUs: ranks may share one), for the staged tests.
class ComputeStream {
 public:
  ComputeStream() {
    cuda_ok(cudaSetDevice(world().rank() % visible_gpus()), "cudaSetDevice");
    cuda_ok(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "stream");
  }
  ~ComputeStream() { cudaStreamDestroy(s_); }
  ComputeStream(const ComputeStream&) = delete;
  ComputeStream& operator=(const ComputeStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// The staged communicator as the GPU ranks use it (CudaCopier: pinned staging, copies on a
// non-blocking compute stream, cudaMemcpyDefault): every check of comm_checks.h, whose buffers
// are host memory, passes through the copier's staging unchanged.
TEST(StagedCudaComm, PassesTheCollectiveChecks) {
  const std::string why = no_gpu_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  ComputeStream compute;
  CudaCopier copier(compute.get());
  StagedCommunicator s(world(), copier);
  EXPECT_EQ(s.backend(), "staged(" + world().backend() + ")");
  world().reset_stats();
  exercise(s, true);
  test::exercise_overlap(s);
  test::expect_same_stats(s.stats(), world().stats(), "staged vs its inner communicator");
  test::exercise_grid_split(s);
}

// On device buffers: the staging copy follows the compute stream's work (a 64 MiB upload queued
// just before the call; reading before it would stage the memset's zeros), and the results are
// on the device when the call returns, for the compute stream's next copy.
TEST(StagedCudaComm, OrdersWithTheComputeStream) {
  const std::string why = no_gpu_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  ComputeStream compute;
  CudaCopier copier(compute.get());
  StagedCommunicator s(world(), copier);
  check_ordered_with(compute.get(), s.rank(), s.size(),
                     [&](float* dev, float* gathered, int64_t count) {
                       s.all_gather(dev, gathered, count * 4);
                       s.all_reduce(dev, count, DType::kF32, ReduceOp::kSum);
                     });
}

}  // namespace
}  // namespace upipe
