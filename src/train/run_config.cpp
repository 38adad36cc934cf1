#include "train/run_config.h"

#include <fmt/format.h>

#include <toml++/toml.h>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>
#include <variant>

#include "attention/methods.h"
#include "backend/backend.h"
#include "core/errors.h"
#include "core/safe_fs.h"
#include "core/spelling.h"
#include "model/config.h"
#include "train/data.h"

namespace upipe {
namespace {

// Typed places a setting's value goes. Bytes take size suffixes ("80G"); a knob is a whole number
// or "auto" (kKnobAuto).
struct BytesRef {
  int64_t* v;
};
struct KnobRef {
  int* v;
};
// Whole seconds, read and written as a duration ("3h50m"; parse_duration).
struct DurationRef {
  int64_t* v;
};
constexpr int64_t kMaxDurationS = int64_t(366) * 86400;
using FieldPtr = std::variant<int*, int64_t*, double*, bool*, std::string*, DType*, Recompute*,
                              BytesRef, KnobRef, DurationRef>;

// An older spelling: a key (also accepted as --key=value) or a flag. gib: its value is a number
// of GiB (memory.budget_gib, --device-gib), converted to the bytes the setting holds.
struct Alias {
  const char* name;
  bool gib = false;
};

struct Field {
  const char* key;
  const char* flag;
  const char* short_flag;
  FieldPtr ptr;
  uint32_t scopes;
  ResumeRule resume;  // what a changed value means when a run resumes
  std::string doc;
  std::vector<Alias> aliases = {};
};

constexpr uint32_t kAll = kScopeTrain | kScopeModel | kScopePlan | kScopeBlock;
constexpr uint32_t kModels = kScopeTrain | kScopeModel | kScopePlan;
// The commands that communicate (the watchdog's timeout).
constexpr uint32_t kRunning = kScopeTrain | kScopeModel | kScopeBlock | kScopeComm | kScopeDemo;

// The table: every setting, in the order the run file prints. settings(), parsing, overrides,
// to_toml() and the docs' table all walk this one list.
std::vector<Field> fields(RunConfig& c) {
  MethodKnobs& k = c.parallel.knobs;
  MemoryPolicy& p = c.memory.policy;
  std::string presets;
  for (const std::string& n : model_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  return {
      {"model.name", "--model", "", &c.model.name, kModels, ResumeRule::kModel,
       "preset (" + presets + ") or Hugging Face directory"},
      {"model.init_from", "--init-from", "", &c.model.init_from, kScopeTrain, ResumeRule::kFree,
       "Hugging Face directory whose weights start the run; \"\" = random init from train.seed"},
      {"model.random_weights", "--random-weights", "", &c.model.random_weights, kScopeModel,
       ResumeRule::kFree,
       "random weights (train.seed) for a model directory's config; without it a directory "
       "with no weights is an error"},
      {"parallel.cp_size", "--cp-size", "", &c.parallel.cp_size, kScopeTrain | kScopePlan,
       ResumeRule::kArithmetic,
       "ranks per context-parallel group C; 0 = all ranks; DP = ranks / C"},
      {"parallel.method", "--method", "-m", &k.method, kAll, ResumeRule::kArithmetic,
       "attention: " + method_names()},
      {"parallel.stage_heads",
       "--stage-heads",
       "-U",
       KnobRef{&k.stage_heads},
       kAll,
       ResumeRule::kArithmetic,
       "upipe methods: query heads per stage U; 0 = the all-to-all group size",
       {{"parallel.head_chunk"}, {"--head-chunk"}}},
      {"parallel.ulysses_degree", "--ulysses-degree", "-u", KnobRef{&k.ulysses_degree}, kAll,
       ResumeRule::kArithmetic, "usp / upipe-ring: ranks per Ulysses group u; 0 = all ranks"},
      {"parallel.chunks", "--chunks", "-N", KnobRef{&k.chunks}, kAll, ResumeRule::kArithmetic,
       "fpdt methods: sequence chunks N; 0 = the largest N <= 4 dividing S/C"},
      {"parallel.overlap", "--overlap", "", &k.overlap, kAll, ResumeRule::kFree,
       "upipe methods: start the next head stage's projections and all-to-alls before this "
       "stage's attention (two stages' q/o buffers alive; bitwise the same result)"},
      {"train.steps", "--steps", "", &c.train.steps, kScopeTrain, ResumeRule::kSchedule,
       "optimizer steps"},
      {"train.seq_len", "--seq-len", "-S", &c.train.seq_len, kAll | kScopeKernel,
       ResumeRule::kBreaks, "tokens per sequence S (split over the CP group)"},
      {"train.micro_steps", "--micro-steps", "", &c.train.micro_steps, kScopeTrain | kScopePlan,
       ResumeRule::kBreaks, "gradient accumulation: sequences per DP rank per step"},
      {"train.lr", "--lr", "", &c.train.lr, kScopeTrain, ResumeRule::kSchedule,
       "peak learning rate, reached at the end of warmup"},
      {"train.min_lr_ratio", "--min-lr-ratio", "", &c.train.min_lr_ratio, kScopeTrain,
       ResumeRule::kSchedule,
       "learning rate at the end of the cosine decay, as a fraction of train.lr"},
      {"train.warmup_steps", "--warmup-steps", "", &c.train.warmup_steps, kScopeTrain,
       ResumeRule::kSchedule, "steps of linear warmup from 0"},
      {"train.weight_decay", "--weight-decay", "", &c.train.weight_decay, kScopeTrain,
       ResumeRule::kSchedule, "AdamW decoupled weight decay"},
      {"train.beta1", "--beta1", "", &c.train.beta1, kScopeTrain, ResumeRule::kSchedule,
       "AdamW first-moment decay"},
      {"train.beta2", "--beta2", "", &c.train.beta2, kScopeTrain, ResumeRule::kSchedule,
       "AdamW second-moment decay"},
      {"train.eps", "--eps", "", &c.train.eps, kScopeTrain, ResumeRule::kSchedule, "AdamW epsilon"},
      {"train.grad_clip", "--grad-clip", "", &c.train.grad_clip, kScopeTrain, ResumeRule::kSchedule,
       "global gradient norm limit; 0 = no clipping"},
      {"train.seed", "--seed", "", &c.train.seed, kScopeTrain | kScopeModel | kScopeBlock,
       ResumeRule::kBreaks,
       "random weights and data (train), random tokens and inputs (eval, bench, check)"},
      {"train.time_limit", "--time-limit", "", DurationRef{&c.train.time_limit_s}, kScopeTrain,
       ResumeRule::kFree,
       "the job's wall clock from its start: the run stops cleanly (checkpoint, exit 0) where "
       "another step, its validation and checkpoint would end past it; 3h50m, 90m, or SLURM's "
       "[D-]H:MM:SS (squeue -o %L); 0 = none"},
      {"memory.dtype",
       "--dtype",
       "",
       &p.dtype,
       kAll | kScopeKernel | kScopeDemo,
       ResumeRule::kArithmetic,
       "compute dtype: fp32 or bf16 (master weights stay fp32)",
       {{"train.dtype"}}},
      {"memory.residual_dtype",
       "--residual-dtype",
       "",
       &p.residual_dtype,
       kAll,
       ResumeRule::kArithmetic,
       "residual stream and its gradient: fp32, or bf16 with memory.dtype = bf16",
       {{"train.residual_dtype"}}},
      {"memory.recompute",
       "--recompute",
       "",
       &p.recompute,
       kModels,
       ResumeRule::kFree,
       "what backward recomputes from: layer (one stash per layer), block (two: the attention "
       "runs once less per layer) or none (block + the MLP's products stashed)",
       {{"train.checkpoint_granularity"}, {"--checkpoint-granularity"}}},
      {"memory.stash_dtype",
       "--stash-dtype",
       "",
       &p.stash_dtype,
       kModels,
       ResumeRule::kArithmetic,
       "the stash's storage: fp32 (exact) or bf16 (half the bytes)",
       {{"train.checkpoint_dtype"}, {"--checkpoint-dtype"}}},
      {"memory.offload_stash",
       "--offload-stash",
       "",
       &p.offload_stash,
       kModels,
       ResumeRule::kFree,
       "keep the stash in the host arena, fetched back layer by layer",
       {{"train.offload_checkpoints"}, {"--offload-checkpoints"}}},
      {"memory.tile_tokens",
       "--tile-tokens",
       "",
       &p.tile_tokens,
       kModels,
       ResumeRule::kArithmetic,
       "rows per MLP / LM-head tile T",
       {{"train.tile_tokens"}}},
      {"memory.device_memory",
       "--device-memory",
       "",
       BytesRef{&c.memory.device_bytes},
       kAll,
       ResumeRule::kFree,
       "device memory per rank: the device arena's budget, e.g. 80G",
       {{"memory.budget_gib", true}, {"--memory-budget"}, {"--device-gib", true}}},
      {"memory.host_memory",
       "--host-memory",
       "",
       BytesRef{&c.memory.host_bytes},
       kModels,
       ResumeRule::kFree,
       "host memory per rank: the host arena's budget (the offloaded stash, fpdt's K/V)",
       {{"--host-gib", true}}},
      // Planned too: packed documents add their mask (tag docs), planned at their worst.
      {"data.kind", "--data-kind", "", &c.data.kind, kScopeTrain | kScopePlan, ResumeRule::kBreaks,
       "files, random or copy"},
      {"data.path", "--data-path", "", &c.data.path, kScopeTrain | kScopePlan, ResumeRule::kData,
       "files: a .npy/.bin token file, a directory of them, or a glob"},
      {"data.documents", "--documents", "", &c.data.documents, kScopeTrain | kScopePlan,
       ResumeRule::kBreaks,
       "packed documents: none (one per sequence), eos:ID (a document ends after the id ID) or "
       "index (the documents of Megatron .bin/.idx datasets in data.path)"},
      {"data.val_path", "--val-path", "", &c.data.val_path, kScopeTrain, ResumeRule::kFree,
       "held-out token files for the validation loss (as data.path); \"\" = held-out sequences "
       "of the copy / random task"},
      {"checkpoint.dir", "--checkpoint-dir", "", &c.checkpoint.dir, kScopeTrain, ResumeRule::kFree,
       "where checkpoints go; \"\" = no checkpoints"},
      {"checkpoint.interval", "--checkpoint-interval", "", &c.checkpoint.interval, kScopeTrain,
       ResumeRule::kFree, "steps between checkpoints; 0 = only at the end"},
      {"checkpoint.keep", "--checkpoint-keep", "", &c.checkpoint.keep, kScopeTrain,
       ResumeRule::kFree, "complete checkpoints kept, newest first"},
      {"metrics.path", "--metrics-path", "", &c.metrics.path, kScopeTrain, ResumeRule::kFree,
       "JSONL file, one object per step; \"\" = none"},
      {"metrics.log_interval", "--log-interval", "", &c.metrics.log_interval, kScopeTrain,
       ResumeRule::kFree, "steps between log lines"},
      {"metrics.progress", "--progress", "", &c.metrics.progress, kScopeTrain, ResumeRule::kFree,
       "auto (a progress bar when stdout is a terminal), bar or lines"},
      {"metrics.val_interval", "--val-interval", "", &c.metrics.val_interval, kScopeTrain,
       ResumeRule::kFree, "steps between validation losses (forward only); 0 = none"},
      {"metrics.val_sequences", "--val-sequences", "", &c.metrics.val_sequences, kScopeTrain,
       ResumeRule::kFree,
       "held-out sequences of S tokens per validation (at most 1000000): the first "
       "non-overlapping windows of data.val_path"},
      {"metrics.peak_flops", "--peak-flops", "", &c.metrics.peak_flops, kScopeTrain | kScopePlan,
       ResumeRule::kFree,
       "MFU's denominator, FLOP/s per rank (e.g. 989e12: an H200's dense bf16 peak); 0 = this "
       "machine's GEMM rate in the compute dtype, measured at start"},
      {"device.backend", "--backend", "", &c.device.backend, kAll | kScopeKernel,
       ResumeRule::kArithmetic,
       "what every rank computes on: cpu, or cuda (one GPU per rank: local rank mod the GPUs; "
       "upipe plan then plans the GPU's workspaces and needs none)"},
      {"comm.timeout",
       "--timeout",
       "",
       &c.comm.timeout,
       kRunning,
       ResumeRule::kFree,
       "seconds a collective or step may make no progress before the job is ended (at least 0.1); "
       "0 = never",
       {{"comm.timeout_s"}}},
  };
}

const char* type_name(const FieldPtr& p) {
  return std::visit(
      [](auto v) -> const char* {
        using T = decltype(v);
        if constexpr (std::is_same_v<T, double*>) return "float";
        if constexpr (std::is_same_v<T, bool*>) return "bool";
        if constexpr (std::is_same_v<T, std::string*>) return "string";
        if constexpr (std::is_same_v<T, DType*>) return "dtype";
        if constexpr (std::is_same_v<T, Recompute*>) return "recompute";
        if constexpr (std::is_same_v<T, BytesRef>) return "bytes";
        if constexpr (std::is_same_v<T, DurationRef>) return "duration";
        if constexpr (std::is_same_v<T, KnobRef>) return "knob";
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

// The value as the run file writes it (flags: the same text without TOML's quotes).
std::string value_text(const FieldPtr& p, bool toml) {
  auto quoted = [&](std::string s) { return toml ? toml_string(s) : s; };
  return std::visit(
      [&](auto v) -> std::string {
        using T = decltype(v);
        if constexpr (std::is_same_v<T, double*>)
          return toml ? toml_float(*v) : fmt::format("{}", *v);
        else if constexpr (std::is_same_v<T, bool*>)
          return *v ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string*>)
          return quoted(*v);
        else if constexpr (std::is_same_v<T, DType*>)
          return quoted(dtype_name(*v));
        else if constexpr (std::is_same_v<T, Recompute*>)
          return quoted(recompute_name(*v));
        else if constexpr (std::is_same_v<T, BytesRef>)
          return quoted(bytes_text(*v.v));
        else if constexpr (std::is_same_v<T, DurationRef>)
          return quoted(duration_text(*v.v));
        else if constexpr (std::is_same_v<T, KnobRef>)
          return *v.v == kKnobAuto ? quoted("auto") : fmt::format("{}", *v.v);
        else
          return fmt::format("{}", *v);
      },
      p);
}

// A name as it appears on the command line or in a file, resolved to its field.
struct Match {
  Field* field = nullptr;
  const Alias* alias = nullptr;  // the older spelling used, if any
};

// `name` is a key, a flag, a short flag, an alias, or any key or key alias written --key.
Match find_field(std::vector<Field>& fs, std::string_view name) {
  const std::string_view bare = name.substr(0, 2) == "--" ? name.substr(2) : name;
  for (Field& f : fs) {
    if (name == f.key || name == f.flag || (*f.short_flag && name == f.short_flag) ||
        (bare != name && bare == f.key))
      return {&f, nullptr};
    for (const Alias& a : f.aliases)
      if (name == a.name || (a.name[0] != '-' && bare != name && bare == a.name)) return {&f, &a};
  }
  return {};
}

// The note printed when an older spelling is used: "--head-chunk is now --stage-heads".
std::string alias_note(const Field& f, std::string_view used, bool in_file) {
  return in_file ? fmt::format("{} is now {} in the run file", used, f.key)
                 : fmt::format("{} is now {}", used, f.flag);
}

// A name other tools give a setting, as a run-file key writes it (a flag's dashes read as
// underscores), and what to know when it is not the same thing.
struct Synonym {
  const char* name;
  const char* key;
  const char* note = nullptr;
};
constexpr Synonym kSynonyms[] = {
    {"learning_rate", "train.lr"},
    {"seq_length", "train.seq_len"},
    {"sequence_length", "train.seq_len"},
    {"context_length", "train.seq_len"},
    {"gradient_accumulation_steps", "train.micro_steps"},
    {"batch_size", "train.micro_steps",
     "sequences per DP rank per step: a step's global batch is DP x that many sequences"},
    {"warmup", "train.warmup_steps"},
    {"max_grad_norm", "train.grad_clip"}};

const Synonym* synonym_of(std::string_view name) {
  std::string n(name.substr(std::min(name.find_first_not_of('-'), name.size())));
  std::replace(n.begin(), n.end(), '-', '_');
  for (const Synonym& s : kSynonyms)
    if (n == s.name) return &s;
  return nullptr;
}

// The words of a name as typed, without those other tools put before a setting's own
// ("--max-steps", "num_steps" -> steps; "train.seq_len" -> train seq len).
std::vector<std::string> own_words(std::string_view name) {
  static constexpr std::string_view kQualifiers[] = {"max", "num", "n", "number", "total"};
  std::vector<std::string> words;
  for (size_t i = 0; i < name.size();) {
    const size_t e = std::min(name.find_first_of("-_.", i), name.size());
    const std::string_view w = name.substr(i, e - i);
    if (!w.empty() &&
        std::find(std::begin(kQualifiers), std::end(kQualifiers), w) == std::end(kQualifiers))
      words.emplace_back(w);
    i = e + 1;
  }
  return words;
}

// Whether `typed` is `name` in its words: "--train-steps" is train.steps, "[model] lr" train.lr's
// leaf, "--max-steps" --steps.
bool same_words(std::string_view typed, std::string_view name) {
  const std::vector<std::string> t = own_words(typed);
  return !t.empty() && t == own_words(name);
}

// The part of a key after its table: "train.lr" -> "lr".
std::string_view leaf_of(std::string_view key) {
  return key.substr(key.find('.') == std::string_view::npos ? 0 : key.find('.') + 1);
}

// The one key of a table that names a place on disk, for a name of a place typed in that table
// ("[checkpoint] path" is checkpoint.dir, not metrics.path, the nearest key named "path").
std::string path_key_in_table(std::string_view key) {
  static constexpr std::string_view kPlaces[] = {
      "path", "dir",      "directory", "folder",     "location",
      "file", "save_dir", "save_path", "output_dir", "output_path"};
  static constexpr std::string_view kPathKeys[] = {"checkpoint.dir", "data.path", "metrics.path"};
  const size_t dot = key.find('.');
  if (dot == std::string_view::npos) return "";
  std::string leaf(key.substr(dot + 1));
  std::replace(leaf.begin(), leaf.end(), '-', '_');
  std::transform(leaf.begin(), leaf.end(), leaf.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  if (std::find(std::begin(kPlaces), std::end(kPlaces), leaf) == std::end(kPlaces)) return "";
  for (const std::string_view k : kPathKeys)
    if (k.substr(0, k.find('.') + 1) == key.substr(0, dot + 1)) return std::string(k);
  return "";
}

[[noreturn]] void unknown_key(const std::string& where, const std::string& key) {
  const Synonym* s = synonym_of(leaf_of(key.substr(0, 64)));
  const std::string near = closest_run_key(key);
  throw ConfigError(
      near.empty()
          ? fmt::format("{}unknown key '{}' (`upipe settings` lists every key of a run file)",
                        where, excerpt(key))
          : fmt::format("{}unknown key '{}'; did you mean '{}'?{}", where, excerpt(key), near,
                        s && s->note ? fmt::format(" ({})", s->note) : ""));
}

template <class Int>
void set_int(Int* out, int64_t v, const std::string& where, const char* name) {
  if (v < int64_t(std::numeric_limits<Int>::min()) || v > int64_t(std::numeric_limits<Int>::max()))
    throw ConfigError(fmt::format("{}{}: {} is out of range [{}, {}]", where, name, v,
                                  std::numeric_limits<Int>::min(),
                                  std::numeric_limits<Int>::max()));
  *out = Int(v);
}

bool read_int(const std::string& text, int64_t& v) {
  const char* e = text.data() + text.size();
  const auto [end, ec] = std::from_chars(text.data(), e, v);
  return !text.empty() && ec == std::errc() && end == e;
}

// Where a whole number was written with a K/M/G suffix (as sequence lengths are spoken of), the
// digits it may mean: "; write it in digits: 128K is 131072 (x 1024) or 128000 (x 1000)" (both:
// "128K tokens" is 131072 to some, 128000 to others); else "".
std::string digits_hint(const std::string& text) {
  const std::string_view kSuffixes = "kKmMgG";
  const size_t at = text.empty() ? std::string::npos : kSuffixes.find(text.back());
  int64_t n = 0;
  if (at == std::string::npos || text.size() > 10 ||
      !read_int(text.substr(0, text.size() - 1), n) || n < 0)
    return "";
  const int power = int(at / 2) + 1;  // K: 1, M: 2, G: 3
  int64_t bin = n, dec = n;
  for (int i = 0; i < power; ++i) {
    bin *= 1024;  // at most 999999999 x 1024^3 < 2^63
    dec *= 1000;
  }
  const char* times = power == 1 ? "" : power == 2 ? "^2" : "^3";
  return fmt::format("; write it in digits: {} is {} (x 1024{}) or {} (x 1000{})", text, bin, times,
                     dec, times);
}

// Sets `f` from text (a flag's value, or a TOML string for the types written as strings);
// `where` names the place in messages ("--seq-len", "run.toml:3: parallel.method").
void set_from_text(const Field& f, const std::string& text, const std::string& where, bool gib) {
  std::visit(
      [&](auto v) {
        using T = decltype(v);
        if constexpr (std::is_same_v<T, double*>) {
          double d = 0;
          const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
          if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
              !std::isfinite(d))
            throw ConfigError(fmt::format("{}: '{}' is not a finite number", where, text));
          *v = d;
        } else if constexpr (std::is_same_v<T, bool*>) {
          if (text == "true" || text == "1")
            *v = true;
          else if (text == "false" || text == "0")
            *v = false;
          else
            throw ConfigError(fmt::format("{}: '{}' is not true or false", where, text));
        } else if constexpr (std::is_same_v<T, std::string*>) {
          // A NUL (TOML's \u0000) would end a path early: another file than the one written.
          if (text.find('\0') != std::string::npos)
            throw ConfigError(
                fmt::format("{}: '{}' holds a NUL character, which no path or name "
                            "may hold",
                            where, excerpt(text.substr(0, text.find('\0')))));
          *v = text;
        } else if constexpr (std::is_same_v<T, DType*>) {
          if (text != "fp32" && text != "bf16")
            throw ConfigError(fmt::format("{}: '{}' is unknown; choose fp32 or bf16", where, text));
          *v = parse_dtype(text);
        } else if constexpr (std::is_same_v<T, Recompute*>) {
          if (text != "layer" && text != "block" && text != "none")
            throw ConfigError(
                fmt::format("{}: '{}' is unknown; choose layer, block or none", where, text));
          *v = parse_recompute(text);
        } else if constexpr (std::is_same_v<T, BytesRef>) {
          *v.v = parse_bytes(gib ? text + "G" : text, where);
          // A memory budget of a few bytes is a unit left out: "--device-memory 80" read as 80 B.
          if (!gib && !text.empty() && std::isdigit(static_cast<unsigned char>(text.back())) &&
              *v.v < kMinUnitlessBudget)
            throw ConfigError(fmt::format(
                "{}: {} is {} bytes, too small for a memory budget; did you mean {}G? (a size "
                "without a unit is bytes: write {}G, {}M, or {}B for bytes)",
                where, text, *v.v, text, text, text, text));
        } else if constexpr (std::is_same_v<T, DurationRef>) {
          *v.v = parse_duration(text, where);
        } else if constexpr (std::is_same_v<T, KnobRef>) {
          int64_t i = 0;
          if (text == "auto")
            *v.v = kKnobAuto;
          else if (read_int(text, i) && i >= 0)
            set_int(v.v, i, where + ": ", f.key);
          else
            throw ConfigError(
                fmt::format("{}: '{}' is not a whole number >= 0 or auto", where, text));
        } else {
          int64_t i = 0;
          if (!read_int(text, i))
            throw ConfigError(
                fmt::format("{}: '{}' is not an integer{}", where, text, digits_hint(text)));
          set_int(v, i, where + ": ", f.key);
        }
      },
      f.ptr);
}

// Sets `f` from a TOML node; `where` prefixes messages ("run.toml:3: ").
void set_from_toml(const Field& f, const toml::node& n, const std::string& where,
                   const std::string& name, bool gib) {
  auto wrong = [&](const char* want) {
    std::ostringstream got;
    got << n.type();
    throw ConfigError(fmt::format("{}{} must be {}, got a TOML {}", where, name, want, got.str()));
  };
  const std::string at = where + name;
  std::visit(
      [&](auto v) {
        using T = decltype(v);
        if constexpr (std::is_same_v<T, double*>) {
          if (auto d = n.value_exact<double>())
            *v = *d;
          else if (auto i = n.value_exact<int64_t>())
            *v = double(*i);
          else
            wrong("a number");
        } else if constexpr (std::is_same_v<T, bool*>) {
          if (auto b = n.value_exact<bool>())
            *v = *b;
          else
            wrong("true or false");
        } else if constexpr (std::is_same_v<T, int*> || std::is_same_v<T, int64_t*>) {
          if (auto i = n.value_exact<int64_t>())
            set_int(v, *i, where, name.c_str());
          else if (auto s = n.value_exact<std::string>(); s && !digits_hint(*s).empty())
            throw ConfigError(fmt::format("{}{} must be an integer, got the TOML string \"{}\"{}",
                                          where, name, *s, digits_hint(*s)));  // "128K"
          else
            wrong("an integer");
        } else if constexpr (std::is_same_v<T, BytesRef>) {
          if (gib) {
            const std::optional<double> d =
                n.is_integer() ? std::optional<double>(double(*n.value_exact<int64_t>()))
                               : n.value_exact<double>();
            if (!d) wrong("a number of GiB");
            set_from_text(f, fmt::format("{}", *d), at, true);
          } else if (auto i = n.value_exact<int64_t>()) {
            set_from_text(f, std::to_string(*i), at, false);
          } else if (auto s = n.value_exact<std::string>()) {
            set_from_text(f, *s, at, false);
          } else {
            wrong("a size such as \"80G\" or a number of bytes");
          }
        } else if constexpr (std::is_same_v<T, DurationRef>) {
          if (auto i = n.value_exact<int64_t>())
            set_from_text(f, std::to_string(*i), at, false);
          else if (auto s = n.value_exact<std::string>())
            set_from_text(f, *s, at, false);
          else
            wrong("a duration such as \"3h50m\" or \"3:50:00\"");
        } else if constexpr (std::is_same_v<T, KnobRef>) {
          if (auto i = n.value_exact<int64_t>())
            set_from_text(f, std::to_string(*i), at, false);
          else if (auto s = n.value_exact<std::string>(); s && *s == "auto")
            *v.v = kKnobAuto;
          else
            wrong("a whole number or \"auto\"");
        } else {  // string, dtype, recompute
          if (auto s = n.value_exact<std::string>())
            set_from_text(f, *s, at, false);
          else
            wrong("a string");
        }
      },
      f.ptr);
}

[[noreturn]] void bad(const std::string& key, const std::string& what) {
  throw ConfigError(fmt::format("{} {}", setting_ref(key), what));
}

bool one_of(const std::string& v, std::initializer_list<const char*> options) {
  for (const char* o : options)
    if (v == o) return true;
  return false;
}

// What an unknown flag may have meant, of the settings of `scopes` and the command's own flags.
struct FlagHint {
  std::string flag;            // "" = nothing near
  const char* note = nullptr;  // a synonym's note
};
FlagHint flag_hint(const std::vector<Field>& fs, const std::string& bare, uint32_t scopes,
                   std::span<const std::string> own_flags) {
  // A name other tools use (--learning-rate), then a setting's words with max, num or total
  // before them or its table's (--max-steps, --train-steps), then the nearest spelling.
  if (const Synonym* s = synonym_of(bare))
    for (const Field& f : fs)
      if (f.key == std::string_view(s->key) && (f.scopes & scopes)) return {f.flag, s->note};
  std::vector<std::string> same;
  for (const Field& f : fs)
    if ((f.scopes & scopes) && (same_words(bare, f.flag) || same_words(bare, f.key)))
      same.push_back(f.flag);
  if (!same.empty()) return {closest_name(bare, same)};
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const Field& f : fs) {
    if (!(f.scopes & scopes)) continue;
    const std::string leaf = std::string(f.flag).substr(2);
    const size_t d = std::min(edit_distance(bare, leaf), edit_distance(bare, f.key));
    if (d < best_d) best_d = d, best = f.flag;
  }
  for (const std::string& flag : own_flags) {
    const size_t d = edit_distance(bare, flag.substr(flag.find_first_not_of('-')));
    if (d < best_d) best_d = d, best = flag;
  }
  // A suggestion only where it is near (--json is not a misspelt --lr).
  if (best_d > near_limit(bare)) return {};
  return {best};
}

// The setting the user wrote as `name`, or a ConfigError suggesting the closest one of `scopes`.
Match find_flag(std::vector<Field>& fs, const std::string& name, uint32_t scopes,
                std::span<const std::string> own_flags) {
  const Match m = find_field(fs, name);
  if (!m.field) {
    const FlagHint h = flag_hint(fs, name.substr(name.find_first_not_of('-')), scopes, own_flags);
    if (h.flag.empty())
      throw ConfigError(fmt::format(
          "unknown option '{}' (`upipe settings` lists the settings, --help a command's own "
          "options)",
          name));
    throw ConfigError(fmt::format("unknown option '{}'; did you mean '{}'?{}", name, h.flag,
                                  h.note ? fmt::format(" ({})", h.note) : ""));
  }
  if (!(m.field->scopes & scopes))
    throw ConfigError(
        fmt::format("{} ({}) is not a setting of this command; its --help lists the ones it takes",
                    name, m.field->key));
  return m;
}

}  // namespace

int64_t parse_bytes(const std::string& s, std::string_view key, bool allow_zero) {
  const std::string example = "write e.g. 80G, 512M or 1048576";
  const std::string name(key);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  const std::string_view number(s.data(), i);
  const bool whole = number.find('.') == std::string_view::npos;
  // A whole number is read exactly (a double rounds past 2^53 bytes); a fraction through a double.
  uint64_t n = 0;
  double v = 0;
  const auto [end, ec] = whole ? std::from_chars(number.data(), number.data() + i, n)
                               : std::from_chars(number.data(), number.data() + i, v);
  const bool too_many_digits = whole && ec == std::errc::result_out_of_range;
  if (i == 0 || (ec != std::errc() && !too_many_digits) || end != number.data() + i)
    throw ConfigError(fmt::format("{}: cannot read '{}' as a byte size; {}", name, s, example));
  std::string unit = s.substr(i);
  for (char& ch : unit) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  int shift = 0;
  if (unit.empty() || unit == "b")
    shift = 0;
  else if (unit == "k" || unit == "kb" || unit == "kib")
    shift = 10;
  else if (unit == "m" || unit == "mb" || unit == "mib")
    shift = 20;
  else if (unit == "g" || unit == "gb" || unit == "gib")
    shift = 30;
  else if (unit == "t" || unit == "tb" || unit == "tib")
    shift = 40;
  else
    throw ConfigError(fmt::format("{}: unknown size unit in '{}'; use K, M, G or T", name, s));
  auto too_large = [&] {
    return ConfigError(
        fmt::format("{}: '{}' is more than 1048576T (1 EiB); give a smaller size", name, s));
  };
  auto too_small = [&] {
    return ConfigError(
        fmt::format("{}: '{}' is less than one byte; give a positive size, {}", name, s, example));
  };
  if (whole) {
    if (too_many_digits || n > (uint64_t(kMaxMemoryBytes) >> shift)) throw too_large();
    if (n == 0 && !allow_zero) throw too_small();
    return int64_t(n << shift);
  }
  const double bytes = std::ldexp(v, shift);
  if (allow_zero && bytes == 0) return 0;
  if (!(bytes >= 1)) throw too_small();
  if (bytes > double(kMaxMemoryBytes)) throw too_large();
  // A fraction of a unit is what it says (1.5G, floored to whole bytes); a fraction of a byte is
  // a unit left out (2.7 read as 2 B before).
  if (shift == 0 && bytes != std::floor(bytes))
    throw ConfigError(
        fmt::format("{}: '{}' is not a whole number of bytes (a unit missing, e.g. {}G?); {}", name,
                    s, s, example));
  return int64_t(std::floor(bytes));
}

std::string bytes_text(int64_t b) {
  const char* units = "KMGT";
  int u = -1;
  while (u < 3 && b % (int64_t(1024) << (10 * (u + 1))) == 0 && b > 0) ++u;
  if (u < 0) return std::to_string(b) + (b < kMinUnitlessBudget ? "B" : "");
  return std::to_string(b >> (10 * (u + 1))) + units[u];
}

int64_t parse_duration(const std::string& s, std::string_view key) {
  const std::string forms = "a duration such as 3h50m, 90m, 45s or SLURM's [D-]H:MM:SS; 0 = none";
  auto bad = [&](const std::string& why) -> int64_t {
    throw ConfigError(fmt::format("{}: '{}' {}", key, excerpt(s), why));
  };
  // A run of 1 to 9 digits (a field of at most 10^9 keeps every sum far inside int64).
  auto number = [](std::string_view t, int64_t& v) {
    if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string_view::npos)
      return false;
    v = std::stoll(std::string(t));
    return true;
  };
  if (s.empty()) return bad("is empty: give " + forms);
  if (s.find_first_not_of("0") == std::string::npos) return 0;
  // squeue's %L for a job without a limit.
  if (s == "UNLIMITED" || s == "INFINITE") return 0;
  int64_t total = 0;
  if (s.find_first_of(":-") != std::string::npos) {
    // SLURM: MM:SS, H:MM:SS, D-H, D-H:MM, D-H:MM:SS.
    std::string_view rest = s;
    int64_t days = 0;
    const size_t dash = s.find('-');
    const bool with_days = dash != std::string::npos;
    if (with_days && !number(rest.substr(0, dash), days))
      return bad("is not SLURM's D-H:MM:SS: give " + forms);
    if (with_days) rest.remove_prefix(dash + 1);
    std::vector<int64_t> parts;
    for (size_t i = 0;;) {
      const size_t e = std::min(rest.find(':', i), rest.size());
      int64_t v = 0;
      if (!number(rest.substr(i, e - i), v))
        return bad("is not SLURM's [D-]H:MM:SS: give " + forms);
      parts.push_back(v);
      if (e == rest.size()) break;
      i = e + 1;
    }
    if (parts.size() > 3 || (!with_days && parts.size() < 2))
      return bad("is not SLURM's [D-]H:MM:SS: give " + forms);
    for (size_t i = 1; i < parts.size(); ++i)
      if (parts[i] >= 60) return bad("has minutes or seconds past 59: give " + forms);
    // With days the fields are H[:MM[:SS]]; without, MM:SS or H:MM:SS.
    const int64_t scale[3] = {3600, 60, 1};
    const size_t first = with_days ? 0 : 3 - parts.size();
    total = days * 86400;
    for (size_t i = 0; i < parts.size(); ++i) total += parts[i] * scale[first + i];
  } else {
    if (s.find_first_not_of("0123456789") == std::string::npos)
      return bad(fmt::format(
          "has no unit: write {0}s, {0}m or {0}h (SLURM reads a bare number as minutes, a "
          "timeout as seconds); 0 = none",
          excerpt(s)));
    constexpr std::string_view kUnits = "dhms";
    constexpr int64_t kSeconds[] = {86400, 3600, 60, 1};
    size_t next_unit = 0, i = 0;
    while (i < s.size()) {
      const size_t e = s.find_first_not_of("0123456789", i);
      int64_t v = 0;
      const size_t u = e == std::string::npos ? std::string::npos : kUnits.find(s[e], next_unit);
      if (e == std::string::npos || !number(std::string_view(s).substr(i, e - i), v) ||
          u == std::string_view::npos)
        return bad("is not a duration: give " + forms + " (units d, h, m, s, largest first)");
      total += v * kSeconds[u];
      next_unit = u + 1;
      i = e + 1;
    }
  }
  if (total > kMaxDurationS) return bad("is longer than 366 days");
  return total;
}

std::string duration_text(int64_t seconds) {
  if (seconds <= 0) return "0";
  std::string out;
  const std::pair<int64_t, char> units[] = {{86400, 'd'}, {3600, 'h'}, {60, 'm'}, {1, 's'}};
  for (const auto& [size, unit] : units)
    if (seconds >= size) {
      out += std::to_string(seconds / size) + unit;
      seconds %= size;
    }
  return out;
}

const std::vector<SettingInfo>& settings() {
  static const std::vector<SettingInfo> out = [] {
    RunConfig defaults;
    std::vector<SettingInfo> v;
    for (const Field& f : fields(defaults)) {
      SettingInfo s{f.key,
                    f.flag,
                    f.short_flag,
                    type_name(f.ptr),
                    value_text(f.ptr, true),
                    f.doc,
                    f.scopes,
                    f.resume,
                    {}};
      for (const Alias& a : f.aliases) s.aliases.push_back(a.name);
      v.push_back(std::move(s));
    }
    return v;
  }();
  return out;
}

const SettingInfo* find_setting(std::string_view name) {
  RunConfig probe;
  std::vector<Field> fs = fields(probe);
  const Match m = find_field(fs, name);
  if (!m.field) return nullptr;
  for (const SettingInfo& s : settings())
    if (s.key == m.field->key) return &s;
  return nullptr;
}

std::string closest_run_key(const std::string& name) {
  // Keys have about 30 characters: a longer name is compared by its start (the edit distance to
  // every key of a 2 MB name from a run file took minutes).
  const std::string key = name.substr(0, 64);
  const std::string_view bare = leaf_of(key);
  if (const Synonym* s = synonym_of(bare)) return s->key;
  if (std::string place = path_key_in_table(key); !place.empty()) return place;
  // The name of a key of another table ("[model] lr" is train.lr, "[train] max_lr" too): that
  // key, the nearest of several (data.path, metrics.path).
  std::vector<std::string> same;
  for (const SettingInfo& k : settings()) {
    bool named = same_words(bare, leaf_of(k.key));
    for (const std::string& a : k.aliases)
      named = named || (a[0] != '-' && same_words(bare, leaf_of(a)));
    if (named) same.push_back(k.key);
  }
  if (!same.empty()) return closest_name(key, same);
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const SettingInfo& k : settings()) {
    std::vector<std::string> names{k.key};
    for (const std::string& a : k.aliases)
      if (a[0] != '-') names.push_back(a);
    for (const std::string& n : names) {
      size_t d = edit_distance(key, n);
      // "lr" is closest to "train.lr": a bare name is compared with the part after the section.
      if (key.find('.') == std::string::npos)
        d = std::min(d, edit_distance(key, std::string_view(n).substr(n.find('.') + 1)));
      // A truncated key ("train.warmup") is nearest to the key it begins.
      if (!key.empty() && n.find(key) != std::string::npos) d = std::min<size_t>(d, 1);
      if (d < best_d) best_d = d, best = k.key;
    }
  }
  // Nothing near: no suggestion ("[zz] a" was asked whether it meant train.lr), as for flags.
  return best_d <= near_limit(key) ? best : "";
}

namespace {

// A table's entries in the order the file writes them (toml++ walks them by name): the first
// problem in the file is the one said ("[trian]" with steps on line 9 and lr on line 11 was said
// at line 11).
std::vector<std::pair<std::string, const toml::node*>> in_file_order(const toml::table& t) {
  std::vector<std::pair<std::string, const toml::node*>> v;
  for (const auto& [key, node] : t) v.emplace_back(std::string(key.str()), &node);
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    const toml::source_position x = a.second->source().begin, y = b.second->source().begin;
    return std::tie(x.line, x.column) < std::tie(y.line, y.column);
  });
  return v;
}

}  // namespace

