// The private communicator of MpiRuntime::fail_job (a duplicate of MPI_COMM_WORLD, so its
// messages never match the job's own collectives), made and freed by MpiRuntime.
#pragma once

namespace upipe {

void init_fail_comm();
void free_fail_comm();

}  // namespace upipe
