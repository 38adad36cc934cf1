#include "model/safetensors.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_set>
#include <utility>

#include "core/errors.h"
#include "core/safe_fs.h"
#include "core/strict_json.h"

namespace upipe {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; the reader copies it as is");

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// The Rust reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr int64_t kMaxHeaderBytes = 100 << 20;
// Elements converted per pread when the stored dtype differs from the requested one.
constexpr int64_t kConvertChunk = 1 << 16;

// Element size of every dtype the format defines; 0 for a name it does not define.
int64_t stored_dtype_size(const std::string& t) {
  static const std::map<std::string, int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = sizes.find(t);
  return it == sizes.end() ? 0 : it->second;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

[[noreturn]] void fail(const std::string& file, const std::string& msg) {
  throw ConfigError(fmt::format("{}: {}", file, msg));
}
// Names and dtypes come from the file: quoted as excerpts (a name can be as long as the header).
[[noreturn]] void fail(const std::string& file, const std::string& tensor, const std::string& msg) {
  throw ConfigError(fmt::format("{}: tensor '{}': {}", file, excerpt(tensor), msg));
}

// Reads exactly n bytes at `offset`; false on end of file.
bool pread_all(int fd, void* dst, int64_t n, int64_t offset, int* err) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, size_t(std::min<int64_t>(n, 1 << 30)), off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      *err = r < 0 ? errno : 0;
      return false;
    }
    p += r;
    n -= r;
    offset += r;
  }
  return true;
}

int64_t checked_numel(const std::vector<int64_t>& shape, bool* overflow) {
  int64_t n = 1;
  *overflow = false;
  for (int64_t s : shape)
    if (__builtin_mul_overflow(n, s, &n)) *overflow = true;
  return n;
}

// Parses and validates one header entry; `data_bytes` is the size of the data section.
SafetensorsTensor parse_entry(const std::string& file, const std::string& name, const json& e,
                              int64_t data_start, int64_t data_bytes) {
  if (!e.is_object()) fail(file, name, "header entry is not an object");
  if (!e.contains("dtype") || !e["dtype"].is_string()) fail(file, name, "no string 'dtype'");
  SafetensorsTensor t;
  t.name = name;
  t.dtype = e["dtype"].get<std::string>();
  int64_t esize = stored_dtype_size(t.dtype);
  if (esize == 0) fail(file, name, fmt::format("unknown dtype '{}'", excerpt(t.dtype)));
  if (!e.contains("shape") || !e["shape"].is_array()) fail(file, name, "no 'shape' array");
  for (const json& s : e["shape"]) {
    if (!s.is_number_unsigned() || s.get<uint64_t>() > uint64_t(INT64_MAX))
      fail(file, name,
           fmt::format("shape {} holds a non-integer or negative dim", json_excerpt(e["shape"])));
    t.shape.push_back(s.get<int64_t>());
  }
  const json& off = e.contains("data_offsets") ? e["data_offsets"] : json();
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned())
    fail(file, name, "'data_offsets' must be two non-negative integers [begin, end]");
  uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  if (begin > end) fail(file, name, fmt::format("data_offsets [{}, {}) are reversed", begin, end));
  if (end > uint64_t(data_bytes))
    fail(file, name,
         fmt::format("data_offsets [{}, {}) run past the data section ({} bytes); the file is "
                     "truncated or corrupt",
                     begin, end, data_bytes));
  bool overflow;
  t.numel = checked_numel(t.shape, &overflow);
  if (overflow || __builtin_mul_overflow(t.numel, esize, &t.nbytes) ||
      t.nbytes != int64_t(end - begin))
    fail(file, name,
         fmt::format("data_offsets [{}, {}) hold {} bytes but {} {} needs {}", begin, end,
                     end - begin, t.dtype, shape_str(t.shape),
                     overflow ? std::string("more than 2^63") : std::to_string(t.numel * esize)));
  t.offset = data_start + int64_t(begin);
  return t;
}

