#include "train/run_config.h"

#include <fmt/format.h>

#include <toml++/toml.h>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>
#include <variant>

#include "core/errors.h"
#include "core/safe_fs.h"

namespace upipe {
namespace {

using FieldPtr = std::variant<int*, int64_t*, double*, bool*, std::string*>;

struct Field {
  const char* name;
  FieldPtr ptr;
  const char* doc;
};

// The schema: every key, in the order the run file prints. run_config_keys(), parsing, overrides
// and to_toml() all walk this one list.
std::vector<Field> fields(RunConfig& c) {
  return {
      {"model.name", &c.model.name,
       "preset (llama3-8b, llama3.1-8b, llama3-70b, qwen3-8b, qwen3-32b, tiny, tiny-qwen3) or "
       "Hugging Face directory"},
      {"model.init_from", &c.model.init_from,
       "Hugging Face directory whose weights start the run; \"\" = random init from train.seed"},
      {"parallel.cp_size", &c.parallel.cp_size,
       "ranks per context-parallel group C; 0 = all ranks; DP = ranks / C"},
      {"parallel.method", &c.parallel.method,
       "attention: local, ulysses, upipe, ring, usp, upipe-ring, fpdt, upipe-fpdt"},
      {"parallel.head_chunk", &c.parallel.head_chunk, "upipe: query heads per stage U; 0 = C"},
      {"parallel.ulysses_degree", &c.parallel.ulysses_degree,
       "usp / upipe-ring: ranks per Ulysses group; 0 = default"},
      {"parallel.chunks", &c.parallel.chunks, "fpdt: sequence chunks N; 0 = default"},
      {"train.steps", &c.train.steps, "optimizer steps"},
      {"train.seq_len", &c.train.seq_len, "tokens per sequence S (split over the CP group)"},
      {"train.micro_steps", &c.train.micro_steps,
       "gradient accumulation: sequences per DP rank per step"},
      {"train.lr", &c.train.lr, "peak learning rate, reached at the end of warmup"},
      {"train.min_lr_ratio", &c.train.min_lr_ratio,
       "learning rate at the end of the cosine decay, as a fraction of train.lr"},
      {"train.warmup_steps", &c.train.warmup_steps, "steps of linear warmup from 0"},
      {"train.weight_decay", &c.train.weight_decay, "AdamW decoupled weight decay"},
      {"train.beta1", &c.train.beta1, "AdamW first-moment decay"},
      {"train.beta2", &c.train.beta2, "AdamW second-moment decay"},
      {"train.eps", &c.train.eps, "AdamW epsilon"},
      {"train.grad_clip", &c.train.grad_clip, "global gradient norm limit; 0 = no clipping"},
      {"train.seed", &c.train.seed, "random init and data order"},
      {"train.dtype", &c.train.dtype, "compute dtype: fp32 or bf16 (master weights stay fp32)"},
      {"train.tile_tokens", &c.train.tile_tokens, "rows per MLP / LM-head tile T"},
      {"train.offload_checkpoints", &c.train.offload_checkpoints,
       "keep layer checkpoints in the host arena"},
      {"train.checkpoint_dtype", &c.train.checkpoint_dtype,
       "layer checkpoints stored as fp32 (exact) or bf16 (half the bytes)"},
      {"train.residual_dtype", &c.train.residual_dtype,
       "residual stream and its gradient: fp32, or bf16 with train.dtype = bf16"},
      {"train.checkpoint_granularity", &c.train.checkpoint_granularity,
       "layer (one checkpoint per layer), block (two: attention runs once less per layer) or "
       "none (block + the MLP's products kept: nothing of the MLP recomputed)"},
      {"data.kind", &c.data.kind, "files, random or copy"},
      {"data.path", &c.data.path, "files: a .npy/.bin token file, a directory of them, or a glob"},
      {"checkpoint.dir", &c.checkpoint.dir, "where checkpoints go; \"\" = no checkpoints"},
      {"checkpoint.interval", &c.checkpoint.interval,
       "steps between checkpoints; 0 = only at the end"},
      {"checkpoint.keep", &c.checkpoint.keep, "complete checkpoints kept, newest first"},
      {"metrics.path", &c.metrics.path, "JSONL file, one object per step; \"\" = none"},
      {"metrics.log_interval", &c.metrics.log_interval, "steps between log lines"},
      {"metrics.progress", &c.metrics.progress,
       "auto (a progress bar when stdout is a terminal), bar or lines"},
      {"memory.budget_gib", &c.memory.budget_gib, "device arena budget per rank, GiB"},
      {"comm.timeout_s", &c.comm.timeout_s,
       "a collective or step without progress this long ends the job; 0 = no watchdog"},
  };
}

const char* type_name(const FieldPtr& p) {
  return std::visit(
      [](auto* v) -> const char* {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, double>) return "float";
        if constexpr (std::is_same_v<T, bool>) return "bool";
        if constexpr (std::is_same_v<T, std::string>) return "string";
        return "int";
      },
      p);
}

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\')
      out += '\\', out += ch;
    else if (u < 0x20 || u == 0x7f)
      out += fmt::format("\\u{:04X}", unsigned(u));
    else
      out += ch;
  }
  return out + "\"";
}

