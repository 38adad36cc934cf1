// core/safe_fs and core/strict_json: readers open FIFOs and devices without blocking and refuse
// them, names from untrusted files stay inside their directory, writers refuse symlinks and
// non-regular targets and leave the target untouched when they fail, a full disk is an error, a
// repeated JSON key is an error. Each test would hang, pass a bad file through or replace the
// wrong thing if its guard were removed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>

#include "core/errors.h"
#include "core/safe_fs.h"
#include "core/strict_json.h"
#include "unit/expect_config_error.h"
#include "unit/temp_dir.h"

namespace upipe {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Runs f on another thread; fails (and leaks the thread, which the process exit ends) when it
// does not return within 5 s: a reader that blocks.
void expect_returns(const std::function<void()>& f) {
  auto done = std::async(std::launch::async, f);
  if (done.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "blocked for 5 s";
    std::_Exit(1);  // the blocked thread cannot be joined
  }
  done.get();
}

TEST(SafeFs, ReadersRefuseFifosWithoutBlocking) {
  TempDir d;
  const std::string fifo = d.file("weights.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  expect_returns([&] {
    expect_config_error([&] { ReadFile f(fifo, "token file"); }, {fifo, "a FIFO"});
  });
  expect_returns(
      [&] { expect_config_error([&] { read_small_file(fifo, "config.json", 100); }, {"a FIFO"}); });
  expect_config_error([&] { ReadFile f(d.path().string(), "config.json"); }, {"a directory"});
  expect_config_error([&] { ReadFile f("/dev/null", "run file"); }, {"a character device"});
  expect_config_error([&] { ReadFile f(d.file("none"), "run file"); },
                      {"cannot open run file", "No such file"});
}

TEST(SafeFs, ReadFileFollowsSymlinksToRegularFiles) {
  TempDir d;
  d.write("blob", "0123456789");
  fs::create_symlink(d.file("blob"), d.file("link"));  // as a Hugging Face cache links blobs
  const ReadFile f(d.file("link"), "safetensors file");
  EXPECT_EQ(f.size(), 10);
  char buf[4];
  f.read_at(buf, 4, 6);
  EXPECT_EQ(std::string(buf, 4), "6789");
  expect_config_error([&] { f.read_at(buf, 4, 8); }, {"truncated"});
  expect_config_error([&] { read_small_file(d.file("blob"), "config.json", 9); },
                      {"10 bytes", "more than the 9"});
}

TEST(SafeFs, ConfinedPathsStayInTheirDirectory) {
  EXPECT_EQ(confined_path("/m", "model-00001-of-00002.safetensors", "idx"),
            "/m/model-00001-of-00002.safetensors");
  EXPECT_EQ(confined_path("/m", "sub/a.safetensors", "idx"), "/m/sub/a.safetensors");
  for (const std::string bad : {"../x.safetensors", "/etc/passwd", "a/../../b", "", ".."})
    expect_config_error([&] { confined_path("/m", bad, "index.json"); },
                        {"index.json", "not a relative name inside /m"});
  // Names from the file are quoted as excerpts; a name past 1024 characters (a file's name it is
  // not: "./" 1500 times then a shard's name opened, and was quoted whole) is refused.
  for (const std::string& bad : {"/" + std::string(3000, 'a'), std::string(3000, 'a'), [] {
                                  std::string dots;
                                  for (int i = 0; i < 1500; ++i) dots += "./";
                                  return dots + "model.safetensors";
                                }()}) {
    try {
      confined_path("/m", bad, "index.json");
      ADD_FAILURE() << "a name of " << bad.size() << " characters was not refused";
    } catch (const ConfigError& e) {
      EXPECT_LT(std::string(e.what()).size(), 2000u) << e.what();
      EXPECT_NE(std::string(e.what()).find("index.json: the path"), std::string::npos) << e.what();
    }
  }
}