void copy_convert(const void* src, const std::string& src_dtype, int64_t n, DType dst_dtype,
                  void* dst) {
  if (src_dtype == "F32") {
    from_f32(static_cast<const float*>(src), dst, dst_dtype, n);
  } else if (src_dtype == "BF16") {
    to_f32(src, DType::kBF16, static_cast<float*>(dst), n);  // only reached for fp32 dst
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    if (dst_dtype == DType::kF32) {
      float* d = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f16_to_f32(s[i]);
    } else {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(f16_to_f32(s[i]));
    }
  }
}

std::string dtype_tag(DType t) {
  return t == DType::kF32 ? "F32" : "BF16";
}

}  // namespace

// ---- Reader ----

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  std::error_code ec;
  fs::path p = path;
  fs::path index;
  if (fs::is_directory(p, ec)) {
    // The single file first, as transformers' from_pretrained looks (a folder holding both
    // loads model.safetensors there, so here too).
    // A name that is there, a symlink loop included: its reader names the loop, instead of
    // "neither".
    auto there = [&ec](const fs::path& f) {
      return fs::exists(f, ec) || ec == std::errc::too_many_symbolic_link_levels;
    };
    if (there(p / "model.safetensors"))
      p /= "model.safetensors";
    else if (there(p / "model.safetensors.index.json"))
      index = p / "model.safetensors.index.json";
    else
      fail(path, "directory holds neither model.safetensors.index.json nor model.safetensors");
  } else if (p.extension() == ".json") {
    index = p;
  }
  try {
    if (index.empty()) {
      tensors_ = open_file(p.string(), &metadata_);
      return;
    }
    path_ = index.string();
    const json j =
        parse_json_strict(read_small_file(path_, "safetensors index", kMaxHeaderBytes), path_);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object() ||
        j["weight_map"].empty())
      fail(path_, "no non-empty \"weight_map\" object of tensor name -> shard file");
    if (j.contains("metadata") && j["metadata"].is_object())
      for (const auto& [k, v] : j["metadata"].items())
        metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
    // Open each shard once; then keep exactly the tensors the weight map assigns to it.
    std::map<std::string, std::unordered_map<std::string, SafetensorsTensor>> shards;
    for (const auto& [name, v] : j["weight_map"].items()) {
      if (!v.is_string()) fail(path_, name, "weight_map value is not a file name");
      const std::string dir = index.parent_path().empty() ? "." : index.parent_path().string();
      const std::string shard = confined_path(dir, v.get<std::string>(), path_);
      auto it = shards.find(shard);
      if (it == shards.end()) {
        std::map<std::string, std::string> shard_metadata;
        it = shards.emplace(shard, open_file(shard, &shard_metadata)).first;
      }
      auto t = it->second.find(name);
      if (t == it->second.end())
        fail(path_, name, fmt::format("mapped to {}, which does not contain it", shard));
      tensors_.emplace(name, t->second);
    }
    // A tensor the weight map gives one shard and another shard holds too: a loader that reads
    // every shard's tensors (transformers) may load the other one; this reader took the mapped one
    // without a word.
    for (const auto& [shard, held] : shards)
      for (const auto& [name, t] : held)
        if (const auto it = tensors_.find(name);
            it != tensors_.end() && files_[size_t(it->second.file)] != shard)
          fail(path_, name,
               fmt::format("mapped to {}, but {} holds it too: which one loads is ambiguous; "
                           "remove it from one of them",
                           files_[size_t(it->second.file)], shard));
  } catch (...) {
    close_all();
    throw;
  }
}

