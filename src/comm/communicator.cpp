#include "comm/communicator.h"

namespace upipe {

const char* comm_op_name(CommOp op) {
  static const char* kNames[] = {"all_to_all", "all_to_allv", "all_gather", "reduce_scatter",
                                 "all_reduce", "broadcast",   "sendrecv",   "barrier"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == kNumCommOps);
  return kNames[static_cast<int>(op)];
}

int64_t CommStats::total_bytes() const {
  int64_t s = 0;
  for (int64_t b : bytes_sent) s += b;
  return s;
}

int64_t CommStats::total_calls() const {
  int64_t s = 0;
  for (int64_t c : calls) s += c;
  return s;
}

}  // namespace upipe