TEST(SafeFs, WritersRefuseSymlinksAndSpecialFiles) {
  TempDir d;
  const std::string victim = d.write("victim", "keep me");
  fs::create_symlink(victim, d.file("link"));
  ASSERT_EQ(::mkfifo(d.file("fifo").c_str(), 0644), 0);
  fs::create_directory(d.file("dir"));
  for (const char* name : {"link", "fifo", "dir"})
    expect_config_error([&] { write_file_atomic(d.file(name), "new", "metrics file"); },
                        {"refusing to write metrics file", d.file(name)});
  EXPECT_EQ(slurp(victim), "keep me");
  EXPECT_TRUE(fs::is_symlink(d.file("link")));
  EXPECT_TRUE(fs::is_fifo(d.file("fifo")));
  expect_config_error([&] { write_file_atomic("/dev/null", "x", "token file"); },
                      {"a character device"});
  // A regular file is replaced atomically, and nothing else is left in the directory.
  write_file_atomic(victim, "replaced", "test file");
  EXPECT_EQ(slurp(victim), "replaced");
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path()), fs::directory_iterator()), 4)
      << "victim, link, fifo, dir and no temporary";
}

TEST(SafeFs, AtomicFileLeavesTheTargetUntouchedUntilCommit) {
  TempDir d;
  const std::string target = d.write("out", "old");
  std::string tmp;
  {
    AtomicFile f(target, "test file");
    f.write("new content");
    tmp = f.temp_path();
    EXPECT_TRUE(fs::exists(tmp));
    EXPECT_EQ(slurp(target), "old");
  }  // no commit: the temporary goes, the target stays
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_EQ(slurp(target), "old");
  AtomicFile f(target, "test file");
  f.write("0123456789");
  const char patch[] = "AB";
  f.write_at(patch, 2, 3);
  f.commit();
  EXPECT_EQ(slurp(target), "012AB56789");
}

// A write that fails (here: past RLIMIT_FSIZE, EFBIG, as a full disk gives ENOSPC) is an Error
// naming the file it was for, and the target never appears. In a child process: the limit is per process.
TEST(SafeFs, AFailedWriteIsAnError) {
  TempDir d;
  const std::string target = d.file("ckpt");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const struct rlimit lim = {4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    int status = 1;
    try {
      AtomicFile f(target, "checkpoint file");
      f.write(std::string(1 << 20, 'x'));
      f.commit();
    } catch (const Error& e) {
      // It names the target, not its temporary (whose random suffix would make every rank's
      // message of one full disk a different line).
      const std::string what = e.what();
      status = what == "checkpoint file " + target + ": write failed: File too large" ? 0 : 2;
    }
    std::_Exit(fs::exists(target) ? 3 : status);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: no error, 2: another message, 3: the target appeared";
}

TEST(SafeFs, SameFile) {
  TempDir d;
  d.write("a", "x");
  d.write("b", "x");
  fs::create_symlink(d.file("a"), d.file("l"));
  EXPECT_TRUE(same_file(d.file("a"), d.file("l")));
  EXPECT_TRUE(same_file(d.file("a"), d.path().string() + "/./a"));
  EXPECT_FALSE(same_file(d.file("a"), d.file("b")));
  EXPECT_FALSE(same_file(d.file("a"), d.file("none")));
}

TEST(StrictJson, RepeatedKeysAreErrors) {
  EXPECT_EQ(parse_json_strict(R"({"a": 1, "b": {"a": 2}})", "x.json")["b"]["a"], 2);
  expect_config_error([] { parse_json_strict(R"({"a": 1, "a": 2})", "config.json"); },
                      {"config.json", "duplicate key 'a'"});
  expect_config_error(
      [] { parse_json_strict(R"({"t": {"dtype": "F32", "dtype": "I64"}})", "h.safetensors"); },
      {"duplicate key 'dtype'"});
  // A key as long as the file is quoted as an excerpt: the message stays under 2000 characters.
  {
    const std::string k(3000, 'k');
    try {
      parse_json_strict("{\"" + k + "\": 1, \"" + k + "\": 2}", "config.json");
      ADD_FAILURE() << "a repeated key of 3000 characters was not refused";
    } catch (const ConfigError& e) {
      EXPECT_LT(std::string(e.what()).size(), 2000u);
      EXPECT_NE(std::string(e.what()).find("duplicate key 'kkk"), std::string::npos) << e.what();
    }
  }
  // The same key in sibling objects is fine.
  EXPECT_NO_THROW(parse_json_strict(R"([{"a": 1}, {"a": 2}])", "x.json"));
  expect_config_error([] { parse_json_strict("{", "x.json"); },
                      {"x.json: not valid JSON: parse error at line 1"});
  EXPECT_THROW(
      {  // nlohmann's exception id is not the user's business
        try {
          parse_json_strict("{", "x.json");
        } catch (const ConfigError& e) {
          EXPECT_EQ(std::string(e.what()).find("json.exception"), std::string::npos) << e.what();
          throw;
        }
      },
      ConfigError);
  // A number no double holds is nlohmann::json's out_of_range, not a parse_error: a ConfigError
  // too.
  expect_config_error([] { parse_json_strict(R"({"a": 1e999})", "x.json"); },
                      {"x.json: not valid JSON", "number overflow"});
  // Python's json writes a float NaN or infinity as NaN / Infinity: said as such.
  for (const char* text : {R"({"a": 1, "foo": NaN})", R"({"x": [Infinity]})", R"({"x":-Infinity})"})
    expect_config_error(
        [&] { parse_json_strict(text, "config.json"); },
        {"config.json: not valid JSON", "NaN and Infinity, which Python's json writes"});
  expect_config_error([] { parse_json_strict(R"({"pad_token_id": None})", "config.json"); },
                      {"not valid JSON", "None, True and False are Python's"});
  for (const char* text : {R"({"a": nope})", R"({"a": Nothing})", R"({"a": Inf})"}) {
    try {
      parse_json_strict(text, "x.json");
      ADD_FAILURE() << text;
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).find("Python"), std::string::npos) << e.what();
    }
  }
}

