#include "apps/upipe/cli.h"

#include <fmt/format.h>
#include <cctype>

#include <cmath>
#include <vector>

#include "core/errors.h"

namespace upipe::app {

AttentionConfig ShapeOptions::config() const {
  AttentionConfig c;
  c.seq_len = seq_len;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.dtype = parse_dtype(dtype);
  c.rope.theta = rope_theta;
  c.rope.scaling = parse_rope_scaling(rope_scaling);
  if (hidden_size) {
    if (*hidden_size <= 0)
      throw ConfigError(
          fmt::format("--hidden-size must be positive (got {}); omit it for H*d", *hidden_size));
    c.hidden = *hidden_size;
  }
  c.qk_norm = qk_norm;
  if (!residual_dtype.empty()) {
    const DType r = parse_dtype(residual_dtype);
    if (r != DType::kF32 && r != c.dtype)
      throw ConfigError(fmt::format("--residual-dtype {} must be fp32 or the --dtype ({})",
                                    residual_dtype, dtype_name(c.dtype)));
    c.fp32_residual = r == DType::kF32;
  }
  c.head_chunk = head_chunk;
  c.ulysses_degree = ulysses_degree;
  c.chunks = chunks;
  c.validate_shape();
  return c;
}

void add_shape_options(CLI::App& cmd, ShapeOptions& o, bool with_strategy) {
  cmd.add_option("--seq-len,-S", o.seq_len, "global sequence length S (tokens)")
      ->capture_default_str();
  cmd.add_option("--heads,-H", o.heads, "query heads H")->capture_default_str();
  cmd.add_option("--kv-heads,-K", o.kv_heads, "key/value heads K")->capture_default_str();
  cmd.add_option("--head-dim,-d", o.head_dim, "head dimension d")->capture_default_str();
  cmd.add_option("--dtype", o.dtype, "storage dtype: fp32 or bf16")->capture_default_str();
  cmd.add_option("--rope-theta", o.rope_theta, "RoPE base")->capture_default_str();
  if (!with_strategy) return;
  cmd.add_option("--hidden-size", o.hidden_size,
                 "model width D (default H*d); Wq is (H*d, D), Wo (D, H*d)");
  cmd.add_option("--residual-dtype", o.residual_dtype,
                 "dtype of y, dy, dx (the residual stream the block accumulates into): fp32 or "
                 "the --dtype (default)");
  cmd.add_flag("--qk-norm", o.qk_norm, "Qwen3 QK-norm: RMSNorm over d of every q and k head");
  cmd.add_option("--rope-scaling", o.rope_scaling,
                 "RoPE frequency scaling: llama3:FACTOR:LOW:HIGH:ORIG (Llama-3.1: "
                 "llama3:8:1:4:8192) or none");
  cmd.add_option("--head-chunk,-U", o.head_chunk,
                 "upipe/upipe-fpdt: query heads per stage U (0 = C)");
  cmd.add_option("--ulysses-degree,-u", o.ulysses_degree,
                 "usp/upipe-ring: ranks per Ulysses group u (0 = all)");
  cmd.add_option("--chunks,-N", o.chunks,
                 "fpdt/upipe-fpdt: sequence chunks N (0 = the largest N <= 4 dividing S/C)");
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

int64_t parse_bytes(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string unit = s.substr(i);
  for (char& ch : unit) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  double v = 0;
  try {
    v = std::stod(s.substr(0, i));
  } catch (...) {
    throw ConfigError("cannot read '" + s + "' as a byte size; write e.g. 80G, 512M or 1048576");
  }
  double mult = 1;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib")
    mult = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb" || unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    throw ConfigError("unknown size unit in '" + s + "'; use K, M, G or T");
  if (v <= 0) throw ConfigError("byte size '" + s + "' must be positive");
  return int64_t(std::llround(v * mult));
}

}  // namespace upipe::app
