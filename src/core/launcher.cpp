#include "core/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "core/check.h"

namespace upipe {
namespace {

pid_t g_launcher = 0;  // set by end_with_launcher under an OpenMPI launcher

// Whether process p still runs after waiting up to `ms`; returns as soon as it ends (a pidfd
// becomes readable when its process terminates), or polls every 100 ms without pidfds.
bool still_there(pid_t p, long ms) {
  const int pidfd = int(::syscall(SYS_pidfd_open, p, 0));
  if (pidfd >= 0) {
    pollfd w = {pidfd, POLLIN, 0};
    int r;
    while ((r = ::poll(&w, 1, int(ms))) < 0 && errno == EINTR) {
    }
    ::close(pidfd);
    return r == 0;
  }
  for (long t = 0; t < ms; t += 100) {
    if (::kill(p, 0) != 0) return false;
    const timespec ts = {0, 100 * 1000000L};
    ::nanosleep(&ts, nullptr);
  }
  return ::kill(p, 0) == 0;
}

}  // namespace

void end_with_launcher() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) return;
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The parent may have exited before prctl: then this process has been reparented already.
  if (::getppid() != parent) ::_exit(128 + SIGKILL);
  g_launcher = parent;
}

bool started_by_launcher() {
  return g_launcher > 1;
}

void guard_launcher(int grace_s) {
  const pid_t launcher = g_launcher;
  if (launcher <= 1) return;
  char msg[256], err[64];
  const int n =
      std::snprintf(msg, sizeof msg,
                    "upipe: rank %d: the job's launcher (pid %d) did not end the job %d s "
                    "after this rank did (a host unreachable?); killing it\n",
                    log_rank(), int(launcher), grace_s);
  std::snprintf(err, sizeof err, "/proc/%d/fd/2", int(launcher));
  if (::fork() != 0) return;  // this process goes on ending itself (a failed fork: no guard)
  ::setsid();                 // out of the rank's process group, which the launcher may kill
  // Nothing of the rank held open: its output pipes and MPI's sockets close with the rank.
  ::syscall(SYS_close_range, 0u, ~0u, 0u);
  if (!still_there(launcher, grace_s * 1000L)) ::_exit(0);
  // On the launcher's own stderr (the user's terminal or log): the rank's output went through
  // the launcher, which no longer forwards it.
  const int fd = ::open(err, O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
  if (fd >= 0 && n > 0 && ::write(fd, msg, size_t(n)) < 0) ::_exit(1);
  ::kill(launcher, SIGKILL);  // SIGTERM during its abort can crash mpirun 4.1 (status 139)
  ::_exit(0);
}

void guard_launcher_after_end() {
  const pid_t launcher = g_launcher;
  if (launcher <= 1) return;
  char path[64], name[32] = {};
  std::snprintf(path, sizeof path, "/proc/%d/comm", int(launcher));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  const ssize_t n = ::read(fd, name, sizeof name - 1);
  ::close(fd);
  if (n <= 0) return;
  if (name[n - 1] == '\n') name[n - 1] = '\0';
  static const char* const kLaunchers[] = {"mpirun",  "mpiexec", "orterun",
                                           "prterun", "orted",   "prted"};
  for (const char* l : kLaunchers)
    if (std::strcmp(name, l) == 0) return guard_launcher(kLauncherEndGraceSeconds);
}

}  // namespace upipe
