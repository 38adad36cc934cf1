// The private communicator of MpiRuntime::fail_job (a duplicate of MPI_COMM_WORLD, so its
// messages never match the job's own collectives), made and freed by MpiRuntime.
#pragma once

#include <string>
#include <string_view>

namespace upipe {

// What makes two ranks' errors the same cause, printed once by the lowest of them: the text with
// the number of a rank's own file left out ("rank_00003.safetensors" -> "rank_#.safetensors"), so
// a full disk met by every rank writing its checkpoint file is one line, not one a rank.
std::string cause_key(std::string_view what);

void init_fail_comm();
void free_fail_comm();

}  // namespace upipe
