#include "apps/upipe/cli.h"

#include <cctype>
#include <cmath>

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
  cmd.add_option("--head-chunk,-U", o.head_chunk,
                 "upipe/upipe-fpdt: query heads per stage U (0 = C)");
  cmd.add_option("--ulysses-degree,-u", o.ulysses_degree,
                 "usp/upipe-ring: ranks per Ulysses group u (0 = all)");
  cmd.add_option("--chunks,-N", o.chunks,
                 "fpdt/upipe-fpdt: sequence chunks N (0 = the largest N <= 4 dividing S/C)");
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
