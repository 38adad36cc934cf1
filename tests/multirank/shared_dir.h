// A temporary directory every rank of a communicator sees (rank 0 makes it and broadcasts its
// path), removed when the test is done.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "comm/communicator.h"

namespace upipe::test {

class SharedDir {
 public:
  explicit SharedDir(Communicator& comm) : comm_(comm) {
    char buf[256] = {};
    if (comm.rank() == 0) {
      std::string tmpl = (std::filesystem::temp_directory_path() / "upipe_test_XXXXXX").string();
      if (!mkdtemp(tmpl.data())) ADD_FAILURE() << "mkdtemp failed";
      std::strncpy(buf, tmpl.c_str(), sizeof(buf) - 1);
    }
    comm.broadcast(buf, sizeof(buf), 0);
    path_ = buf;
  }
  ~SharedDir() {
    comm_.barrier();
    if (comm_.rank() == 0) std::filesystem::remove_all(path_);
  }
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
  std::string path() const { return path_; }

 private:
  Communicator& comm_;
  std::string path_;
};

}  // namespace upipe::test
