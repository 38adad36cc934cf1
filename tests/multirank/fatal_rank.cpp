// A program in which one rank fails a CHECK while the others wait in a collective: the job
// must end with a non-zero status (through MPI_Abort), not hang. Run by ctest via mpirun with
// a timeout (see tests/CMakeLists.txt).
#include "comm/mpi/mpi_comm.h"
#include "core/check.h"

int main(int argc, char** argv) {
  upipe::MpiRuntime mpi(&argc, &argv);
  auto world = mpi.world();
  if (world->rank() == world->size() - 1) UPIPE_CHECK(false, "deliberate failure on the last rank");
  world->barrier();
  return 0;
}
