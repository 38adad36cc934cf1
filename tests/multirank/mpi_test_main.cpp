#include "multirank/mpi_test_main.h"

namespace upipe::test {
std::unique_ptr<Communicator> g_world;
Communicator& world() {
  return *g_world;
}
}  // namespace upipe::test

int main(int argc, char** argv) {
  upipe::MpiRuntime mpi(&argc, &argv);
  upipe::test::g_world = mpi.world();
  ::testing::InitGoogleTest(&argc, argv);
  if (upipe::test::g_world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  int any = rc != 0, worst = 0;
  MPI_Allreduce(&any, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  upipe::test::g_world.reset();
  return worst;
}
