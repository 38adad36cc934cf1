#include "comm/communicator.h"

#include "core/check.h"
#include "core/errors.h"

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

SplitPlace split_place(const SplitRule& rule, int rank, int size) {
  UPIPE_CHECK(rank >= 0 && rank < size, "rank {} of {}", rank, size);
  const SplitKey me = rule(rank);
  SplitPlace p;
  for (int r = 0; r < size; ++r) {
    const SplitKey k = r == rank ? me : rule(r);
    UPIPE_CHECK(k.color >= 0 && k.key >= 0,
                "split rule gives rank {} color {} key {}; both must be "
                "non-negative",
                r, k.color, k.key);
    if (k.color != me.color) continue;
    ++p.size;
    if (k.key < me.key || (k.key == me.key && r < rank)) ++p.rank;
  }
  return p;
}

void Communicator::record_as(const Communicator& inner, CommOp op, const CommStats& before) {
  const CommStats& s = inner.stats();
  UPIPE_CHECK(s.calls_of(op) == before.calls_of(op) + 1,
              "the inner {} communicator recorded {} {} calls for one", inner.backend(),
              s.calls_of(op) - before.calls_of(op), comm_op_name(op));
  record(op, s.bytes_of(op) - before.bytes_of(op));
}

void on_rank0_everywhere(Communicator& world, const std::function<void()>& check) {
  std::string err;
  int64_t head[2] = {0, 0};  // the text's length; 1 for a ConfigError, 2 for any other failure
  if (world.rank() == 0) try {
      check();
    } catch (const ConfigError& e) {
      err = e.what();
      head[1] = 1;
    } catch (const std::exception& e) {  // a failed read, bad_alloc: every rank ends alike too
      err = e.what();
      head[1] = 2;
    }
  if (head[1] != 0 && err.empty()) err = "a check on rank 0 failed";
  head[0] = int64_t(err.size());
  world.broadcast(head, sizeof head, 0);
  if (head[1] == 0) return;
  err.resize(size_t(head[0]));
  world.broadcast(err.data(), head[0], 0);
  if (head[1] == 1) throw ConfigError(err);
  throw Error(err);
}

}  // namespace upipe