std::unordered_map<std::string, SafetensorsTensor> SafetensorsReader::open_file(
    const std::string& file, std::map<std::string, std::string>* metadata) {
  ReadFile rf(file, "safetensors file");  // a regular file, opened without blocking
  const int64_t size = rf.size();
  const int index = int(files_.size());
  files_.push_back(file);
  fds_.push_back(rf.release());
  const int fd = fds_.back();
  if (size < 8)
    fail(file, fmt::format("truncated: {} bytes, shorter than the 8-byte header length", size));
  uint64_t n = 0;
  int err = 0;
  if (!pread_all(fd, &n, 8, 0, &err)) fail(file, "cannot read the header length");
  if (n > uint64_t(size - 8))
    fail(file, fmt::format("header length {} exceeds the file ({} bytes); the file is truncated "
                           "or not safetensors",
                           n, size));
  if (n > uint64_t(kMaxHeaderBytes))
    fail(file, fmt::format("header length {} exceeds the 100 MB limit", n));
  std::string text(n, '\0');
  if (!pread_all(fd, text.data(), int64_t(n), 8, &err)) fail(file, "cannot read the header");
  const json h = parse_json_strict(text, file + " header");
  if (!h.is_object()) fail(file, "the header is not a JSON object");
  const int64_t data_start = 8 + int64_t(n), data_bytes = size - data_start;
  std::unordered_map<std::string, SafetensorsTensor> tensors;
  for (const auto& [name, e] : h.items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) fail(file, "\"__metadata__\" is not an object");
      for (const auto& [k, v] : e.items()) {
        if (!v.is_string())
          fail(file, fmt::format("\"__metadata__\".{} is not a string", excerpt(k)));
        (*metadata)[k] = v.get<std::string>();
      }
      continue;
    }
    SafetensorsTensor t = parse_entry(file, name, e, data_start, data_bytes);
    t.file = index;
    tensors.emplace(name, std::move(t));
  }
  // The tensors fill the data section in offset order, each starting where the one before ended,
  // as the format requires (the reference reader refuses anything else): no byte belongs to two
  // tensors, none to no tensor (a header pointing a tensor at other bytes than its own).
  std::vector<const SafetensorsTensor*> by_offset;
  for (const auto& [name, t] : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return std::pair(a->offset, a->nbytes) < std::pair(b->offset, b->nbytes);
  });
  const SafetensorsTensor* before = nullptr;
  int64_t at = data_start;  // where the next tensor must start
  for (const SafetensorsTensor* t : by_offset) {
    if (t->offset < at)
      fail(file, t->name, fmt::format("data overlaps tensor '{}'", excerpt(before->name)));
    if (t->offset > at)
      fail(file, t->name,
           fmt::format("data_offsets start at {}, but {} ends at {}: bytes [{}, {}) of the data "
                       "section belong to no tensor, which the format does not allow",
                       t->offset - data_start,
                       before ? fmt::format("tensor '{}'", excerpt(before->name)) : "nothing",
                       at - data_start, at - data_start, t->offset - data_start));
    at = t->offset + t->nbytes;
    before = t;
  }
  if (at != size)
    fail(file, fmt::format("the tensors cover {} of the data section's {} bytes: the bytes after "
                           "them belong to no tensor, which the format does not allow",
                           at - data_start, data_bytes));
  return tensors;
}

void SafetensorsReader::close_all() {
  for (int fd : fds_) ::close(fd);
  fds_.clear();
}

SafetensorsReader::~SafetensorsReader() {
  close_all();
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& o) noexcept
    : path_(std::move(o.path_)),
      files_(std::move(o.files_)),
      fds_(std::exchange(o.fds_, {})),
      metadata_(std::move(o.metadata_)),
      tensors_(std::move(o.tensors_)) {}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& o) noexcept {
  if (this != &o) {
    close_all();
    path_ = std::move(o.path_);
    files_ = std::move(o.files_);
    fds_ = std::exchange(o.fds_, {});
    metadata_ = std::move(o.metadata_);
    tensors_ = std::move(o.tensors_);
  }
  return *this;
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> v;
  v.reserve(tensors_.size());
  for (const auto& [n, t] : tensors_) v.push_back(n);
  std::sort(v.begin(), v.end());
  return v;
}

const SafetensorsTensor& SafetensorsReader::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    fail(path_, name, fmt::format("not found among its {} tensors", tensors_.size()));
  return it->second;
}

void SafetensorsReader::check_shape(const std::string& name,
                                    const std::vector<int64_t>& expected_shape) const {
  const SafetensorsTensor& t = tensor(name);
  if (t.shape != expected_shape)
    fail(files_[t.file], name,
         fmt::format("has shape {}, expected {}", shape_str(t.shape), shape_str(expected_shape)));
  check_readable(t);
}

