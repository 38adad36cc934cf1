// libFuzzer harness: a Hugging Face config.json (load_model_config on the file). What parses must
// be a model the engine can size and lay out. Seeds: tests/fixtures/hf/*/config*.json.
#include "fuzz_common.h"
#include "model/config.h"

using namespace upipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string p = fuzz::write_file("config.json", fuzz::as_text(data, size));
  fuzz::refused_or_read([&] {
    const ModelConfig m = load_model_config(p);
    fuzz::require(m.hidden_size > 0 && m.vocab_size > 0, "a model of no width or vocabulary");
    fuzz::require(m.num_hidden_layers > 0 && m.num_hidden_layers <= kMaxLayers, "layers");
    to_attention_config(m);
    fuzz::require(parameter_count(m) > 0 && layer_parameter_count(m) > 0, "parameter counts");
    // What it writes back parses to the same model.
    const ModelConfig back = parse_model_config(model_config_json(m, "float32"), "written back");
    fuzz::require(first_model_difference(m, "read", back, "written back").empty(),
                  "config.json written back reads as another model");
  });
  return 0;
}