RunConfig parse_run_toml(std::string_view text, const std::string& source,
                         SettingSources* sources) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}:{}:{}: {}", source, e.source().begin.line,
                                  e.source().begin.column, e.description()));
  }
  RunConfig c;
  std::vector<Field> fs = fields(c);
  std::map<std::string, std::string> set_by;  // key -> where the file set it, as spelled there
  for (const auto& [sec, node] : in_file_order(root)) {
    const std::string at = fmt::format("{}:{}: ", source, node->source().begin.line);
    const toml::table* t = node->as_table();
    if (!t)
      throw ConfigError(fmt::format(
          "{}'{}' is not a [section]; keys are written inside sections, e.g. [train] steps = "
          "100{}",
          at, excerpt(sec),
          closest_run_key(sec).empty() ? "" : " (did you mean '" + closest_run_key(sec) + "'?)"));
    for (const auto& [key, node] : in_file_order(*t)) {
      const toml::node& value = *node;
      const std::string full = sec + "." + key;
      const std::string vat = fmt::format("{}:{}: ", source, value.source().begin.line);
      const Match m = full.find('-') == std::string::npos ? find_field(fs, full) : Match{};
      if (!m.field || (m.alias && m.alias->name[0] == '-')) unknown_key(vat, full);
      // An older spelling beside the new one (or two older ones): which applies would be the
      // order toml++ walks the sections in, not the file's.
      const std::string here = fmt::format("{} (line {})", full, value.source().begin.line);
      if (const auto [it, fresh] = set_by.emplace(m.field->key, here); !fresh)
        throw ConfigError(
            fmt::format("{}{} and {} both set {} (an older spelling beside the new one): keep one",
                        vat, full, it->second, m.field->key));
      set_from_toml(*m.field, value, vat, full, m.alias && m.alias->gib);
      if (sources) {
        sources->spelled[m.field->key] = fmt::format("{} in {}", full, source);
        if (m.alias) sources->notes.push_back(alias_note(*m.field, full, true));
      }
    }
  }
  return c;
}

