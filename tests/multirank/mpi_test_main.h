// main() for multi-rank gtest binaries: MPI is initialised once, every rank runs every test,
// and only rank 0 prints gtest's report (other ranks print failures only). A failure on any
// rank makes that rank exit non-zero, so mpirun does too; ctest's timeout bounds a mismatch.
#pragma once

#include <gtest/gtest.h>

#include "comm/mpi/mpi_comm.h"

namespace upipe::test {

// The world communicator of the test process.
Communicator& world();

}  // namespace upipe::test