// Shortest text that reads back as the same double, always a TOML float (1024 -> 1024.0).
std::string toml_float(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string value_text(const FieldPtr& p) {
  return std::visit(
      [](auto* v) -> std::string {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, double>) return toml_float(*v);
        if constexpr (std::is_same_v<T, bool>) return *v ? "true" : "false";
        if constexpr (std::is_same_v<T, std::string>) return toml_string(*v);
        return fmt::format("{}", *v);
      },
      p);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

Field* find_field(std::vector<Field>& fs, const std::string& key) {
  for (Field& f : fs)
    if (key == f.name) return &f;
  return nullptr;
}

[[noreturn]] void unknown_key(const std::string& where, const std::string& key) {
  throw ConfigError(
      fmt::format("{}unknown key '{}'; did you mean '{}'?", where, key, closest_run_key(key)));
}

template <class Int>
void set_int(Int* out, int64_t v, const std::string& where, const char* name) {
  if (v < int64_t(std::numeric_limits<Int>::min()) || v > int64_t(std::numeric_limits<Int>::max()))
    throw ConfigError(fmt::format("{}{}: {} is out of range [{}, {}]", where, name, v,
                                  std::numeric_limits<Int>::min(),
                                  std::numeric_limits<Int>::max()));
  *out = Int(v);
}

// Sets `f` from a TOML node; `where` prefixes messages ("run.toml:3: ").
void set_from_toml(const Field& f, const toml::node& n, const std::string& where) {
  auto wrong = [&](const char* want) {
    std::ostringstream got;
    got << n.type();
    throw ConfigError(
        fmt::format("{}{} must be {}, got a TOML {}", where, f.name, want, got.str()));
  };
  std::visit(
      [&](auto* v) {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, double>) {
          if (auto d = n.value_exact<double>())
            *v = *d;
          else if (auto i = n.value_exact<int64_t>())
            *v = double(*i);
          else
            wrong("a number");
        } else if constexpr (std::is_same_v<T, bool>) {
          if (auto b = n.value_exact<bool>())
            *v = *b;
          else
            wrong("true or false");
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (auto s = n.value_exact<std::string>())
            *v = *s;
          else
            wrong("a string");
        } else {
          if (auto i = n.value_exact<int64_t>())
            set_int(v, *i, where, f.name);
          else
            wrong("an integer");
        }
      },
      f.ptr);
}

