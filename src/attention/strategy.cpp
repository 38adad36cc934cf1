// The strategy interface's shared part: the documents of the sequence.
#include "attention/strategy.h"

namespace upipe {

void AttentionStrategy::set_documents(std::shared_ptr<const Documents> docs) {
  UPIPE_CHECK(docs == nullptr || docs->seq_len() == cfg().seq_len,
              "documents of {} tokens for a sequence of {}", docs ? docs->seq_len() : 0,
              cfg().seq_len);
  docs_ = packed(docs) ? std::move(docs) : nullptr;
  documents_changed();
}

RowPositions AttentionStrategy::rope_positions(const RowPositions& rows) const {
  return docs_ ? docs_->positions_in_documents(rows) : rows;
}

}  // namespace upipe