void apply_override(RunConfig& c, const std::string& name, const std::string& value) {
  std::vector<Field> fs = fields(c);
  const Match m = find_field(fs, name);
  if (!m.field) unknown_key(fmt::format("{}: ", name), name);
  set_from_text(*m.field, value, name, m.alias && m.alias->gib);
}

void apply_overrides(RunConfig& c, std::span<const std::string> args, uint32_t scopes,
                     SettingSources* sources, std::span<const std::string> own_flags) {
  RunConfig out = c;  // applied only when every argument is good
  std::vector<Field> fs = fields(out);
  SettingSources seen;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 2 || a[0] != '-' || a == "--")
      throw ConfigError(fmt::format(
          "unexpected argument '{}'; settings are written --flag=value or --flag value, e.g. "
          "--steps=100",
          a));
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq);
    const Match m = find_flag(fs, name, scopes, own_flags);
    const bool is_bool = std::holds_alternative<bool*>(m.field->ptr);
    std::string value;
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else if (is_bool) {
      value = "true";
      if (i + 1 < args.size() && one_of(args[i + 1], {"true", "false", "1", "0"}))
        value = args[++i];
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw ConfigError(fmt::format("{} needs a value, e.g. {}=VALUE", name, name));
    }
    set_from_text(*m.field, value, name, m.alias && m.alias->gib);
    seen.spelled[m.field->key] = name;
    if (m.alias || (name.find('.') != std::string::npos && name != m.field->key))
      seen.notes.push_back(alias_note(*m.field, name, false));
  }
  c = out;
  if (sources) {
    for (auto& [k, v] : seen.spelled) sources->spelled[k] = v;
    for (std::string& n : seen.notes)
      if (std::find(sources->notes.begin(), sources->notes.end(), n) == sources->notes.end())
        sources->notes.push_back(std::move(n));
  }
}

