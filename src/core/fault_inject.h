// Fault injection for the fault tests: UPIPE_INJECT_FAULT="PHASE@RANK[,PHASE@RANK...]" in the
// environment makes fault_point(PHASE) throw an Error on rank RANK (log_rank(); -1 before a
// communicator sets it), as a real failure there would. The phases upipe train names: startup,
// data, init, metrics, checkpoint, resume; upipe export: export. Unset, fault_point costs one
// load of a cached flag.
#pragma once

namespace upipe {

void fault_point(const char* phase);

}  // namespace upipe
