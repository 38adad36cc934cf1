// The routed communicator (comm/routed) on real ranks: each call goes to its "device" communicator
// when every buffer it is given is device memory, else to its "host" one. Here both are MPI (the
// device one a split of the world spanning every rank, so their counters are apart) and "device
// memory" is one host array the classifier names: the routing, the counters and the results
// are what a GPU run with NCCL and the staged communicator gets, without a GPU.
#include <cstdint>
#include <vector>

#include "comm/routed/routed_comm.h"
#include "multirank/comm_checks.h"
#include "multirank/mpi_test_main.h"

namespace upipe {
namespace {

using test::exercise;
using test::world;

// The ranks' "device memory": pointers inside it are device pointers.
struct FakeDeviceMemory {
  std::vector<float> bytes = std::vector<float>(1 << 16);
  bool holds(const void* p) const {
    auto* b = reinterpret_cast<const char*>(bytes.data());
    auto* q = static_cast<const char*>(p);
    return q >= b && q < b + bytes.size() * sizeof(float);
  }
};

std::unique_ptr<Communicator> whole_world_group() {
  return world().split([](int q) { return SplitKey{0, q}; });
}

// Every buffer in device memory: every call (barriers aside) goes to the device communicator,
// passes the checks, and the router counts what MPI counts for the same calls.
TEST(RoutedComm, DeviceBuffersGoToTheDeviceCommunicator) {
  auto device = whole_world_group();
  RoutedCommunicator r(*device, world(), [](const void*) { return true; });
  EXPECT_EQ(r.backend(), "routed(mpi, mpi)");
  world().reset_stats();
  device->reset_stats();
  exercise(r, true);
  test::exercise_overlap(r);
  EXPECT_GT(r.device_calls(), 20);
  EXPECT_EQ(r.host_calls(), world().stats().calls_of(CommOp::kBarrier));
  EXPECT_EQ(device->stats().calls_of(CommOp::kBarrier), 0);
  const CommStats routed = r.stats();
  world().reset_stats();
  exercise(world(), true);
  test::exercise_overlap(world());
  test::expect_same_stats(routed, world().stats(), "routed vs mpi");
  test::exercise_grid_split(r);
}

// Host buffers: everything goes to the host communicator.
TEST(RoutedComm, HostBuffersGoToTheHostCommunicator) {
  auto device = whole_world_group();
  RoutedCommunicator r(*device, world(), [](const void*) { return false; });
  device->reset_stats();
  exercise(r, true);
  test::exercise_overlap(r);
  test::exercise_grid_split(r);
  EXPECT_EQ(r.device_calls(), 0);
  EXPECT_GT(r.host_calls(), 20);
  EXPECT_EQ(device->stats().total_calls(), 0);
}

// Call by call: all buffers in device memory -> device; any host buffer -> host (a device send
// into a host receive too); a null pointer (a zero-byte side) has no say. Results are right
// either way, and a split group routes alike and counts into its parent.
TEST(RoutedComm, EachCallGoesWhereItsBuffersAre) {
  FakeDeviceMemory mem;
  auto device = whole_world_group();
  RoutedCommunicator r(*device, world(), [&mem](const void* p) { return mem.holds(p); });
  const int n = r.size(), me = r.rank();
  float* d = mem.bytes.data();

  d[0] = float(me + 1);
  r.all_reduce(d, 1, DType::kF32, ReduceOp::kSum);
  EXPECT_EQ(d[0], float(n * (n + 1) / 2));
  EXPECT_EQ(r.device_calls(), 1);
  EXPECT_EQ(r.host_calls(), 0);

  float h = float(me + 1);
  r.all_reduce(&h, 1, DType::kF32, ReduceOp::kMax);
  EXPECT_EQ(h, float(n));
  EXPECT_EQ(r.host_calls(), 1);

  // Device send, host receive: host.
  std::vector<float> gathered(static_cast<size_t>(n));
  d[1] = float(10 * me);
  r.all_gather(d + 1, gathered.data(), sizeof(float));
  for (int q = 0; q < n; ++q) EXPECT_EQ(gathered[size_t(q)], float(10 * q));
  EXPECT_EQ(r.host_calls(), 2);
  EXPECT_EQ(r.device_calls(), 1);

  // A ring shift whose send side is empty on every rank: only the device receive has a say.
  r.sendrecv(nullptr, 0, (me + 1) % n, d + 2, 0, (me + n - 1) % n);
  EXPECT_EQ(r.device_calls(), 2);

  // Non-blocking, both device: device.
  d[3] = float(me);
  auto w = r.iall_reduce(d + 3, 1, DType::kF32, ReduceOp::kSum);
  w->wait();
  EXPECT_EQ(d[3], float(n * (n - 1) / 2));
  EXPECT_EQ(r.device_calls(), 3);
  EXPECT_EQ(r.stats().calls_of(CommOp::kAllReduce), 3);
  EXPECT_EQ(device->stats().calls_of(CommOp::kAllReduce), 2);

  // A group of all ranks: the same routing, its calls counted in the parent too.
  auto g = r.split([](int q) { return SplitKey{0, q}; });
  auto& group = dynamic_cast<RoutedCommunicator&>(*g);
  const int64_t before = r.stats().calls_of(CommOp::kAllReduce);
  d[4] = 1.0f;
  group.all_reduce(d + 4, 1, DType::kF32, ReduceOp::kSum);
  EXPECT_EQ(d[4], float(n));
  h = 1.0f;
  group.all_reduce(&h, 1, DType::kF32, ReduceOp::kSum);
  EXPECT_EQ(h, float(n));
  EXPECT_EQ(group.device_calls(), 1);
  EXPECT_EQ(group.host_calls(), 1);
  EXPECT_EQ(r.stats().calls_of(CommOp::kAllReduce), before + 2);
}

}  // namespace
}  // namespace upipe