void make_paths_absolute(RunConfig& c, const std::function<bool(std::string_view key)>& which) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto absolute = [&](const char* key, std::string& v, bool must_exist) {
    if (v.empty() || !which(key) || (must_exist && !fs::exists(v, ec))) return;
    const fs::path a = fs::absolute(v, ec);
    if (ec) return;
    fs::path n = a.lexically_normal();
    if (n.has_relative_path() && n.filename().empty()) n = n.parent_path();  // "dset/" is "dset"
    v = n.string();
  };
  absolute("model.name", c.model.name, true);  // a preset's name stays a name
  absolute("model.init_from", c.model.init_from, false);
  absolute("data.path", c.data.path, false);
  absolute("data.val_path", c.data.val_path, false);
  absolute("checkpoint.dir", c.checkpoint.dir, false);
  absolute("metrics.path", c.metrics.path, false);
}

void validate(const RunConfig& c, uint32_t scopes) {
  const bool allow_plan = scopes & kScopePlan;
  const auto& p = c.parallel;
  const auto& t = c.train;
  if (c.model.name.empty()) bad("model.name", "is empty; give a preset name or a directory");
  if (p.cp_size < 0 || p.cp_size > kMaxRanks)
    bad("parallel.cp_size", fmt::format("must be in [0, {}], got {}", kMaxRanks, p.cp_size));
  if (allow_plan && names_many_methods(p.knobs.method))
    planned_methods(p.knobs.method, 1);  // every name known; each plans with the knobs it takes
  else
    validate_knobs(p.knobs, allow_plan);
  if (t.steps <= 0) bad("train.steps", fmt::format("must be positive, got {}", t.steps));
  if (t.seq_len < 2 || t.seq_len > kMaxSeqLen)
    bad("train.seq_len", fmt::format("must be in [2, {}], got {}", kMaxSeqLen, t.seq_len));
  if (t.micro_steps < 1)
    bad("train.micro_steps", fmt::format("must be >= 1, got {}", t.micro_steps));
  if (!std::isfinite(float(t.lr)) || t.lr < 0)
    bad("train.lr", fmt::format("must be a number >= 0 that a float holds, got {}", t.lr));
  if (!(t.min_lr_ratio >= 0 && t.min_lr_ratio <= 1))
    bad("train.min_lr_ratio", fmt::format("must be in [0, 1], got {}", t.min_lr_ratio));
  if (t.warmup_steps < 0)
    bad("train.warmup_steps", fmt::format("must be >= 0, got {}", t.warmup_steps));
  if (!std::isfinite(float(t.weight_decay)) || t.weight_decay < 0)
    bad("train.weight_decay",
        fmt::format("must be a number >= 0 that a float holds, got {}", t.weight_decay));
  if (!(t.beta1 >= 0 && t.beta1 < 1))
    bad("train.beta1", fmt::format("must be in [0, 1), got {}", t.beta1));
  if (!(t.beta2 >= 0 && t.beta2 < 1))
    bad("train.beta2", fmt::format("must be in [0, 1), got {}", t.beta2));
  // The optimizer's kernels take it as a float: 1e-46 became 0 there (and a NaN step).
  if (!(float(t.eps) > 0) || !std::isfinite(float(t.eps)))
    bad("train.eps",
        fmt::format("must be a number > 0 that a float holds (>= 1.4e-45), got {}", t.eps));
  if (!std::isfinite(t.grad_clip) || t.grad_clip < 0)
    bad("train.grad_clip", fmt::format("must be >= 0 (0 = no clipping), got {}", t.grad_clip));
  if (t.seed < 0) bad("train.seed", fmt::format("must be >= 0, got {}", t.seed));
  c.memory.policy.validate();
  if (!one_of(c.device.backend, {"cpu", "cuda"}))
    bad("device.backend", fmt::format("'{}' is unknown; choose cpu or cuda", c.device.backend));
  if (c.device.backend == "cuda" && !cuda_backend_built())
    bad("device.backend",
        "is cuda, but this upipe was built without the CUDA backend; rebuild where nvcc is "
        "found (cmake -DUPIPE_CUDA=ON)");
  if (!one_of(c.data.kind, {"files", "random", "copy"}))
    bad("data.kind", fmt::format("'{}' is unknown; choose files, random or copy", c.data.kind));
  // An unknown value is a ConfigError naming data.documents.
  if (parse_documents_mode(c.data.documents).kind != DocumentsMode::Kind::kNone &&
      c.data.kind != "files")
    bad("data.documents", fmt::format("needs data.kind = \"files\" (the {} task has one "
                                      "document per sequence)",
                                      c.data.kind));
  if (c.data.kind == "files" && c.data.path.empty())
    bad("data.path", "is required when data.kind = \"files\" (a token file, directory or glob)");
  // A path given to a run that reads none: it trained on the copy task without a word.
  for (const auto& [key, path] :
       {std::pair{"data.path", &c.data.path}, std::pair{"data.val_path", &c.data.val_path}})
    if (c.data.kind != "files" && !path->empty())
      bad(key, fmt::format("names a file, but the run trains on the {} task ({}) and reads "
                           "none: give {} to train on it",
                           c.data.kind,
                           c.data.kind == RunConfig{}.data.kind
                               ? fmt::format("{}'s default", setting_ref("data.kind"))
                               : setting_value("data.kind", c.data.kind),
                           setting_value("data.kind", "files")));
  if ((scopes & kScopeTrain) && c.data.kind == "copy" && t.seq_len % 2 != 0)
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
  if (c.metrics.val_interval < 0)
    bad("metrics.val_interval",
        fmt::format("must be >= 0 (0 = no validation), got {}", c.metrics.val_interval));
  if (!(c.metrics.peak_flops >= 0) || !std::isfinite(c.metrics.peak_flops))
    bad("metrics.peak_flops",
        fmt::format("must be a finite number >= 0 (0 = measure), got {}", c.metrics.peak_flops));
  // Every validation runs them all (a typo of 2^63 would validate forever).
  if (c.metrics.val_sequences < 1 || c.metrics.val_sequences > 1000000)
    bad("metrics.val_sequences",
        fmt::format("must be in [1, 1000000], got {}", c.metrics.val_sequences));
  if ((scopes & kScopeTrain) && c.metrics.val_interval > 0 && c.data.kind == "files" &&
      c.data.val_path.empty())
    bad("metrics.val_interval",
        fmt::format("needs held-out data: give {} (token files not trained on)",
                    setting_ref("data.val_path")));
  if (!one_of(c.metrics.progress, {"auto", "bar", "lines"}))
    bad("metrics.progress",
        fmt::format("'{}' is unknown; choose auto, bar or lines", c.metrics.progress));
  // Below a tenth of a second the watchdog would end a job between two polls of a healthy
  // collective (and poll in a busy loop): 0 turns it off instead.
  if (!(c.comm.timeout == 0 || (c.comm.timeout >= kMinTimeoutS && c.comm.timeout <= 1e7)))
    bad("comm.timeout",
        fmt::format("must be 0 (no watchdog) or a number of seconds in [{}, 1e7], got {}",
                    kMinTimeoutS, c.comm.timeout));
}

