// Token files: a 1-D NumPy .npy of int32 / int64 / uint16 / uint32 ids (the format the Hugging Face
// fixtures and most tokenizer pipelines write). Ids are checked against the vocabulary.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace upipe {

// The ids of a 1-D little-endian .npy file; throws ConfigError naming the file for anything else
// (another dtype, a 2-D array, Fortran order, a truncated file) or an id outside [0, vocab).
std::vector<int32_t> read_npy_tokens(const std::string& path, int64_t vocab);

}  // namespace upipe
