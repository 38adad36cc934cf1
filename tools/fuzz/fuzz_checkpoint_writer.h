// The real checkpoint writer (save_checkpoint) run in a fuzz harness: the ranks of a world as
// threads of this process, with a communicator between them of the collectives the writer uses.
// fuzz_checkpoint_files writes its seeds with it, fuzz_export_tokenizer the checkpoint it exports.
#pragma once

#include <fmt/format.h>

#include <barrier>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "fuzz_common.h"
#include "model/config.h"
#include "train/checkpoint.h"
#include "train/zero.h"

namespace upipe::fuzz {

// The collectives save_checkpoint uses (all_gather, broadcast, barrier) between threads; any other
// call aborts: the writer's use of it would need another seed maker.
struct Rendezvous {
  explicit Rendezvous(int n) : size(n), sync(n), slots(size_t(n)) {}
  int size;
  std::barrier<> sync;
  std::vector<std::vector<char>> slots;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(Rendezvous& r, int rank) : r_(r), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return r_.size; }
  std::string backend() const override { return "threads"; }
  void all_gather(const void* send, void* recv, int64_t bytes) override {
    post(send, bytes);
    for (int q = 0; q < r_.size; ++q)
      std::memcpy(static_cast<char*>(recv) + q * bytes, r_.slots[size_t(q)].data(), size_t(bytes));
    r_.sync.arrive_and_wait();
  }
  void broadcast(void* buf, int64_t bytes, int root) override {
    post(buf, bytes);
    std::memcpy(buf, r_.slots[size_t(root)].data(), size_t(bytes));
    r_.sync.arrive_and_wait();
  }
  void barrier() override { r_.sync.arrive_and_wait(); }
  void all_to_all(const void*, void*, int64_t) override { std::abort(); }
  void all_to_allv(const void*, const int64_t*, const int64_t*, void*, const int64_t*,
                   const int64_t*) override {
    std::abort();
  }
  void reduce_scatter(const void*, void*, int64_t, DType, ReduceOp) override { std::abort(); }
  void all_reduce(void*, int64_t, DType, ReduceOp) override { std::abort(); }
  void sendrecv(const void*, int64_t, int, void*, int64_t, int) override { std::abort(); }
  std::unique_ptr<Work> iall_to_all(const void*, void*, int64_t) override { std::abort(); }
  std::unique_ptr<Work> iall_gather(const void*, void*, int64_t) override { std::abort(); }
  std::unique_ptr<Work> ireduce_scatter(const void*, void*, int64_t, DType, ReduceOp) override {
    std::abort();
  }
  std::unique_ptr<Work> iall_reduce(void*, int64_t, DType, ReduceOp) override { std::abort(); }
  std::unique_ptr<Work> isendrecv(const void*, int64_t, int, void*, int64_t, int) override {
    std::abort();
  }
  std::unique_ptr<Communicator> split(const SplitRule&) override { std::abort(); }

 private:
  // This rank's bytes in its slot, seen by every rank after the barrier.
  void post(const void* p, int64_t bytes) {
    r_.slots[size_t(rank_)].assign(static_cast<const char*>(p),
                                   static_cast<const char*>(p) + bytes);
    r_.sync.arrive_and_wait();
  }
  Rendezvous& r_;
  int rank_;
};

// A model small enough that its checkpoint is a fuzz input (about 10 KB): 1 layer, hidden size 8.
inline ModelConfig small_model(int64_t vocab) {
  return parse_model_config(
      fmt::format(R"({{"model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": {}, "max_position_embeddings": 64, "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "tie_word_embeddings": false, "torch_dtype": "float32"}})",
                  vocab),
      "the fuzz harness's model");
}

// The checkpoint of `step` of model m that `world` threads write under dir (save_checkpoint, run
// file `run_toml`); returns its step directory.
inline std::string write_checkpoint(const std::string& dir, const ModelConfig& m, int world,
                                    int64_t step, const std::string& run_toml) {
  Rendezvous r(world);
  std::string path;
  std::vector<std::thread> ranks;
  for (int q = 0; q < world; ++q)
    ranks.emplace_back([&, q] {
      ThreadCommunicator comm(r, q);
      Device dev;
      Zero3 z(dev, comm, m, DType::kF32);
      z.init(nullptr, 7);
      const std::string p = save_checkpoint({dir, "fuzz-run", 0}, step, z, world, run_toml);
      if (q == 0) path = p;
    });
  for (std::thread& t : ranks) t.join();
  return path;
}

}  // namespace upipe::fuzz
