// The byte-level tokenizer of `upipe tokenize`: each byte of a text file is one token id in
// [0, 256), written as an llm.c .bin file (version 1, uint16 ids), or, for a directory of text
// files, one document per file as a Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx, read by
// data.documents = "index"). Any model with a vocabulary of at least 256 can train on it; the
// tiny presets have exactly 256. The same tokenizer as a Hugging Face tokenizer.json, for
// `upipe export`: transformers' AutoTokenizer loads it and maps text to the same ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace upipe {

inline constexpr int64_t kByteVocab = 256;

// Streams `in` (any bytes; a regular file) into the .bin file `out`, written atomically, and
// returns the number of tokens. Throws ConfigError naming the file when `in` cannot be read or is
// not a regular file, `out` is `in` (the same file under any name), a symlink or not a regular
// file, or `in` has 2^31 bytes or more (the .bin header counts tokens in an int32; split the
// text), or `out` exists and not `replace`; Error when a write fails.
int64_t tokenize_bytes(const std::string& in, const std::string& out, bool replace = false);

// tokenizer.json of the byte tokenizer: a BPE model without merges over GPT-2's byte-to-unicode
// alphabet (id b = byte b), ByteLevel pre-tokenizer and decoder without regex splitting or a
// prefix space, so encoding any UTF-8 text gives its bytes and decoding gives the text back.
std::string byte_tokenizer_json();

// tokenizer_config.json for it: PreTrainedTokenizerFast, at most max_len tokens.
std::string byte_tokenizer_config_json(int64_t max_len);

// Every regular file of the directory `dir` (not recursive, sorted by name) as one document, in
// that order, into PREFIX.bin + PREFIX.idx (PREFIX: `out` without a .bin / .idx extension),
// written atomically. Throws ConfigError when `dir` holds no file, an input is one of the
// outputs, an output exists and not `replace`, a file cannot be read or has 2^31 bytes or more
// (an index entry counts a document's ids in an int32; split the text); Error when a write fails.
struct TokenizedDocuments {
  std::string prefix;
  int64_t documents = 0, tokens = 0;
  // What the directory held that is no document, said to the user: "2 subdirectories (one level
  // is read)", "1 hidden file (.gitignore)", "1 token dataset (.bin + .idx)".
  std::vector<std::string> skipped;
};
TokenizedDocuments tokenize_documents(const std::string& dir, const std::string& out,
                                      bool replace = false);
// r.skipped as one phrase: "2 subdirectories (one level is read), 1 hidden file (.x)".
std::string left_out(const TokenizedDocuments& r);

}  // namespace upipe
