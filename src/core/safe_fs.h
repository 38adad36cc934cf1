// File operations for untrusted paths and for writers that must never replace what is not
// theirs. Every file a user names may be anything: a FIFO or a device (opening one for reading can
// block forever), a symlink to somewhere else, a directory, a file that is also the command's
// input. So:
//   - readers open with O_NONBLOCK and accept only a regular file (fstat on the descriptor, then
//     the flag is cleared): nothing can block before the file is known to be regular. Symlinks
//     are followed (a Hugging Face cache links every snapshot file to a blob).
//   - names read from an untrusted file (a shard in model.safetensors.index.json) are confined
//     to the directory of that file: relative, no "..", no empty or absolute name.
//   - writers refuse a target that exists and is a symlink or not a regular file, write to a
//     fresh temporary file beside it (O_EXCL | O_NOFOLLOW), check every write, fsync, rename over
//     the target and fsync the directory.
// Problems with what the user named are ConfigErrors naming the path; I/O failures are Errors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace upipe {

// A read-only descriptor of a regular file; `what` names the file's role in messages
// ("token file", "config.json").
class ReadFile {
 public:
  ReadFile(const std::string& path, const std::string& what);
  ~ReadFile();
  ReadFile(ReadFile&& o) noexcept;
  ReadFile& operator=(ReadFile&& o) noexcept;
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;

  int fd() const { return fd_; }
  int64_t size() const { return size_; }  // at open
  const std::string& path() const { return path_; }
  // Exactly n bytes at `offset` into dst; ConfigError naming the file when it ends first (it
  // shrank or is truncated) or the read fails.
  void read_at(void* dst, int64_t n, int64_t offset) const;
  // Releases the descriptor to the caller (who closes it).
  int release();

 private:
  std::string path_, what_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// The whole content of a small regular file, refused (before any allocation) when it is larger
// than max_bytes.
std::string read_small_file(const std::string& path, const std::string& what, int64_t max_bytes);

// `name` from the untrusted file `source` as a path inside `dir`; ConfigError when it is empty,
// absolute, has a ".." component or more than 1024 characters.
std::string confined_path(const std::string& dir, const std::string& name,
                          const std::string& source);

// ConfigError when `path` exists and is a symlink or not a regular file (a FIFO, a device, a
// directory): a writer would replace it.
void check_replaceable(const std::string& path, const std::string& what);

// Whether a and b name the same existing file (device and inode, symlinks followed).
bool same_file(const std::string& a, const std::string& b);

// A file written atomically: bytes go to a fresh temporary file beside `path`; commit() fsyncs
// it, checks the target again and renames it over `path`, then fsyncs the directory. Destroyed
// without commit(), the temporary file is removed and `path` is untouched.
class AtomicFile {
 public:
  AtomicFile(const std::string& path, const std::string& what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* src, int64_t n);  // Error on a failed or short write (a full disk)
  void write(std::string_view s) { write(s.data(), int64_t(s.size())); }
  // Writes at an offset already written (a header completed at the end).
  void write_at(const void* src, int64_t n, int64_t offset);
  void commit();
  const std::string& temp_path() const { return tmp_; }

 private:
  // n bytes at `offset`, or appended when offset < 0, retried until all are written.
  void put(const void* src, int64_t n, int64_t offset);

  std::string path_, what_, tmp_;
  int fd_ = -1;
};

// Writes `text` to `path` through an AtomicFile.
void write_file_atomic(const std::string& path, std::string_view text, const std::string& what);

// fsync of a directory (a rename or create inside it made durable); Error when it fails.
void fsync_directory(const std::string& dir);

}  // namespace upipe
