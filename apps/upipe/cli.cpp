#include "apps/upipe/cli.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <vector>

#include "core/errors.h"
#include "model/config.h"

namespace upipe::app {

AttentionConfig ShapeOptions::config(const RunConfig& r) const {
  AttentionConfig c;
  if (!model.empty()) {
    for (const CLI::Option* o : shape_flags)
      if (o->count() > 0)
        throw ConfigError(
            fmt::format("{} and --model {}: the model gives the block's shape; give one of them",
                        o->get_name(), model));
    c = to_attention_config(load_model_config(model));
  } else {
    c.heads = heads;
    c.kv_heads = kv_heads;
    c.head_dim = head_dim;
    c.rope.theta = rope_theta;
    c.rope.scaling = parse_rope_scaling(rope_scaling);
    if (hidden_size) c.hidden = *hidden_size;
    c.qk_norm = qk_norm;
  }
  c.seq_len = r.train.seq_len;
  c.dtype = r.memory.policy.dtype;
  c.fp32_residual = r.memory.policy.residual_dtype == DType::kF32;
  c.knobs = r.parallel.knobs;
  c.validate_shape();
  return c;
}

template <class T>
CLI::Validator integer_in(T lo, T hi) {
  const std::string range = fmt::format("[{}, {}]", lo, hi);
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        T v{};
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec == std::errc() && end == s.data() + s.size() && v >= lo && v <= hi) return {};
        return fmt::format("'{}' is not a whole number in {}; give one in that range", s, range);
      },
      "INT in " + range);
}
template CLI::Validator integer_in<int>(int, int);
template CLI::Validator integer_in<int64_t>(int64_t, int64_t);
template CLI::Validator integer_in<uint64_t>(uint64_t, uint64_t);

CLI::Validator number_in(double lo, double hi) {
  const std::string range = fmt::format("[{:.12g}, {:.12g}]", lo, hi);
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        double v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec == std::errc() && end == s.data() + s.size() && std::isfinite(v) && v >= lo &&
            v <= hi)
          return {};
        return fmt::format("'{}' is not a finite number in {}; give one in that range", s, range);
      },
      "NUMBER in " + range);
}

bool is_truth_value(std::string_view word) {
  std::string w(word);
  for (char& ch : w) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return w == "true" || w == "false" || w == "1" || w == "0" || w == "yes" || w == "no" ||
         w == "on" || w == "off";
}

void check_switch_values(CLI::App& app) {
  const CLI::Validator truth(
      [](std::string& s) -> std::string {
        if (is_truth_value(s)) return {};
        return fmt::format("'{}' is not true or false (or 1, 0, yes, no, on, off)", s);
      },
      "");
  for (CLI::Option* o : app.get_options()) {
    if (o->get_expected_max() != 0 || o->get_lnames().empty()) continue;
    const std::string& name = o->get_lnames().front();
    if (name == "help" || name == "help-all" || name == "version") continue;
    // A hidden option's errors are named "" by CLI11.
    o->check(o->get_group().empty() ? named(truth, "--" + name) : truth);
  }
  for (CLI::App* sub : app.get_subcommands({})) check_switch_values(*sub);
}

CLI::Validator named(CLI::Validator v, const std::string& name) {
  const std::string description = v.get_description();
  return CLI::Validator(
      [v, name](std::string& s) mutable -> std::string {
        const std::string e = v(s);
        return e.empty() ? e : name + ": " + e;
      },
      description);
}

CLI::Option* add_doc_lens_option(CLI::App& cmd, std::string& spec, const std::string& help) {
  return cmd.add_option("--doc-lens", spec, help)
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            if (!s.empty()) return {};
            return "is empty; give the documents' lengths (a,b,c) or a .npy/.bin file of them, "
                   "or leave --doc-lens out for one document";
          },
          "LENS|FILE"));
}

void add_shape_options(CLI::App& cmd, ShapeOptions& o, bool full) {
  auto& f = o.shape_flags;
  f.push_back(cmd.add_option("--heads,-H", o.heads, "query heads H")
                  ->capture_default_str()
                  ->check(integer_in<int>(1, kMaxHeads)));
  f.push_back(cmd.add_option("--kv-heads,-K", o.kv_heads, "key/value heads K (dividing H)")
                  ->capture_default_str()
                  ->check(integer_in<int>(1, kMaxHeads)));
  f.push_back(cmd.add_option("--head-dim,-d", o.head_dim, "head dimension d (even)")
                  ->capture_default_str()
                  ->check(integer_in<int>(2, kMaxHeadDim)));
  f.push_back(cmd.add_option("--rope-theta", o.rope_theta, "RoPE base")
                  ->capture_default_str()
                  ->check(number_in(kMinRopeTheta, kMaxRopeTheta)));
  if (!full) return;
  f.push_back(cmd.add_option("--hidden-size", o.hidden_size,
                             "model width D (default H*d); Wq is (H*d, D), Wo (D, H*d)")
                  ->check(integer_in<int64_t>(1, kMaxHiddenSize)));
  f.push_back(
      cmd.add_flag("--qk-norm", o.qk_norm, "Qwen3 QK-norm: RMSNorm over d of every q and k head"));
  f.push_back(cmd.add_option("--rope-scaling", o.rope_scaling,
                             "RoPE frequency scaling: llama3:FACTOR:LOW:HIGH:ORIG (Llama-3.1: "
                             "llama3:8:1:4:8192) or none"));
  cmd.add_option("--model", o.model,
                 "a model's attention block (a preset or a Hugging Face directory: its heads, KV "
                 "heads, head dim, hidden size, QK-norm and RoPE), in place of the shape flags");
}

RopeScaling parse_rope_scaling(const std::string& s) {
  RopeScaling r;
  if (s.empty() || s == "none") return r;
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == ':') {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  const std::string usage = "write llama3:FACTOR:LOW:HIGH:ORIG, e.g. llama3:8:1:4:8192, or none";
  if (parts[0] != "llama3")
    throw ConfigError(
        fmt::format("unknown rope scaling type '{}' in --rope-scaling {}; {}", parts[0], s, usage));
  if (parts.size() != 5)
    throw ConfigError(fmt::format("--rope-scaling {} needs 4 numbers after llama3; {}", s, usage));
  auto number = [&](const std::string& p) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(p, &used);
    } catch (...) {
      used = 0;
    }
    if (used != p.size() || p.empty() || !std::isfinite(v))
      throw ConfigError(fmt::format("cannot read '{}' in --rope-scaling {}; {}", p, s, usage));
    return v;
  };
  r.enabled = true;
  r.factor = number(parts[1]);
  r.low_freq_factor = number(parts[2]);
  r.high_freq_factor = number(parts[3]);
  const double orig = number(parts[4]);
  if (orig != std::floor(orig) || orig <= 0 || orig > 1e15)
    throw ConfigError(fmt::format(
        "the original context ({}) in --rope-scaling {} must be a positive integer", parts[4], s));
  r.original_max_position = int64_t(orig);
  return r;
}

}  // namespace upipe::app