// Sets `f` from command-line text.
void set_from_text(const Field& f, const std::string& text) {
  const std::string flag = fmt::format("--{}", f.name);
  const char* b = text.data();
  const char* e = text.data() + text.size();
  std::visit(
      [&](auto* v) {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, double>) {
          double d = 0;
          const auto [end, ec] = std::from_chars(b, e, d);
          if (text.empty() || ec != std::errc() || end != e || !std::isfinite(d))
            throw ConfigError(fmt::format("{}: '{}' is not a finite number", flag, text));
          *v = d;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (text == "true" || text == "1")
            *v = true;
          else if (text == "false" || text == "0")
            *v = false;
          else
            throw ConfigError(fmt::format("{}: '{}' is not true or false", flag, text));
        } else if constexpr (std::is_same_v<T, std::string>) {
          *v = text;
        } else {
          int64_t i = 0;
          const auto [end, ec] = std::from_chars(b, e, i);
          if (text.empty() || ec != std::errc() || end != e)
            throw ConfigError(fmt::format("{}: '{}' is not an integer", flag, text));
          set_int(v, i, flag + ": ", f.name);
        }
      },
      f.ptr);
}

[[noreturn]] void bad(const std::string& key, const std::string& what) {
  throw ConfigError(
      fmt::format("{} {}; set it in the run file or with --{}=VALUE", key, what, key));
}

bool one_of(const std::string& v, std::initializer_list<const char*> options) {
  for (const char* o : options)
    if (v == o) return true;
  return false;
}

}  // namespace

int64_t RunConfig::budget_bytes() const {
  return int64_t(std::floor(std::ldexp(memory.budget_gib, 30)));
}

const std::vector<RunKeyInfo>& run_config_keys() {
  static const std::vector<RunKeyInfo> keys = [] {
    RunConfig defaults;
    std::vector<RunKeyInfo> out;
    for (const Field& f : fields(defaults))
      out.push_back({f.name, type_name(f.ptr), value_text(f.ptr), f.doc});
    return out;
  }();
  return keys;
}

std::string closest_run_key(const std::string& key) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const RunKeyInfo& k : run_config_keys()) {
    size_t d = edit_distance(key, k.name);
    // "lr" is closest to "train.lr": a bare name is compared with the part after the section.
    if (key.find('.') == std::string::npos)
      d = std::min(d, edit_distance(key, std::string_view(k.name).substr(k.name.find('.') + 1)));
    // A truncated key ("train.warmup") is nearest to the key it begins.
    if (!key.empty() && k.name.find(key) != std::string::npos) d = std::min<size_t>(d, 1);
    if (d < best_d) best_d = d, best = k.name;
  }
  return best;
}

RunConfig parse_run_toml(std::string_view text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}:{}:{}: {}", source, e.source().begin.line,
                                  e.source().begin.column, e.description()));
  }
  RunConfig c;
  std::vector<Field> fs = fields(c);
  for (const auto& [section, node] : root) {
    const std::string sec(section.str());
    const std::string at = fmt::format("{}:{}: ", source, node.source().begin.line);
    const toml::table* t = node.as_table();
    if (!t)
      throw ConfigError(fmt::format(
          "{}'{}' is not a [section]; keys are written inside sections, e.g. [train] steps = 100 "
          "(did you mean '{}'?)",
          at, sec, closest_run_key(sec)));
    for (const auto& [key, value] : *t) {
      const std::string full = sec + "." + std::string(key.str());
      const std::string vat = fmt::format("{}:{}: ", source, value.source().begin.line);
      Field* f = find_field(fs, full);
      if (!f) unknown_key(vat, full);
      set_from_toml(*f, value, vat);
    }
  }
  return c;
}

void apply_override(RunConfig& c, const std::string& key, const std::string& value) {
  std::vector<Field> fs = fields(c);
  Field* f = find_field(fs, key);
  if (!f) unknown_key(fmt::format("--{}: ", key), key);
  set_from_text(*f, value);
}

