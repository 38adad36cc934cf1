// The documents of one sequence as the commands take them (--doc-lens): a comma-separated list of
// lengths ("1000,24,3000") or a token file (.npy of integers, or llm.c .bin) holding the lengths,
// which must sum to the sequence length (attention/documents.h has the semantics).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention/documents.h"

namespace upipe {

// The lengths `spec` gives; ConfigError naming `what` for a malformed list, an unreadable file,
// more lengths than seq_len or a length outside [1, seq_len]. Not checked to sum to seq_len.
std::vector<int64_t> parse_doc_lens(const std::string& spec, int64_t seq_len,
                                    const std::string& what = "--doc-lens");

// The documents `spec` gives for a sequence of seq_len tokens, validated (they sum to seq_len);
// null for an empty spec.
std::shared_ptr<const Documents> documents_from(const std::string& spec, int64_t seq_len,
                                                const std::string& what = "--doc-lens");

}  // namespace upipe
