// expect_config_error(f, {parts}): f throws a one-line ConfigError containing every part.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/errors.h"

namespace upipe {

inline void expect_config_error(const std::function<void()>& f,
                                const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no ConfigError; expected one containing '" << parts.front() << "'";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
  }
}

}  // namespace upipe