// Nesting past kMaxJsonDepth is refused as it is read (a value nested 200000 deep, quoted in an
// error message by dump(), overflowed the stack: a segfault, no error line); a long token is
// quoted as an excerpt.
TEST(StrictJson, DeepNestingAndLongTokensAreBounded) {
  auto nested = [](int depth) {
    return "{\"a\": " + std::string(size_t(depth), '[') + std::string(size_t(depth), ']') + "}";
  };
  EXPECT_NO_THROW(parse_json_strict(nested(kMaxJsonDepth - 1), "x.json"));
  expect_config_error([&] { parse_json_strict(nested(kMaxJsonDepth), "x.json"); },
                      {"x.json: nested more than 64 deep"});
  expect_config_error([&] { parse_json_strict(nested(200000), "config.json"); },
                      {"config.json: nested more than 64 deep"});
  try {
    parse_json_strict("{\"" + std::string(1 << 20, 'y') + "\x01\": 1}", "h.safetensors");
    ADD_FAILURE() << "a control byte in a key was accepted";
  } catch (const ConfigError& e) {
    EXPECT_LT(std::string(e.what()).size(), 600u);
    EXPECT_NE(std::string(e.what()).find("more bytes)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(json_excerpt(nlohmann::json(std::string(1000, 'z')), 10),
            "\"zzzzzzzzz... (992 more bytes)");
}

// A file of many small values is refused as it is read, before nlohmann::json holds them all (a
// safetensors header of one 45-million-dimension shape took 1.7 GB). Every value counts: numbers,
// strings, keys' values, arrays and objects themselves.
TEST(StrictJson, ValueCountIsBounded) {
  // {"a": [1, 2, 3]} holds five values: the object, the array and its three numbers.
  EXPECT_EQ(parse_json_strict(R"({"a": [1, 2, 3]})", "x.json", 5)["a"].size(), 3u);
  expect_config_error([] { parse_json_strict(R"({"a": [1, 2, 3]})", "x.json", 4); },
                      {"x.json: more than 4 values"});
  expect_config_error([] { parse_json_strict(R"({"a": {}, "b": "s"})", "x.json", 2); },
                      {"x.json: more than 2 values"});
  // The default bound, kMaxJsonValues, against a shape of that many dimensions and one more.
  auto shape = [](int64_t n) {
    std::string s = R"({"t": {"dtype": "F32", "shape": [)";
    s.reserve(size_t(n) * 2 + 64);
    for (int64_t i = 0; i < n; ++i) s += i ? ",1" : "1";
    return s + "]}}";
  };
  // The object, "t", its dtype, the array: four values besides the dimensions.
  EXPECT_NO_THROW(parse_json_strict(shape(kMaxJsonValues - 4), "h.safetensors"));
  expect_config_error([&] { parse_json_strict(shape(kMaxJsonValues - 3), "h.safetensors"); },
                      {"h.safetensors: more than 8388608 values"});
}

}  // namespace
}  // namespace upipe
