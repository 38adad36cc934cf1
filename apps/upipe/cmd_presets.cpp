// `upipe presets [--markdown]`: the built-in models (`--model NAME`) with their shapes and
// parameter counts, from the same table load_model_config reads (model/config.h). --markdown
// prints the table docs/training.md carries.
#include <fmt/format.h>

#include <cstdio>

#include "apps/upipe/commands.h"
#include "model/config.h"

namespace upipe::app {
namespace {

struct Options {
  bool markdown = false;
};

std::string rope_text(const RopeParams& r) {
  std::string s = fmt::format("{:g}", r.theta);
  if (r.scaling.enabled) s += fmt::format(", llama3 x{:g}", r.scaling.factor);
  return s;
}

std::string params_text(int64_t n) {
  return n >= 1000000000 ? fmt::format("{:.2f} B", double(n) / 1e9)
                         : fmt::format("{:.2f} M", double(n) / 1e6);
}

int run(Process& proc, const Options& o) {
  if (!proc.root()) return 0;
  const char* head =
      "| preset | family | layers L | hidden D | heads H / K | head dim d | MLP F | vocab V | "
      "parameters | context | RoPE theta |\n";
  if (o.markdown)
    std::printf("%s| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n", head);
  for (const std::string& name : model_preset_names()) {
    const ModelConfig m = model_preset(name);
    const std::string row = fmt::format(
        "| `{}` | {}{} | {} | {} | {} / {} | {} | {} | {} | {} ({}) | {} | {} |", name,
        model_family_name(m.family), m.tie_word_embeddings ? ", tied" : "", m.num_hidden_layers,
        m.hidden_size, m.num_attention_heads, m.num_key_value_heads, m.head_dim,
        m.intermediate_size, m.vocab_size, params_text(parameter_count(m)), parameter_count(m),
        m.max_position_embeddings, rope_text(m.rope));
    if (o.markdown) {
      std::printf("%s\n", row.c_str());
    } else {
      std::printf(
          "%-12s %s%s: L=%d D=%lld H=%d K=%d d=%d F=%lld V=%lld, %s parameters, context "
          "%lld, RoPE theta %s\n",
          name.c_str(), model_family_name(m.family), m.tie_word_embeddings ? " (tied)" : "",
          m.num_hidden_layers, (long long)m.hidden_size, m.num_attention_heads,
          m.num_key_value_heads, m.head_dim, (long long)m.intermediate_size,
          (long long)m.vocab_size, params_text(parameter_count(m)).c_str(),
          (long long)m.max_position_embeddings, rope_text(m.rope).c_str());
    }
  }
  return 0;
}

}  // namespace

Runner add_presets(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.add_flag("--markdown", opt->markdown, "a Markdown table (as docs/training.md has)");
  return [opt](Process& p) { return run(p, *opt); };
}

}  // namespace upipe::app
