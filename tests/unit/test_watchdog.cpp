// The watchdog's logic in one process (its thread, scopes, message, default action) and the stop
// flag's signal handling. The multi-rank behaviour is tests/multirank/job_end.sh.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <mutex>
#include <string>
#include <thread>

#include "comm/mpi/fail_job.h"
#include "core/check.h"
#include "core/stop_signal.h"
#include "core/watchdog.h"

namespace upipe {
namespace {

using std::chrono::milliseconds;

std::mutex g_mu;
std::string g_message;  // the last message the test action received
int g_fired = 0;

void record(const std::string& m) {
  std::lock_guard lock(g_mu);
  g_message = m;
  ++g_fired;
}

int fired() {
  std::lock_guard lock(g_mu);
  return g_fired;
}

class WatchdogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_log_rank(1);
    std::lock_guard lock(g_mu);
    g_message.clear();
    g_fired = 0;
  }
  void TearDown() override {
    Watchdog::stop();
    set_log_rank(-1);
  }
};

TEST_F(WatchdogTest, FiresInAStuckOperationNamingRankOpAndContext) {
  Watchdog::start(0.4, record);
  EXPECT_EQ(Watchdog::timeout_s(), 0.4);
  WatchdogContext step("step 12");
  WatchdogContext phase("attention forward");
  WatchdogOp op("all_to_all");
  std::this_thread::sleep_for(milliseconds(1200));
  ASSERT_GE(fired(), 1);
  std::lock_guard lock(g_mu);
  EXPECT_EQ(g_message, "upipe: rank 1 (host " + host_name() +
                           "): no progress for 0.4 s in all_to_all (step 12, attention forward) "
                           "— a rank is stuck, dead or unreachable (a link or step that slow "
                           "needs a larger --timeout); ending the job");
}

TEST_F(WatchdogTest, FiresInAStepOutsideAnyOperation) {
  Watchdog::start(0.4, record);
  WatchdogContext step("step 3");
  std::this_thread::sleep_for(milliseconds(1200));
  ASSERT_GE(fired(), 1);
  std::lock_guard lock(g_mu);
  EXPECT_NE(g_message.find("no progress for 0.4 s in step 3 — "), std::string::npos) << g_message;
}

TEST_F(WatchdogTest, BeatsAndShortOperationsAreProgress) {
  Watchdog::start(1.0, record);
  WatchdogContext step("step 1");
  const auto end = std::chrono::steady_clock::now() + milliseconds(2500);
  for (int i = 0; std::chrono::steady_clock::now() < end; ++i) {
    if (i % 2 == 0) {
      watchdog_beat();
    } else {
      WatchdogOp op("barrier");
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(fired(), 0);
}

TEST_F(WatchdogTest, IdleOutsideEveryScopeNeverFires) {
  Watchdog::start(0.3, record);
  { WatchdogOp op("all_reduce"); }
  std::this_thread::sleep_for(milliseconds(1000));
  EXPECT_EQ(fired(), 0);
}

TEST_F(WatchdogTest, StoppedOrZeroTimeoutNeverFires) {
  Watchdog::start(0.3, record);
  Watchdog::stop();
  EXPECT_EQ(Watchdog::timeout_s(), 0);
  Watchdog::start(0, record);
  EXPECT_EQ(Watchdog::timeout_s(), 0);
  WatchdogOp op("all_gather");
  std::this_thread::sleep_for(milliseconds(800));
  EXPECT_EQ(fired(), 0);
}

TEST_F(WatchdogTest, NestedOperationRestoresTheOuterName) {
  WatchdogOp outer("sendrecv");
  { WatchdogOp inner("all_reduce"); }
  EXPECT_NE(Watchdog::message(5).find("no progress for 5 s in sendrecv — "), std::string::npos)
      << Watchdog::message(5);
}

TEST(WatchdogDeathTest, DefaultActionEndsTheProcessWithItsStatus) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Watchdog::start(0.2);
        WatchdogOp op("barrier");
        std::this_thread::sleep_for(std::chrono::seconds(30));
      },
      ::testing::ExitedWithCode(kWatchdogExitCode), "no progress for 0.2 s in barrier");
}

TEST(StopSignal, SignalsSetTheFlagOnce) {
  install_stop_handlers();
  clear_stop_request();
  EXPECT_FALSE(stop_requested());
  for (int sig : {SIGTERM, SIGINT, SIGUSR1, SIGUSR2}) {
    std::raise(sig);
    EXPECT_TRUE(stop_requested());
    EXPECT_EQ(stop_signal(), sig);
    clear_stop_request();
    install_stop_handlers();  // the handler resets after each delivery
  }
}

TEST(StopSignalDeathTest, ASecondSignalEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_stop_handlers();
        std::raise(SIGTERM);
        if (!stop_requested()) std::_Exit(3);
        std::raise(SIGTERM);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGTERM), "");
}

}  // namespace
// Ranks failing alike print one line: errors that differ only in the number of a rank's own file
// (a full disk met by every rank writing its checkpoint file) are one cause; other text is kept.
TEST(FailJob, CausesDifferingOnlyInARanksFileAreOne) {
  const std::string r0 = "cannot write /ck/step_00000002.tmp/rank_00000.safetensors: No space left";
  const std::string r7 = "cannot write /ck/step_00000002.tmp/rank_00007.safetensors: No space left";
  EXPECT_EQ(cause_key(r0), cause_key(r7));
  EXPECT_EQ(cause_key(r0), "cannot write /ck/step_00000002.tmp/rank_#.safetensors: No space left");
  EXPECT_NE(cause_key(r0), cause_key("cannot write /ck/step_00000003.tmp/rank_00000.safetensors: "
                                     "No space left"));
  EXPECT_EQ(cause_key("rank_"), "rank_");
  EXPECT_EQ(cause_key("frank_x rank_12"), "frank_x rank_#");
}

}  // namespace upipe
