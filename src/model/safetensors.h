// Reader and writer of the safetensors format (Hugging Face checkpoints and our own):
//   [u64 little-endian header length N][N bytes of JSON header][data]
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} (offsets
// relative to the data section), plus an optional "__metadata__" of string → string.
//
// The reader opens one file or a sharded checkpoint (model.safetensors.index.json, whose
// "weight_map" names each tensor's shard), validates every header at open, and reads one
// tensor (or an element range of it, for a rank's shard) straight from the file into a
// caller-provided host buffer, converting F32 / BF16 / F16 to the engine's fp32 or bf16. The
// whole file is never loaded. Problems with the files are ConfigErrors naming file and tensor.
//
// The writer writes named fp32 / bf16 tensors atomically (temporary file, fsync, rename), never
// over a symlink or anything but a regular file. Files and shard names are untrusted: every file
// is opened without blocking and must be regular, a shard named by the index must lie inside the
// index's directory, and a key given twice in a JSON header or index is an error, as is a tensor
// the index maps to one shard and another shard holds too.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"

namespace upipe {

// IEEE half → fp32, exact (subnormals, infinities and NaN included).
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);  // inf / NaN (payload kept)
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (mant << 13);  // normal: rebias 15 → 127
  } else if (mant == 0) {
    u = sign;  // ±0
  } else {
    // Subnormal: mant · 2^-24; normalise the mantissa into fp32's implicit-one form.
    int shift = 0;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      ++shift;
    }
    u = sign | (uint32_t(113 - shift) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// One tensor of a checkpoint, as its header describes it.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;           // as stored: "F32", "BF16", "F16", "I64", ...
  std::vector<int64_t> shape;  // outermost first; {} for a scalar
  int64_t numel = 0;
  int file = 0;        // index into SafetensorsReader::files()
  int64_t offset = 0;  // absolute byte offset of the data in that file
  int64_t nbytes = 0;  // numel × element size
};

class SafetensorsReader {
 public:
  // `path`: a .safetensors file, a *.safetensors.index.json, or a directory holding
  // model.safetensors.index.json or model.safetensors. Validates every header.
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& o) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& o) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<std::string>& files() const { return files_; }  // shard paths
  // The single file's "__metadata__", or the index's "metadata" (numbers as their JSON text).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  std::vector<std::string> names() const;  // sorted
  // Throws ConfigError naming the checkpoint when the tensor is absent.
  const SafetensorsTensor& tensor(const std::string& name) const;

  // Throws ConfigError naming the file and tensor when it is absent, its shape differs or its
  // dtype cannot be read (every rank checks every tensor before any rank reads its part).
  void check_shape(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  // Reads the whole tensor into dst (numel elements of `dtype`, contiguous). Throws
  // ConfigError when the stored shape differs from expected_shape or the stored dtype is not
  // F32, BF16 or F16.
  void read(const std::string& name, const std::vector<int64_t>& expected_shape, DType dtype,
            void* dst) const;
  // Reads elements [first, first + count) of the row-major flattened tensor (a rank's slice
  // of rows, for ZeRO-3 sharded loading).
  void read_range(const std::string& name, int64_t first, int64_t count, DType dtype,
                  void* dst) const;

 private:
  void close_all();
  void check_readable(const SafetensorsTensor& t) const;  // F32, BF16 or F16
  // Opens one file, keeps its descriptor, and returns its validated tensors and metadata.
  std::unordered_map<std::string, SafetensorsTensor> open_file(
      const std::string& file, std::map<std::string, std::string>* metadata);

  std::string path_;
  std::vector<std::string> files_;
  std::vector<int> fds_;
  std::map<std::string, std::string> metadata_;
  std::unordered_map<std::string, SafetensorsTensor> tensors_;
};

// Writes elements [first, first + count) of a tensor, in its stored dtype, to dst.
using SafetensorsFill = std::function<void(int64_t first, int64_t count, void* dst)>;

// A tensor to write: `shape` elements of `dtype` (row-major) at `data`, or (data null) produced
// piece by piece by `fill`, so that a tensor held on a device or in a checkpoint never needs a
// whole host copy.
struct SafetensorsWriteItem {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  SafetensorsFill fill = nullptr;
};

// Elements a `fill` is asked for at most at once: the writer's only staging buffer holds this
// many elements of the item's dtype.
inline constexpr int64_t kSafetensorsWriteChunk = int64_t(1) << 20;

// Writes `tensors` (in this order) and `metadata` as one safetensors file at `path`, atomically
// (core/safe_fs.h AtomicFile: a temporary file beside it is written, fsynced and renamed over
// `path`). Throws ConfigError for invalid items (empty or duplicate names, "__metadata__", negative
// dims, neither or both of data and fill) or a target that is a symlink or not a regular file,
// and Error on I/O failure (the temporary file is removed).
void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteItem>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace upipe
