#include "train/time_limit.h"

#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace upipe {

double process_age_s() {
  std::ifstream stat("/proc/self/stat");
  const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  timespec boot{};
  const size_t name_end = text.rfind(')');  // the name may hold spaces and parentheses
  if (::clock_gettime(CLOCK_BOOTTIME, &boot) != 0 || name_end == std::string::npos) return 0;
  std::istringstream fields(text.substr(name_end + 1));
  std::string f;
  // Field 22, starttime (clock ticks after boot); the fields after the name begin at field 3.
  for (int i = 3; i <= 22 && (fields >> f); ++i)
    if (i == 22) {
      const double ticks = double(::sysconf(_SC_CLK_TCK));
      const double age = double(boot.tv_sec) + 1e-9 * double(boot.tv_nsec) -
                         std::strtod(f.c_str(), nullptr) / (ticks > 0 ? ticks : 100);
      return age > 0 ? age : 0;
    }
  return 0;
}

TimeLimit::TimeLimit(int64_t limit_s, double now, double age)
    : set_(limit_s > 0), deadline_(now - age + double(limit_s)) {}

bool TimeLimit::stop_after_step(double now, const TimeLimitCosts& c, bool validation_due,
                                bool checkpoint_due) const {
  if (!set_) return false;
  const double going_on = (validation_due ? c.validation : 0) +
                          (checkpoint_due ? c.checkpoint : 0) + c.next_step + c.validation +
                          c.checkpoint;
  return now + going_on > deadline_;
}

}  // namespace upipe
