// How a job ends when a rank hangs, dies or is asked to stop; driven by tests/multirank/job_end.sh
// under mpirun. Every mode runs steps of a little work and one all-reduce, like a training loop.
//   stop T     the last rank stops itself (SIGSTOP) at step 3; the others wait in the
//              all-reduce, and their watchdog (timeout T s) must end the job naming it.
//   sleep T    the last rank hangs inside step 3 outside any collective (sleeps); the watchdog
//              must end the job, naming the step on the hanging rank or the all-reduce elsewhere.
//   kill       the last rank kills itself (SIGKILL) at step 3, no watchdog: mpirun must end the
//              job by itself.
//   signal     install_stop_handlers(); each step all-reduces (max) the stop flag, and every rank
//              that sees it set prints "rank R: clean stop after step N" and exits 0.
// Each rank prints "rank R pid P ready" once its handlers are installed.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "comm/mpi/mpi_comm.h"
#include "core/stop_signal.h"
#include "core/watchdog.h"

int main(int argc, char** argv) {
  using namespace upipe;
  MpiRuntime mpi(&argc, &argv);
  auto world = mpi.world();
  const std::string mode = argc > 1 ? argv[1] : "";
  const int rank = world->rank();
  const bool last = rank == world->size() - 1;
  if (mode == "stop" || mode == "sleep") Watchdog::start(argc > 2 ? std::atof(argv[2]) : 3);
  if (mode == "signal") install_stop_handlers();
  std::printf("rank %d pid %d ready\n", rank, int(getpid()));
  std::fflush(stdout);
  world->barrier();

  for (int step = 1; step <= 100000; ++step) {
    WatchdogContext ctx("step " + std::to_string(step));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the step's compute
    if (step == 3 && last) {
      if (mode == "stop") std::raise(SIGSTOP);
      if (mode == "kill") std::raise(SIGKILL);
      if (mode == "sleep") std::this_thread::sleep_for(std::chrono::hours(1));
    }
    float flag = stop_requested() ? 1.f : 0.f;
    world->all_reduce(&flag, 1, DType::kF32, ReduceOp::kMax);
    if (flag != 0) {
      std::printf("rank %d: clean stop after step %d\n", rank, step);
      std::fflush(stdout);
      return 0;
    }
  }
  return 1;  // no mode may run all its steps: a signal, the watchdog or mpirun ends it first
}
