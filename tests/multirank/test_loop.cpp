// The training loop (src/train/loop.h) on real ranks: every step reaches the observer in order
// with its metrics (device and host peaks included), checkpoints come at the interval and after
// the last step, a resumed loop starts after the checkpoint's step and continues bitwise like an
// uninterrupted one, and a stop request on one rank stops every rank after the same step with a
// checkpoint.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <thread>

#include "core/stop_signal.h"
#include "multirank/mpi_test_main.h"
#include "multirank/shared_dir.h"
#include "train/loop.h"
#include "train/run_options.h"

namespace upipe {
namespace {

// What the loop told its observer.
struct Record final : TrainingObserver {
  std::vector<StepMetrics> steps;
  std::vector<int64_t> checkpoints;
  std::function<void(const StepMetrics&)> after_step;
  void on_step(const StepMetrics& m) override {
    steps.push_back(m);
    if (after_step) after_step(m);
  }
  void on_checkpoint(int64_t step, const std::string&) override { checkpoints.push_back(step); }
};

RunConfig small_run(const std::string& dir) {
  RunConfig c;
  c.model.name = "tiny";
  c.parallel.knobs.method = test::world().size() == 1 ? "local" : "upipe";
  c.train.seq_len = 64;
  c.train.micro_steps = 2;
  c.train.lr = 3e-3;
  c.memory.policy.tile_tokens = 32;
  c.memory.policy.offload_stash = true;  // the host arena's peak is reported too
  c.data.kind = "copy";
  c.checkpoint.dir = dir;
  c.checkpoint.keep = 10;
  validate(c);
  return c;
}

LoopEnd run_loop(const RunConfig& c, bool resume, Record& rec, int64_t* start = nullptr) {
  Device dev(device_options(c));
  TrainingLoop loop(dev, test::world(), load_model_config(c.model.name), c, resume);
  if (start) *start = loop.start().step;
  return loop.run(rec);
}

TEST(Loop, StepsCheckpointsAndMetrics) {
  test::SharedDir dir(test::world());
  RunConfig c = small_run(dir.path());
  c.train.steps = 5;
  c.checkpoint.interval = 2;
  Record rec;
  const LoopEnd end = run_loop(c, false, rec);
  EXPECT_EQ(end.last_step, 5);
  EXPECT_FALSE(end.stopped);
  ASSERT_EQ(rec.steps.size(), 5u);
  for (size_t i = 0; i < rec.steps.size(); ++i) {
    const StepMetrics& m = rec.steps[i];
    EXPECT_EQ(m.step, int64_t(i) + 1);
    EXPECT_TRUE(std::isfinite(m.loss) && m.loss > 0);
    ASSERT_TRUE(m.copy_loss.has_value());
    EXPECT_GT(m.peak_bytes, 0);
    EXPECT_GT(m.peak_by_tag.at("stash"), 0) << "the slots of the offloaded stash";
    EXPECT_GT(m.host_peak_bytes, 0);
    EXPECT_EQ(m.host_peak_by_tag.at("stash"), m.host_peak_bytes);
    EXPECT_EQ(m.budget_bytes, c.memory.device_bytes);
    EXPECT_GT(m.lr, 0);
  }
  EXPECT_EQ(rec.checkpoints, (std::vector<int64_t>{2, 4, 5}));
  EXPECT_EQ(end.first_group_loss, *rec.steps.front().copy_loss);
  EXPECT_EQ(end.last_group_loss, *rec.steps.back().copy_loss);
  for (const char* d : {"step_00000002", "step_00000004", "step_00000005"})
    EXPECT_TRUE(std::filesystem::exists(dir.path() + "/" + d + "/DONE")) << d;
}

TEST(Loop, ResumeContinuesLikeAnUninterruptedRun) {
  test::SharedDir a(test::world()), b(test::world());
  RunConfig straight = small_run(a.path());
  straight.train.steps = 4;
  Record all;
  run_loop(straight, false, all);
  RunConfig first = small_run(b.path());
  first.train.steps = 4;
  first.checkpoint.interval = 2;
  Record part;
  {
    // The same run stopped after step 2: a signal to the last rank during step 2 (here: right
    // after step 1's report) stops every rank once step 2 is done, every rank knowing which.
    part.after_step = [](const StepMetrics& m) {
      if (m.step == 1 && test::world().rank() == test::world().size() - 1) std::raise(SIGUSR1);
    };
    install_stop_handlers();
    const LoopEnd end = run_loop(first, false, part);
    clear_stop_request();
    EXPECT_TRUE(end.stopped);
    EXPECT_EQ(end.stop_signal, SIGUSR1);
    EXPECT_EQ(end.last_step, 2);
    EXPECT_EQ(part.steps.size(), 2u);
    EXPECT_EQ(part.checkpoints, (std::vector<int64_t>{2})) << "one checkpoint, at the stop";
  }
  Record rest;
  int64_t start = -1;
  const LoopEnd end = run_loop(first, true, rest, &start);
  EXPECT_EQ(start, 2);
  ASSERT_EQ(rest.steps.size(), 2u);
  EXPECT_EQ(rest.steps[0].step, 3);
  EXPECT_EQ(end.last_step, 4);
  // Bitwise the same losses and gradient norms as the uninterrupted run.
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(rest.steps[i].loss, all.steps[i + 2].loss) << "step " << i + 3;
    EXPECT_EQ(rest.steps[i].grad_norm, all.steps[i + 2].grad_norm) << "step " << i + 3;
    EXPECT_EQ(rest.steps[i].lr, all.steps[i + 2].lr);
  }
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(part.steps[i].loss, all.steps[i].loss);
}

// The held-out loss every val_interval steps and after the last, the same in a second run.
TEST(Loop, ValidationEveryIntervalAndAfterTheLast) {
  test::SharedDir dir(test::world());
  RunConfig c = small_run("");
  c.train.steps = 5;
  c.metrics.val_interval = 2;
  c.metrics.val_sequences = 3;
  std::vector<double> first;
  for (int run = 0; run < 2; ++run) {
    Record rec;
    run_loop(c, false, rec);
    ASSERT_EQ(rec.steps.size(), 5u);
    std::vector<double> val;
    for (const StepMetrics& m : rec.steps) {
      EXPECT_EQ(m.val_loss.has_value(), m.step == 2 || m.step == 4 || m.step == 5) << m.step;
      if (m.val_loss) {
        EXPECT_TRUE(std::isfinite(*m.val_loss) && *m.val_loss > 0);
        val.push_back(*m.val_loss);
      }
    }
    if (run == 0)
      first = val;
    else
      EXPECT_EQ(val, first) << "the held-out loss is deterministic";
  }
  EXPECT_NE(first[0], first[2]) << "the model trained between the validations";
}

// Validation sequences that do not divide over the DP replicas (3 on 2 or 4 replicas: one
// replica has fewer, or none) still validate every sequence once: the loss at lr 0 (the initial
// weights) equals the one of a single replica (all ranks one CP group) holding all three.
TEST(Loop, ValidationOfSequencesThatDoNotDivideOverTheReplicas) {
  RunConfig c = small_run("");
  c.train.steps = 1;
  c.train.lr = 0;
  c.metrics.val_interval = 1;
  c.metrics.val_sequences = 3;
  auto val_loss = [&](int cp_size, const std::string& method) {
    RunConfig r = c;
    r.parallel.cp_size = cp_size;
    r.parallel.knobs.method = method;
    validate(r);
    Record rec;
    run_loop(r, false, rec);
    EXPECT_EQ(rec.steps.size(), 1u);
    EXPECT_TRUE(rec.steps.back().val_loss.has_value());
    return rec.steps.back().val_loss.value_or(0.0);
  };
  const int n = test::world().size();
  const double replicas = val_loss(1, "local");  // DP = every rank
  const double one = val_loss(n, n == 1 ? "local" : "ulysses");
  EXPECT_TRUE(std::isfinite(replicas) && replicas > 0);
  EXPECT_NEAR(replicas, one, 1e-5 * one) << "DP " << n << " against one replica";
}

// train.time_limit, counted from the process's start: every rank stops after the same step with
// a checkpoint of it, before the limit (loosely: the next step is predicted by the longest so
// far), validations and checkpoints every 5 steps counted (a run that went on into them ended
// past its limit); a limit passed before the first step runs no step and writes nothing.
TEST(Loop, TimeLimitStopsEveryRankBeforeIt) {
  test::SharedDir dir(test::world());
  RunConfig c = small_run(dir.path());
  c.train.steps = 1000000;
  c.checkpoint.interval = 5;
  c.checkpoint.keep = 1;
  c.metrics.val_interval = 5;
  c.metrics.val_sequences = 64;
  // 3 s from now on rank 0's clock, the same limit on every rank.
  int64_t limit = int64_t(std::ceil(process_age_s())) + 3;
  test::world().broadcast(&limit, sizeof limit, 0);
  c.train.time_limit_s = limit;
  Record rec;
  const LoopEnd end = run_loop(c, false, rec);
  const double age = process_age_s();
  EXPECT_TRUE(end.stopped && end.time_limit);
  EXPECT_EQ(end.stop_signal, 0);
  EXPECT_GT(end.last_step, 1);
  EXPECT_EQ(int64_t(rec.steps.size()), end.last_step);
  ASSERT_FALSE(rec.checkpoints.empty());
  EXPECT_EQ(rec.checkpoints.back(), end.last_step) << "a checkpoint at the stop";
  EXPECT_TRUE(rec.steps.back().val_loss.has_value()) << "a validation at the stop";
  EXPECT_LT(age, double(limit) + 0.5) << "the loop ended past its limit";
  EXPECT_GT(age, double(limit) - 2.0) << "the loop stopped long before its limit";
  // The limit passed already (the same run resumed with it): no step, no checkpoint.
  while (process_age_s() <= double(limit) + 0.1)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Record again;
  const LoopEnd none = run_loop(c, true, again);
  EXPECT_TRUE(none.stopped && none.time_limit);
  EXPECT_EQ(none.last_step, end.last_step);
  EXPECT_TRUE(again.steps.empty());
  EXPECT_TRUE(again.checkpoints.empty());
}

TEST(Loop, ResumeWithoutACheckpointIsRefused) {
  test::SharedDir dir(test::world());
  RunConfig c = small_run(dir.path());
  Record rec;
  EXPECT_THROW(run_loop(c, true, rec), ConfigError);
  c.checkpoint.dir = "";
  EXPECT_THROW(run_loop(c, true, rec), ConfigError);
}

}  // namespace
}  // namespace upipe
