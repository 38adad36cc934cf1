// Token files: a 1-D NumPy .npy of int32 / int64 / uint16 / uint32 ids (the format the Hugging Face
// fixtures and most tokenizer pipelines write), or an llm.c .bin file (a header of 256 int32 —
// magic, version, token count — then the ids as uint16 or uint32). Ids are checked against the
// vocabulary. A file can be inspected from its header alone and read in windows, so corpora of
// many GB are never loaded whole.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace upipe {

// llm.c's two .bin layouts (karpathy/llm.c dev/data/data_common.py): GPT-2 tokens as uint16 and
// Llama-3 tokens as uint32, each with its own magic and version in header[0] and header[1].
inline constexpr int32_t kBinMagicU16 = 20240520, kBinVersionU16 = 1;
inline constexpr int32_t kBinMagicU32 = 20240801, kBinVersionU32 = 7;
inline constexpr int64_t kBinHeaderInts = 256;  // int32 header words before the ids

// kRaw: ids with no header (a Megatron-LM indexed dataset's .bin; train/indexed_dataset.h reads
// its .idx, which gives the width).
enum class TokenFormat { kNpy, kBin, kRaw };

// Where a token file's ids lie and how they are stored, read from its header alone.
struct TokenFileInfo {
  std::string path;
  TokenFormat format = TokenFormat::kNpy;
  int width = 0;            // bytes per id: 2, 4 or 8
  bool is_signed = false;   // int32 / int64 .npy
  int64_t data_offset = 0;  // byte offset of id 0
  int64_t count = 0;        // ids in the file
};

// What a file's first bytes (up to 6) name by their magic: kNpy (\x93NUMPY), kBin (an llm.c
// magic), else kRaw (no token file's magic: text, or a headerless Megatron .bin).
TokenFormat token_format_by_magic(std::span<const char> head);

// The header of a .npy or .bin token file, told apart by its magic (not its name); throws
// ConfigError naming the file when it is neither, has an unsupported dtype / shape / version,
// or is shorter than its header says.
TokenFileInfo inspect_token_file(const std::string& path);

// Ids [begin, begin + n) of `f` into out[0, n) (n ids), read from the file without loading the
// rest; throws ConfigError naming the file for an id outside [0, vocab) (with its index in the
// file) or a file that became shorter.
void read_token_range(const TokenFileInfo& f, int64_t begin, int64_t n, int64_t vocab,
                      int32_t* out);

// Checks ids [0, n) of `f` against the vocabulary like read_token_range, through a bounded
// buffer: nothing proportional to n is allocated.
void check_token_ids(const TokenFileInfo& f, int64_t n, int64_t vocab);

// Every id of a token file of either format (dispatched on the magic).
std::vector<int32_t> read_tokens(const std::string& path, int64_t vocab);
// Every id of a .npy file; anything else (another dtype, a 2-D array, Fortran order, a
// truncated file, a .bin file) is a ConfigError naming the file.
std::vector<int32_t> read_npy_tokens(const std::string& path, int64_t vocab);
// Every id of an llm.c .bin file; likewise.
std::vector<int32_t> read_bin_tokens(const std::string& path, int64_t vocab);

// Writes `ids` as an llm.c .bin file of `width` bytes per id (2: magic 20240520 version 1;
// 4: magic 20240801 version 7). Throws ConfigError when an id does not fit the width, there are
// 2^31 ids or more (the header's count is an int32), or `path` is a symlink or not a regular file;
// Error when a write fails. Written atomically (core/safe_fs.h AtomicFile).
void write_bin_tokens(const std::string& path, std::span<const int32_t> ids, int width = 2);

}  // namespace upipe
