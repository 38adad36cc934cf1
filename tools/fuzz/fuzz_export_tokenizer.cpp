// libFuzzer harness: `upipe export --tokenizer DIR`'s check of DIR/tokenizer.json against the
// model's vocabulary (plan_tokenizer; a tokenizer whose ids reach past the embedding is refused).
// The input is tokenizer.json; the checkpoint exported is one the harness writes once with the real
// writer (a 1-layer model of vocabulary 300, fuzz_checkpoint_writer.h). What is accepted is checked
// against the file itself: every id the tokenizer can give (its model's vocab, as an object of
// token -> id or Unigram's list, the added tokens', the post-processor's special tokens') is a
// whole number below 300. Seeds: the byte tokenizer's tokenizer.json and variants
// (tools/fuzz/seeds.py).
#include <nlohmann/json.hpp>

#include "fuzz_checkpoint_writer.h"
#include "train/export.h"

using namespace upipe;
using json = nlohmann::json;

namespace {

constexpr int64_t kVocab = 300;

// o[key] when o is an object that has it, else null.
const json* member(const json& o, const char* key) {
  if (!o.is_object()) return nullptr;
  const auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

bool is_id(const json& v) {
  return v.is_number_unsigned() && v.get<uint64_t>() < uint64_t(kVocab);
}

// Whether every id a post-processor inserts is an id (TemplateProcessing's special tokens, Bert's
// and Roberta's sep and cls, each processor of a Sequence).
bool post_ids_ok(const json& p) {
  if (const json* s = member(p, "special_tokens"); s && s->is_object())
    for (const auto& [name, t] : s->items())
      if (const json* ids = member(t, "ids"); ids && ids->is_array())
        for (const json& id : *ids)
          if (!is_id(id)) return false;
  for (const char* k : {"sep", "cls"})
    if (const json* t = member(p, k); t && t->is_array() && t->size() == 2 && !is_id((*t)[1]))
      return false;
  if (const json* ps = member(p, "processors"); ps && ps->is_array())
    for (const json& q : *ps)
      if (!post_ids_ok(q)) return false;
  return true;
}

// Whether every id of tokenizer.json `text` is one of the model's.
bool ids_ok(std::string_view text) {
  const json j = json::parse(text, nullptr, false);
  const json* model = member(j, "model");
  const json* vocab = model ? member(*model, "vocab") : nullptr;
  if (vocab && vocab->is_object())
    for (const auto& [token, id] : vocab->items())
      if (!is_id(id)) return false;
  if (vocab && vocab->is_array() && vocab->size() > size_t(kVocab)) return false;
  if (const json* added = member(j, "added_tokens"); added && added->is_array())
    for (const json& t : *added)
      if (const json* id = member(t, "id"); id && !is_id(*id)) return false;
  if (const json* post = member(j, "post_processor"); post && !post_ids_ok(*post)) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string checkpoint = [] {
    const std::string dir = (fuzz::scratch() / "ckpt").string();
    return fuzz::write_checkpoint(dir, fuzz::small_model(kVocab), 1, 1, "");
  }();
  static const CheckpointReader reader(checkpoint);
  std::filesystem::create_directories(fuzz::scratch() / "tok");
  const std::string_view text = fuzz::as_text(data, size);
  fuzz::write_file("tok/tokenizer.json", text);
  fuzz::refused_or_read([&] {
    const TokenizerPlan p =
        plan_tokenizer(reader, {TokenizerChoice::Kind::kDir, (fuzz::scratch() / "tok").string()});
    fuzz::require(!p.files.empty() && p.files.front() == "tokenizer.json",
                  "tokenizer.json left out");
    fuzz::require(ids_ok(text), "a tokenizer with ids past the vocabulary accepted");
  });
  return 0;
}