void apply_overrides(RunConfig& c, std::span<const std::string> args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2)
      throw ConfigError(
          fmt::format("unexpected argument '{}'; overrides are written --section.key=value, e.g. "
                      "--train.steps=100",
                      a));
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      apply_override(c, a.substr(2, eq - 2), a.substr(eq + 1));
    } else {
      const std::string key = a.substr(2);
      if (i + 1 >= args.size()) {
        RunConfig probe;
        std::vector<Field> fs = fields(probe);
        if (!find_field(fs, key)) unknown_key(fmt::format("{}: ", a), key);
        throw ConfigError(fmt::format("{} needs a value, e.g. {}=VALUE", a, a));
      }
      apply_override(c, key, args[++i]);
    }
  }
}

void validate(const RunConfig& c) {
  const auto& p = c.parallel;
  const auto& t = c.train;
  if (c.model.name.empty()) bad("model.name", "is empty; give a preset name or a directory");
  if (p.cp_size < 0) bad("parallel.cp_size", fmt::format("must be >= 0, got {}", p.cp_size));
  if (!one_of(p.method,
              {"local", "ulysses", "upipe", "ring", "usp", "upipe-ring", "fpdt", "upipe-fpdt"}))
    bad("parallel.method",
        fmt::format("'{}' is unknown; choose local, ulysses, upipe, ring, usp, upipe-ring, fpdt "
                    "or upipe-fpdt",
                    p.method));
  if (p.head_chunk < 0)
    bad("parallel.head_chunk", fmt::format("must be >= 0, got {}", p.head_chunk));
  if (p.ulysses_degree < 0)
    bad("parallel.ulysses_degree", fmt::format("must be >= 0, got {}", p.ulysses_degree));
  if (p.chunks < 0) bad("parallel.chunks", fmt::format("must be >= 0, got {}", p.chunks));
  if (t.steps <= 0) bad("train.steps", fmt::format("must be positive, got {}", t.steps));
  constexpr int64_t kMaxSeq = int64_t(1) << 40;
  if (t.seq_len < 2 || t.seq_len > kMaxSeq)
    bad("train.seq_len", fmt::format("must be in [2, {}], got {}", kMaxSeq, t.seq_len));
  if (t.micro_steps < 1)
    bad("train.micro_steps", fmt::format("must be >= 1, got {}", t.micro_steps));
  if (!std::isfinite(t.lr) || t.lr < 0)
    bad("train.lr", fmt::format("must be a finite number >= 0, got {}", t.lr));
  if (!(t.min_lr_ratio >= 0 && t.min_lr_ratio <= 1))
    bad("train.min_lr_ratio", fmt::format("must be in [0, 1], got {}", t.min_lr_ratio));
  if (t.warmup_steps < 0)
    bad("train.warmup_steps", fmt::format("must be >= 0, got {}", t.warmup_steps));
  if (!std::isfinite(t.weight_decay) || t.weight_decay < 0)
    bad("train.weight_decay", fmt::format("must be a finite number >= 0, got {}", t.weight_decay));
  if (!(t.beta1 >= 0 && t.beta1 < 1))
    bad("train.beta1", fmt::format("must be in [0, 1), got {}", t.beta1));
  if (!(t.beta2 >= 0 && t.beta2 < 1))
    bad("train.beta2", fmt::format("must be in [0, 1), got {}", t.beta2));
  if (!(t.eps > 0) || !std::isfinite(t.eps))
    bad("train.eps", fmt::format("must be a finite number > 0, got {}", t.eps));
  if (!std::isfinite(t.grad_clip) || t.grad_clip < 0)
    bad("train.grad_clip", fmt::format("must be >= 0 (0 = no clipping), got {}", t.grad_clip));
  if (t.seed < 0) bad("train.seed", fmt::format("must be >= 0, got {}", t.seed));
  if (!one_of(t.dtype, {"fp32", "bf16"}))
    bad("train.dtype", fmt::format("'{}' is unknown; choose fp32 or bf16", t.dtype));
  if (t.checkpoint_dtype != "fp32" && t.checkpoint_dtype != "bf16")
    bad("train.checkpoint_dtype",
        fmt::format("'{}' is unknown; choose fp32 or bf16", t.checkpoint_dtype));
  if (t.residual_dtype != "fp32" && t.residual_dtype != "bf16")
    bad("train.residual_dtype",
        fmt::format("'{}' is unknown; choose fp32 or bf16", t.residual_dtype));
  if (t.residual_dtype == "bf16" && t.dtype != "bf16")
    bad("train.residual_dtype", "bf16 needs train.dtype = bf16 (the residual stream is fp32 or "
                                "the compute dtype)");
  if (!one_of(t.checkpoint_granularity, {"layer", "block", "none"}))
    bad("train.checkpoint_granularity",
        fmt::format("'{}' is unknown; choose layer, block or none", t.checkpoint_granularity));
  if (t.tile_tokens < 1 || t.tile_tokens > (int64_t(1) << 30))
    bad("train.tile_tokens", fmt::format("must be in [1, 2^30], got {}", t.tile_tokens));
  if (!one_of(c.data.kind, {"files", "random", "copy"}))
    bad("data.kind", fmt::format("'{}' is unknown; choose files, random or copy", c.data.kind));
  if (c.data.kind == "files" && c.data.path.empty())
    bad("data.path", "is required when data.kind = \"files\" (a token file, directory or glob)");
  if (c.data.kind == "copy" && t.seq_len % 2 != 0)
    bad("train.seq_len",
        fmt::format("({}) must be even for data.kind = \"copy\" (two equal halves); try {}",
                    t.seq_len, t.seq_len + 1));
  if (c.checkpoint.interval < 0)
    bad("checkpoint.interval",
        fmt::format("must be >= 0 (0 = only at the end), got {}", c.checkpoint.interval));
  if (c.checkpoint.keep < 1)
    bad("checkpoint.keep", fmt::format("must be >= 1, got {}", c.checkpoint.keep));
  if (c.metrics.log_interval < 1)
    bad("metrics.log_interval", fmt::format("must be >= 1, got {}", c.metrics.log_interval));
  if (!one_of(c.metrics.progress, {"auto", "bar", "lines"}))
    bad("metrics.progress",
        fmt::format("'{}' is unknown; choose auto, bar or lines", c.metrics.progress));
  // 1 EiB, the same ceiling as --memory-budget.
  if (!(c.memory.budget_gib * 1073741824.0 >= 1) || !(c.memory.budget_gib <= 1073741824.0))
    bad("memory.budget_gib",
        fmt::format("must be at least one byte and at most 1073741824 (1 EiB), got {}",
                    c.memory.budget_gib));
  if (!(c.comm.timeout_s >= 0) || !std::isfinite(c.comm.timeout_s))
    bad("comm.timeout_s",
        fmt::format("must be a finite number of seconds >= 0 (0 = no watchdog), got {}",
                    c.comm.timeout_s));
}

RunConfig load_run_config(const std::string& path, std::span<const std::string> overrides) {
  RunConfig c;
  if (!path.empty()) {
    c = parse_run_toml(read_small_file(path, "run file", int64_t(16) << 20), path);
  }
  apply_overrides(c, overrides);
  validate(c);
  return c;
}

std::string to_toml(const RunConfig& c) {
  RunConfig copy = c;
  std::string out = "# upipe run file: the effective configuration (file + command line)\n";
  std::string section;
  for (const Field& f : fields(copy)) {
    const std::string_view name(f.name);
    const std::string sec(name.substr(0, name.find('.')));
    if (sec != section) {
      out += fmt::format("{}[{}]\n", section.empty() ? "" : "\n", sec);
      section = sec;
    }
    const std::string line =
        fmt::format("{} = {}", name.substr(name.find('.') + 1), value_text(f.ptr));
    out += fmt::format("{:<30} # {}\n", line, f.doc);
  }
  return out;
}

}  // namespace upipe
