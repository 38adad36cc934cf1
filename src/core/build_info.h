// The identity of this build: the project version and the git commit it was built from (generated
// at every build by tools/build_info.cmake). `upipe --version` prints it, and every checkpoint's
// meta.json records the one that wrote it, so a result or a checkpoint names its code.
#pragma once

#include <string>

namespace upipe {

struct BuildInfo {
  const char* version;  // "0.1.0"
  const char* commit;   // 12 hex digits, or "unknown" (built outside a git checkout)
  bool dirty;           // tracked files differed from the commit when it was built
};

const BuildInfo& build_info();

// "0.1.0 (git 32a59b4c1d2e)", "0.1.0 (git 32a59b4c1d2e, modified)" or "0.1.0 (git unknown)".
inline std::string build_id() {
  const BuildInfo& b = build_info();
  return std::string(b.version) + " (git " + b.commit + (b.dirty ? ", modified)" : ")");
}

}  // namespace upipe