RunConfig read_run_file(const std::string& path, SettingSources* sources) {
  return parse_run_toml(read_small_file(path, "run file", int64_t(16) << 20), path, sources);
}

RunConfig load_run_config(const std::string& path, std::span<const std::string> overrides,
                          uint32_t scopes, SettingSources* sources) {
  SettingSources own;
  SettingSources& src = sources ? *sources : own;
  RunConfig c = path.empty() ? RunConfig{} : read_run_file(path, &src);
  apply_overrides(c, overrides, scopes, &src);
  set_setting_speller(setting_speller(src));
  validate(c, scopes);
  return c;
}

std::string to_toml(const RunConfig& c) {
  RunConfig copy = c;
  std::string out = "# upipe run file: the effective configuration (file + command line)\n";
  std::string section;
  for (const Field& f : fields(copy)) {
    const std::string_view name(f.key);
    const std::string sec(name.substr(0, name.find('.')));
    if (sec != section) {
      out += fmt::format("{}[{}]\n", section.empty() ? "" : "\n", sec);
      section = sec;
    }
    const std::string line =
        fmt::format("{} = {}", name.substr(name.find('.') + 1), value_text(f.ptr, true));
    out += fmt::format("{:<30} # {}\n", line, f.doc);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> setting_values(const RunConfig& c) {
  RunConfig copy = c;
  std::vector<std::pair<std::string, std::string>> out;
  for (const Field& f : fields(copy)) out.emplace_back(f.key, value_text(f.ptr, false));
  return out;
}

std::string to_flags(const RunConfig& c, uint32_t scopes, const RunConfig& base) {
  RunConfig copy = c, defaults = base;
  const std::vector<Field> fs = fields(copy), ds = fields(defaults);
  std::string out;
  for (size_t i = 0; i < fs.size(); ++i) {
    if (!(fs[i].scopes & scopes)) continue;
    const std::string v = value_text(fs[i].ptr, false);
    if (v == value_text(ds[i].ptr, false)) continue;
    const bool needs_quotes = v.empty() || v.find_first_of(" \t\"'\\$`") != std::string::npos;
    out += fmt::format("{}{}={}", out.empty() ? "" : " ", fs[i].flag,
                       needs_quotes ? "'" + v + "'" : v);
  }
  return out;
}

std::string commands_of(uint32_t scopes) {
  static const std::pair<uint32_t, const char*> kNames[] = {
      {kScopeTrain, "train, demo"},   {kScopeModel, "eval, bench model"},
      {kScopePlan, "plan"},           {kScopeBlock, "check, bench attention"},
      {kScopeKernel, "bench kernel"}, {kScopeComm, "bench comm"},
      {kScopeDemo, "demo attention"}};
  std::string s;
  for (const auto& [bit, name] : kNames)
    if (scopes & bit) s += (s.empty() ? "" : ", ") + std::string(name);
  return s;
}

SettingSpeller setting_speller(const SettingSources& sources) {
  return [spelled = sources.spelled, scopes = sources.scopes, own = sources.own_flags](
             std::string_view key, const std::optional<std::string>& value) -> std::string {
    const auto it = spelled.find(std::string(key));
    if (it != spelled.end()) {
      const std::string& s = it->second;
      const size_t in = s.find(" in ");
      if (in == std::string::npos) return value ? s + " " + *value : s;    // a flag as typed
      return value ? s.substr(0, in) + " = " + *value + s.substr(in) : s;  // a run file's key
    }
    const SettingInfo* info = find_setting(key);
    const std::string flag = info ? info->flag : default_flag(key);
    const std::string named = value ? flag + " " + *value : flag;
    if (info && scopes != 0 && !(info->scopes & scopes) && !own.count(info->flag))
      return fmt::format("{} (of upipe {})", named, commands_of(info->scopes));
    return named;
  };
}

}  // namespace upipe
