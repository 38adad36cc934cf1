// `upipe eval`: one forward + backward of a Llama-3 / Qwen3 model on one token sequence, split
// over the ranks of the job with any attention strategy: the loss (transformers' labels =
// input_ids mean), the gradient norms, time and per-rank memory; --save-grads writes every
// parameter's fp32 gradient (summed over the ranks) under its Hugging Face name. --doc-lens packs
// the sequence as documents (each attended to and predicted alone; attention/documents.h).
#include <unistd.h>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>

#include "apps/upipe/commands.h"
#include "apps/upipe/model_run.h"
#include "apps/upipe/report.h"
#include "apps/upipe/settings_cli.h"
#include "backend/optim.h"
#include "core/errors.h"
#include "core/safe_fs.h"
#include "core/watchdog.h"
#include "model/decoder.h"
#include "model/doc_lens.h"
#include "model/safetensors.h"
#include "model/tokens.h"
#include "train/data.h"
#include "train/indexed_dataset.h"
#include "train/metrics.h"

namespace upipe::app {
namespace {

struct Options {
  std::string tokens;
  std::string doc_lens;   // packed documents of the sequence (--doc-lens)
  std::string documents;  // --windows: where the data's documents end (data.documents' values)
  std::string save_grads;
  bool loss_only = false;  // forward only: the loss, no gradients
  bool windows = false;    // the loss of every S-token window of --tokens (forward only)
  int64_t max_windows = 0;  // --windows: the first that many windows (0: every one)
  bool json = false;
};

// A window of the data: its tokens (a view used until the next call) and documents (null: one).
struct Window {
  std::span<const int32_t> tokens;
  std::shared_ptr<const Documents> documents;
};

// --loss-only / --windows: the forward alone (no gradient buffers, nothing stashed) on one
// sequence, or on every non-overlapping window of S tokens of the data: the mean loss over the n
// windows of s tokens and its perplexity; window(i) gives window i. Windows of one document each
// count alike (the mean of their means); packed ones count by their predictions, as training's
// validation does (the sum over every window's predictions over their number, counted first).
// `in_data`: the windows the data holds (n of them are evaluated; 1 for one sequence). With stderr
// a terminal, rank 0 shows a bar of the windows done there.
int run_loss(Process& proc, const Options& opt, const RunConfig& cfg, const ModelConfig& m,
             ModelRun& run, int64_t n, int64_t in_data, int64_t s,
             const std::function<Window(int64_t)>& window, bool packed) {
  run.dev.mem().reset_peak();
  const ParamMap no_grads;
  FullParams p(m, run.w, no_grads);
  double predicted = 0;
  int64_t documents = 0;
  for (int64_t i = 0; packed && i < n; ++i) {
    const Window w = window(i);
    predicted += double(w.documents ? w.documents->predictions() : s - 1);
    documents += w.documents ? w.documents->count() : 1;
  }
  if (packed && predicted == 0)
    throw ConfigError("every document of the windows is one token long: nothing is predicted");
  double sum = 0, fwd = 0;
  const bool bar = n > 1 && proc.root() && ::isatty(STDERR_FILENO) == 1;
  for (int64_t i = 0; i < n; ++i) {
    const Window w = window(i);
    LossSpec spec;  // each window's mean over its predictions, or its share of all of them
    spec.scale = packed ? 1.0 / predicted : 0.0;
    spec.documents = w.documents;
    if (!packed) documents += w.documents ? w.documents->count() : 1;
    sum += run.dec->loss(w.tokens, p, spec).loss;
    fwd += run.dec->forward_seconds();
    if (bar) std::fprintf(stderr, "\r%s windows", format_progress_bar(i + 1, n).c_str());
  }
  if (bar) std::fprintf(stderr, "\n");
  const double loss = packed ? sum : sum / double(n);
  const int64_t peak = max_over_ranks(proc.world, run.dev.mem().peak());
  if (!proc.root()) return 0;
  nlohmann::json j = {{"model", m.source},
                      {"loss", loss},
                      {"perplexity", std::exp(loss)},
                      {"windows", n},
                      {"windows_in_data", in_data},
                      {"tokens", n * s},
                      {"documents", documents},
                      {"method", cfg.parallel.knobs.method},
                      {"ranks", proc.world.size()},
                      {"peak_bytes", peak},
                      {"fwd_s", fwd}};
  j.update(memory_policy_json(cfg.memory.policy));
  if (opt.json) {
    print_json(j);
    return 0;
  }
  std::printf("%s, %lld window(s) of %lld tokens%s%s, %s on %d rank(s), %s, forward only\n",
              m.source.c_str(), (long long)n, (long long)s,
              n < in_data ? fmt::format(" (the first of the data's {})", in_data).c_str() : "",
              documents > n ? fmt::format(" in {} documents", documents).c_str() : "",
              cfg.parallel.knobs.method.c_str(), proc.world.size(),
              dtype_name(cfg.memory.policy.dtype));
  std::printf("  loss %.8f  perplexity %.4f\n", loss, std::exp(loss));
  std::printf("  forward %.3f s, peak %s per rank (max)\n", fwd, format_bytes(peak).c_str());
  return 0;
}

// As train says it: positions past the model's context were never trained.
void warn_past_context(const Process& proc, const ModelConfig& m, int64_t s) {
  if (proc.root() && m.max_position_embeddings > 0 && s > m.max_position_embeddings)
    std::fprintf(stderr,
                 "upipe: warning: a sequence of %lld tokens is longer than the model's context "
                 "(max_position_embeddings = %lld in %s): RoPE positions past it were never "
                 "trained, so the loss there says little about the model\n",
                 (long long)s, (long long)m.max_position_embeddings, m.source.c_str());
}

// One sequence's token file; a Megatron dataset's .bin (beside its .idx) says how it is read.
TokenFileInfo inspect_eval_tokens(const std::string& path) {
  try {
    return inspect_token_file(path);
  } catch (const ConfigError& e) {
    if (!is_megatron_bin(path)) throw;
    throw ConfigError(fmt::format(
        "{} ({} has a Megatron .idx beside it: read that dataset's windows with --windows "
        "--seq-len S --documents index)",
        e.what(), path));
  }
}

int run(Process& proc, const Options& opt, const SettingArgs& sa, const CLI::App& cmd) {
  const Settings set = resolve_settings(proc, sa, cmd);
  const RunConfig& cfg = set.config;
  Watchdog::start(cfg.comm.timeout);
  refuse_training_checkpoint(cfg.model.name);
  const ModelConfig m = load_model_config(cfg.model.name);
  spell_model_fields(set, m);
  if (!opt.save_grads.empty() && (opt.loss_only || opt.windows))
    throw ConfigError("--save-grads needs the gradients: drop --loss-only / --windows");
  if (!opt.save_grads.empty()) check_replaceable(opt.save_grads, "gradients file");
  // The sequence: --tokens (all of it, or its first train.seq_len), or train.seq_len random ids.
  // A file is read from its header first: only the ids used are loaded, each checked.
  const bool seq_given = set.given("train.seq_len");
  const int64_t seq_len = cfg.train.seq_len;
  if (opt.windows && (opt.tokens.empty() || !seq_given))
    throw ConfigError(
        fmt::format("--windows needs --tokens FILE and {}", setting_value("train.seq_len", "S")));
  if (opt.windows && !opt.doc_lens.empty())
    throw ConfigError(
        "--doc-lens gives the documents of one sequence: drop --windows (--documents says where "
        "the documents of --windows' data end)");
  if (!opt.windows && opt.max_windows > 0)
    throw ConfigError(
        "--max-windows counts --windows' windows: add --windows (one sequence is --seq-len's "
        "first S tokens of --tokens)");
  if (!opt.windows && !opt.documents.empty())
    throw ConfigError(
        "--documents says where the documents of --windows' data end: add --windows, or give one "
        "sequence's documents with --doc-lens");
  if (opt.windows) {
    // The data as train reads it (a file, a directory, a glob, a Megatron dataset; every id
    // checked once), its documents by --documents, each window's as validation cuts them.
    DataOptions d;
    d.kind = DataKind::kFiles;
    d.path = opt.tokens;
    d.path_key = "eval.tokens";
    d.seq_len = seq_len;
    d.vocab = m.vocab_size;
    d.documents = parse_documents_mode(opt.documents.empty() ? "none" : opt.documents);
    const DataSource data(d);
    const int64_t in_data = data.total_tokens() / seq_len;
    const int64_t n = opt.max_windows > 0 ? std::min(opt.max_windows, in_data) : in_data;
    warn_past_context(proc, m, seq_len);
    ModelRun run(proc.world, m, cfg, seq_len, /*with_grads=*/false);
    std::vector<int32_t> held;  // one window at a time (a corpus of billions of tokens)
    return run_loss(
        proc, opt, cfg, m, run, n, in_data, seq_len,
        [&](int64_t i) {
          held = data.window(i * seq_len);
          Window w{held, nullptr};
          if (data.packed())
            if (std::vector<int64_t> lens = data.window_documents(i * seq_len, held); !lens.empty())
              w.documents = std::make_shared<const Documents>(lens, seq_len);
          return w;
        },
        data.packed());
  }
  // The number of tokens first, then the model (its sizes checked before anything is
  // allocated), then the tokens.
  TokenFileInfo file;
  int64_t n = seq_len;
  if (!opt.tokens.empty()) {
    file = inspect_eval_tokens(opt.tokens);
    if (seq_given && seq_len > file.count)
      throw ConfigError(fmt::format("{} is longer than the {} tokens of {}",
                                    setting_value("train.seq_len", seq_len), file.count,
                                    opt.tokens));
    n = seq_given ? seq_len : file.count;
    check_token_ids(file, n, m.vocab_size);  // through a bounded buffer
  } else if (!seq_given) {
    throw ConfigError(fmt::format("give --tokens FILE (.npy or .bin), or {} for random tokens",
                                  setting_value("train.seq_len", "S")));
  }
  if (n < 2) throw ConfigError("the sequence needs at least 2 tokens");
  warn_past_context(proc, m, n);
  LossSpec spec;  // the mean over the predictions inside the documents
  spec.documents = documents_from(opt.doc_lens, n);
  const bool forward_only = opt.loss_only;
  ModelRun run(proc.world, m, cfg, n, !forward_only);
  std::vector<int32_t> tokens;
  if (!opt.tokens.empty()) {
    tokens.resize(size_t(n));
    read_token_range(file, 0, n, m.vocab_size, tokens.data());
  } else {  // no file: uniform random ids, the same on every rank
    tokens = random_tokens(m, n, uint64_t(cfg.train.seed));
  }
  if (forward_only)
    return run_loss(
        proc, opt, cfg, m, run, 1, 1, n,
        [&](int64_t) {
          return Window{tokens, spec.documents};
        },
        /*packed=*/false);
  Device& dev = run.dev;
  const ParamMap &w = run.w, &g = run.g;
  dev.mem().reset_peak();
  dev.host().reset_peak();
  FullParams params(m, w, g);
  const double loss = run.dec->run(tokens, params, spec).loss;
  const int64_t peak = dev.mem().peak(), host_peak = dev.host().peak();
  const TagBytes at_peak = dev.mem().at_peak_by_tag();
  // Full gradients: the sum of the ranks' contributions.
  nlohmann::json norms = nlohmann::json::object();
  double total = 0;
  // Summed in place on the device; --save-grads streams them from there (no host copies).
  std::vector<SafetensorsWriteItem> items;
  for (const auto& [name, t] : g) {
    proc.world.all_reduce(t.data(), t.mat().numel(), DType::kF32, ReduceOp::kSum);
    const double ss = sum_squares(dev, t);
    norms[name] = std::sqrt(ss);
    total += ss;
    if (!opt.save_grads.empty()) {
      const Mat flat{t.data(), DType::kF32, 1, t.mat().numel(), t.mat().numel()};  // contiguous
      SafetensorsWriteItem item{name, DType::kF32, {t.rows(), t.cols()}};
      if (t.rows() == 1) item.shape = {t.cols()};
      item.fill = [&dev, flat](int64_t first, int64_t count, void* dst) {
        dev.copy(dst, flat.at(0, first), mat_bytes(1, count, DType::kF32), CopyKind::kDeviceToHost);
      };
      items.push_back(std::move(item));
    }
  }
  const int64_t max_peak = max_over_ranks(proc.world, peak);
  if (!proc.root()) return 0;
  if (!opt.save_grads.empty()) write_safetensors(opt.save_grads, items, {{"format", "pt"}});
  nlohmann::json j = {{"model", m.source},
                      {"loss", loss},
                      {"tokens", tokens.size()},
                      {"documents", spec.documents ? spec.documents->count() : 1},
                      {"method", cfg.parallel.knobs.method},
                      {"ranks", proc.world.size()},
                      {"peak_bytes", max_peak},
                      {"peak_by_tag", tags_json(at_peak)},
                      {"host_peak_bytes", host_peak},
                      {"grad_norm", std::sqrt(total)},
                      {"grad_norms", norms},
                      {"fwd_s", run.dec->forward_seconds()},
                      {"bwd_s", run.dec->backward_seconds()}};
  j.update(memory_policy_json(cfg.memory.policy));
  if (opt.json) {
    print_json(j);
  } else {
    std::printf(
        "%s, %zu tokens%s, %s on %d rank(s), %s\n", m.source.c_str(), tokens.size(),
        spec.documents ? fmt::format(" in {} documents", spec.documents->count()).c_str() : "",
        cfg.parallel.knobs.method.c_str(), proc.world.size(), dtype_name(cfg.memory.policy.dtype));
    std::printf("  loss %.8f  grad norm %.6e\n", loss, std::sqrt(total));
    std::printf("  forward %.3f s, backward %.3f s, peak %s per rank (max)\n",
                run.dec->forward_seconds(), run.dec->backward_seconds(),
                format_bytes(max_peak).c_str());
    if (!opt.save_grads.empty()) std::printf("  gradients written to %s\n", opt.save_grads.c_str());
  }
  return 0;
}

}  // namespace

Runner add_eval(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.add_option("--tokens", opt->tokens,
                 "token ids: a 1-D .npy (int32/int64/uint16/uint32) or an llm.c .bin; with "
                 "--seq-len, its first S (without: --seq-len random ids); with --windows, any "
                 "data train reads (a directory, a glob, a Megatron dataset)");
  cmd.add_option("--documents", opt->documents,
                 "with --windows: where the data's documents end, as train's --documents (none, "
                 "eos:ID, index); each window's documents are attended to and predicted alone, "
                 "and the loss is the mean over their predictions, as training's validation");
  add_doc_lens_option(cmd, opt->doc_lens,
                      "the sequence as packed documents: lengths a,b,c summing to its length, or a "
                      ".npy/.bin file of them; each document is attended to and predicted alone");
  cmd.add_option("--save-grads", opt->save_grads,
                 "write the fp32 gradients (summed over ranks) as FILE.safetensors");
  cmd.add_flag("--loss-only", opt->loss_only,
               "the forward alone: the loss and its perplexity, no gradients (less memory)");
  cmd.add_flag("--windows", opt->windows,
               "the mean loss and perplexity over every non-overlapping --seq-len window of "
               "--tokens (forward only)");
  cmd.add_option("--max-windows", opt->max_windows,
                 "with --windows: the first N windows only, as validation's --val-sequences (0: "
                 "every window)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_flag("--json", opt->json, "print one JSON object (rank 0)");
  auto sa = add_settings(cmd, kScopeModel);
  // eval asks for its input: the table's default S is train's, not eval's.
  cmd.get_option("--seq-len")
      ->description(
          "tokens per sequence S (split over the CP group); eval has no default: give --tokens "
          "FILE (its length) or --seq-len S (random tokens)");
  CLI::App* c = &cmd;
  return [opt, sa, c](Process& p) { return run(p, *opt, *sa, *c); };
}

}  // namespace upipe::app