void SafetensorsReader::check_readable(const SafetensorsTensor& t) const {
  if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
    fail(files_[t.file], t.name,
         fmt::format("dtype {} cannot be read; upipe reads F32, BF16 and F16", t.dtype));
}

void SafetensorsReader::read(const std::string& name, const std::vector<int64_t>& expected_shape,
                             DType dtype, void* dst) const {
  check_shape(name, expected_shape);
  read_range(name, 0, tensor(name).numel, dtype, dst);
}

void SafetensorsReader::read_range(const std::string& name, int64_t first, int64_t count,
                                   DType dtype, void* dst) const {
  const SafetensorsTensor& t = tensor(name);
  const std::string& file = files_[t.file];
  check_readable(t);
  if (first < 0 || count < 0 || first > t.numel - count)
    fail(file, name,
         fmt::format("elements [{}, {}) are outside its {} elements", first, first + count,
                     t.numel));
  const int64_t esize = stored_dtype_size(t.dtype);
  const int64_t offset = t.offset + first * esize;
  int err = 0;
  auto read_or_fail = [&](void* p, int64_t nbytes, int64_t at) {
    if (!pread_all(fds_[t.file], p, nbytes, at, &err))
      fail(file, name,
           err ? fmt::format("read failed: {}", std::strerror(err))
               : std::string("unexpected end of file (the file shrank after opening)"));
  };
  if (t.dtype == dtype_tag(dtype)) {
    read_or_fail(dst, count * esize, offset);
    return;
  }
  std::vector<char> staging(size_t(std::min(count, kConvertChunk) * esize));
  char* out = static_cast<char*>(dst);
  for (int64_t done = 0; done < count;) {
    int64_t n = std::min(count - done, kConvertChunk);
    read_or_fail(staging.data(), n * esize, offset + done * esize);
    copy_convert(staging.data(), t.dtype, n, dtype, out + done * dtype_size(dtype));
    done += n;
  }
}

// ---- Writer ----

void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteItem>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::unordered_set<std::string> seen;
  std::vector<int64_t> nbytes;
  int64_t offset = 0;
  for (const SafetensorsWriteItem& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      throw ConfigError(fmt::format("{}: invalid tensor name '{}'", path, t.name));
    if (!seen.insert(t.name).second)
      throw ConfigError(fmt::format("{}: tensor '{}' given twice", path, t.name));
    bool overflow;
    int64_t n = checked_numel(t.shape, &overflow);
    if (overflow || std::any_of(t.shape.begin(), t.shape.end(), [](int64_t s) { return s < 0; }))
      throw ConfigError(
          fmt::format("{}: tensor '{}': invalid shape {}", path, t.name, shape_str(t.shape)));
    n *= dtype_size(t.dtype);
    if (n > 0 && t.data == nullptr && !t.fill)
      throw ConfigError(fmt::format("{}: tensor '{}': no data", path, t.name));
    if (t.data != nullptr && t.fill)
      throw ConfigError(fmt::format("{}: tensor '{}': both data and fill", path, t.name));
    header[t.name] = {
        {"dtype", dtype_tag(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    nbytes.push_back(n);
    offset += n;
  }
  // Pad with spaces (valid JSON) so the data section starts 8-byte aligned, as the reference
  // writer does.
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();

  AtomicFile out(path, "safetensors file");
  out.write(&n, 8);
  out.write(text);
  std::vector<char> staging;  // fill items: at most kSafetensorsWriteChunk elements
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsWriteItem& t = tensors[i];
    if (!t.fill) {
      out.write(t.data, nbytes[i]);
      continue;
    }
    const int64_t esize = dtype_size(t.dtype), count = nbytes[i] / esize;
    staging.resize(size_t(std::min(count, kSafetensorsWriteChunk) * esize));
    for (int64_t c = 0; c < count; c += kSafetensorsWriteChunk) {
      const int64_t k = std::min(kSafetensorsWriteChunk, count - c);
      t.fill(c, k, staging.data());
      out.write(staging.data(), k * esize);
    }
  }
  out.commit();
}

}  // namespace upipe
