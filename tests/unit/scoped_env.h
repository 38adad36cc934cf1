// An environment variable set for one scope (a test's backend mode, e.g. UPIPE_CPU_COPIES), and
// unset again when the scope ends, so the next test sees the process's environment.
#pragma once

#include <stdlib.h>

namespace upipe {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

}  // namespace upipe
