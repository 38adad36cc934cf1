#include "core/safe_fs.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/errors.h"

namespace upipe {
namespace {

namespace fs = std::filesystem;

const char* kind_name(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symlink";
  return "not a regular file";
}

std::string parent_dir(const std::string& path) {
  const std::string d = fs::path(path).parent_path().string();
  return d.empty() ? "." : d;
}

// The process's umask, read once (umask() can only be read by setting it).
mode_t process_umask() {
  static const mode_t m = [] {
    const mode_t old = ::umask(022);
    ::umask(old);
    return old;
  }();
  return m;
}

}  // namespace

ReadFile::ReadFile(const std::string& path, const std::string& what) : path_(path), what_(what) {
  // O_NONBLOCK: opening a FIFO with no writer, or some devices, would otherwise block here.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd_ < 0)
    throw ConfigError(fmt::format("cannot open {} {}: {}", what, path, std::strerror(errno)));
  struct stat st;
  const bool stat_ok = ::fstat(fd_, &st) == 0;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    const std::string kind = stat_ok ? kind_name(st.st_mode) : "unreadable";
    ::close(fd_);
    fd_ = -1;
    throw ConfigError(fmt::format("{} {} is {}, not a regular file", what, path, kind));
  }
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  size_ = int64_t(st.st_size);
}

ReadFile::~ReadFile() {
  if (fd_ >= 0) ::close(fd_);
}

ReadFile::ReadFile(ReadFile&& o) noexcept
    : path_(std::move(o.path_)),
      what_(std::move(o.what_)),
      fd_(std::exchange(o.fd_, -1)),
      size_(o.size_) {}

ReadFile& ReadFile::operator=(ReadFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    what_ = std::move(o.what_);
    fd_ = std::exchange(o.fd_, -1);
    size_ = o.size_;
  }
  return *this;
}

void ReadFile::read_at(void* dst, int64_t n, int64_t offset) const {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, p, size_t(std::min<int64_t>(n, 1 << 30)), off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      throw ConfigError(fmt::format("{} {}: read failed: {}", what_, path_, std::strerror(errno)));
    if (r == 0)
      throw ConfigError(fmt::format("{} {}: truncated: cannot read {} bytes at offset {}", what_,
                                    path_, n, offset));
    p += r;
    n -= r;
    offset += r;
  }
}

int ReadFile::release() {
  return std::exchange(fd_, -1);
}

std::string read_small_file(const std::string& path, const std::string& what, int64_t max_bytes) {
  const ReadFile f(path, what);
  if (f.size() > max_bytes)
    throw ConfigError(fmt::format("{} {} has {} bytes, more than the {} allowed", what, path,
                                  f.size(), max_bytes));
  std::string text(size_t(f.size()), '\0');
  f.read_at(text.data(), f.size(), 0);
  return text;
}

std::string confined_path(const std::string& dir, const std::string& name,
                          const std::string& source) {
  // Past this no name is a file's (PATH_MAX is 4096); bounds every message quoting the path.
  constexpr size_t kMaxName = 1024;
  if (name.size() > kMaxName)
    throw ConfigError(fmt::format(
        "{}: the path '{}' has {} characters, more than the {} a name of a file inside {} may have",
        source, excerpt(name), name.size(), kMaxName, dir));
  const fs::path p(name);
  bool escapes = name.empty() || name.find('\0') != std::string::npos || p.is_absolute() ||
                 p.has_root_name() || p.has_root_directory();
  for (const fs::path& part : p)
    if (part == "..") escapes = true;
  if (escapes)
    throw ConfigError(fmt::format(
        "{}: the path '{}' is not a relative name inside {}; files it names must stay in that "
        "directory",
        source, excerpt(name), dir));
  return (fs::path(dir) / p).string();
}

void check_replaceable(const std::string& path, const std::string& what) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw ConfigError(fmt::format("cannot check {} {}: {}", what, path, std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode))
    throw ConfigError(fmt::format(
        "refusing to write {} {}: it is {}, which a write would replace; remove it or choose "
        "another path",
        what, path, kind_name(st.st_mode)));
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

AtomicFile::AtomicFile(const std::string& path, const std::string& what)
    : path_(path), what_(what) {
  check_replaceable(path, what);
  std::string templ = path + ".tmp.XXXXXX";
  // mkostemp creates with O_CREAT | O_EXCL: a name that exists, a symlink included, is never
  // opened.
  fd_ = ::mkostemp(templ.data(), O_CLOEXEC);
  if (fd_ < 0)
    throw ConfigError(fmt::format("cannot create {} {}: {}", what, path, std::strerror(errno)));
  tmp_ = templ;
  ::fchmod(fd_, 0666 & ~process_umask());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* src, int64_t n) {
  put(src, n, -1);
}

void AtomicFile::write_at(const void* src, int64_t n, int64_t offset) {
  put(src, n, offset);
}

void AtomicFile::put(const void* src, int64_t n, int64_t offset) {
  const char* p = static_cast<const char*>(src);
  while (n > 0) {
    const size_t chunk = size_t(std::min<int64_t>(n, 1 << 30));
    const ssize_t w = offset < 0 ? ::write(fd_, p, chunk) : ::pwrite(fd_, p, chunk, off_t(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      throw Error(fmt::format("{} {}: write failed: {}", what_, path_,
                              w < 0 ? std::strerror(errno) : "no bytes written"));
    p += w;
    n -= w;
    if (offset >= 0) offset += w;
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0)
    throw Error(fmt::format("{} {}: fsync failed: {}", what_, path_, std::strerror(errno)));
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0)
    throw Error(fmt::format("{} {}: close failed: {}", what_, path_, std::strerror(errno)));
  check_replaceable(path_, what_);  // something may have appeared there meanwhile
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw Error(
        fmt::format("{} {}: cannot rename to {}: {}", what_, tmp_, path_, std::strerror(errno)));
  tmp_.clear();
  fsync_directory(parent_dir(path_));
}

void write_file_atomic(const std::string& path, std::string_view text, const std::string& what) {
  AtomicFile f(path, what);
  f.write(text);
  f.commit();
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("cannot open directory {}: {}", dir, std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // EINVAL: a file system without directory fsync (the rename is as durable as it can be).
  if (rc != 0 && err != EINVAL)
    throw Error(fmt::format("fsync of directory {} failed: {}", dir, std::strerror(err)));
}

}  // namespace upipe
