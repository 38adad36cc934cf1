#include "comm/communicator.h"

#include <array>
#include <utility>
#include <vector>

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

namespace {

// Runs `check`, returning its failure: {text, 1} for a ConfigError, {text, 2} for any other, and
// {"", 0} when it passed.
std::pair<std::string, int64_t> failure_of(const std::function<void()>& check) {
  try {
    check();
    return {"", 0};
  } catch (const ConfigError& e) {
    return {e.what(), 1};
  } catch (const std::exception& e) {  // a failed read, bad_alloc: every rank ends alike too
    return {e.what(), 2};
  }
}

// Collective: throws on every rank the failure `root` broadcasts (none when kind is 0 there).
void throw_from(Communicator& world, int root, std::string err, int64_t kind) {
  if (world.rank() == root && kind != 0 && err.empty())
    err = fmt::format("a check on rank {} failed", root);
  int64_t head[2] = {int64_t(err.size()), kind};  // the text's length, its kind
  world.broadcast(head, sizeof head, root);
  if (head[1] == 0) return;
  err.resize(size_t(head[0]));
  world.broadcast(err.data(), head[0], root);
  if (head[1] == 1) throw ConfigError(err);
  throw Error(err);
}

}  // namespace

std::string broadcast_string(Communicator& world, std::string s, int root) {
  int64_t n = int64_t(s.size());
  world.broadcast(&n, sizeof n, root);
  s.resize(size_t(n));
  world.broadcast(s.data(), n, root);
  return s;
}

std::vector<std::string> host_names(Communicator& world) {
  constexpr size_t kMax = 256;
  std::array<char, kMax> mine{};
  host_name().copy(mine.data(), kMax - 1);
  std::vector<char> all(kMax * size_t(world.size()));
  world.all_gather(mine.data(), all.data(), int64_t(kMax));
  std::vector<std::string> names;
  for (size_t r = 0; r < size_t(world.size()); ++r) names.emplace_back(all.data() + r * kMax);
  return names;
}

void on_rank0_everywhere(Communicator& world, const std::function<void()>& check) {
  auto [err, kind] = world.rank() == 0 ? failure_of(check) : std::pair<std::string, int64_t>{};
  throw_from(world, 0, std::move(err), kind);
}

void on_every_rank_everywhere(Communicator& world, const std::function<void()>& check) {
  auto [err, kind] = failure_of(check);
  std::vector<int64_t> kinds(size_t(world.size()));
  world.all_gather(&kind, kinds.data(), sizeof kind);
  for (int r = 0; r < world.size(); ++r)
    if (kinds[size_t(r)] != 0) return throw_from(world, r, std::move(err), kind);
}

}  // namespace upipe
