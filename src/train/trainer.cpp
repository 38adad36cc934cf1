#include "train/trainer.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/checked.h"
#include "core/errors.h"
#include "core/fault_inject.h"
#include "core/setting_ref.h"

namespace upipe {

double LrSchedule::lr_at(int64_t t) const {
  if (t < warmup) return lr * double(t + 1) / double(warmup);
  const int64_t span = steps - warmup;
  if (span <= 1) return lr;
  const double progress = std::min(1.0, double(t - warmup) / double(span - 1));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

namespace {

// What every rank holds at least during a step, whatever the strategy: the ZeRO-3 shards (fp32
// master weights, gradients, two moments) and the residual stream of its rows.
TagBytes training_floor(const ModelConfig& m, const TrainOptions& o, int world, int cp) {
  const int64_t shard = zero_shard_elements(m, world);
  const int64_t rows = (o.decoder.seq_len + cp - 1) / cp;
  TagBytes need;
  need.v[size_t(Tag::kParams)] = checked_mul(shard, 4, "parameter bytes");
  need.v[size_t(Tag::kGrads)] = checked_mul(shard, 4, "gradient bytes");
  need.v[size_t(Tag::kOptim)] = checked_mul(shard, 8, "optimizer bytes");
  need.v[size_t(Tag::kAct)] =
      checked_mul(checked_mul(rows, m.hidden_size, "residual elements"),
                  dtype_size(o.decoder.memory.residual_dtype), "residual bytes");
  return need;
}

}  // namespace

Trainer::Trainer(Device& dev, Communicator& world, const ModelConfig& m, const TrainOptions& opt)
    : dev_(dev), world_(world), m_(m), opt_(opt) {
  const int w = world.size();
  cp_size_ = opt.cp_size == 0 ? w : opt.cp_size;
  if (cp_size_ < 1 || w % cp_size_ != 0)
    throw ConfigError(fmt::format("{} must divide the {} ranks",
                                  setting_value("parallel.cp_size", opt.cp_size), w));
  if (opt.micro_steps < 1)
    throw ConfigError(
        fmt::format("{} must be >= 1 (got {})", setting_ref("train.micro_steps"), opt.micro_steps));
  if (opt.grad_clip < 0)
    throw ConfigError(
        fmt::format("{} must be >= 0 (got {})", setting_ref("train.grad_clip"), opt.grad_clip));
  // Before anything is allocated: a size from the run file or config.json the budget (or the
  // machine) can never hold is an out-of-memory error now, not a std::bad_alloc later.
  dev.mem().check_fits(training_floor(m, opt, w, cp_size_));
  dp_size_ = w / cp_size_;
  dp_rank_ = world.rank() / cp_size_;
  const int c = cp_size_;
  // CP groups: consecutive ranks (the fast links of a node); DP groups: equal CP index.
  cp_ = world.split([c](int r) { return SplitKey{r / c, r % c}; });
  dp_ = world.split([c](int r) { return SplitKey{r % c, r / c}; });
  dec_ = std::make_unique<Decoder>(dev, *cp_, m, opt.decoder);
  zero_ = std::make_unique<Zero3>(dev, world, m, opt.decoder.memory.dtype);
  fault_point("startup");
}

Trainer::~Trainer() = default;

int64_t Trainer::tokens_per_rank_per_step() const {
  return int64_t(opt_.micro_steps) * opt_.decoder.seq_len / cp_size_;
}

namespace {

// Next-token predictions inside the documents of a sequence of s tokens.
int64_t predictions(const std::shared_ptr<const Documents>& documents, int64_t s) {
  return documents ? documents->predictions() : s - 1;
}

}  // namespace

// The sum of `mine` over the DP groups, in rank order (the same bits on every rank).
double Trainer::dp_sum(double mine) const {
  std::vector<double> parts(static_cast<size_t>(dp_size_));
  dp_->all_gather(&mine, parts.data(), sizeof(mine));
  double sum = 0;
  for (double p : parts) sum += p;
  return sum;
}

double Trainer::evaluate(const std::function<Sequence(int64_t i)>& data, int64_t n) {
  const int64_t s = opt_.decoder.seq_len;
  // Sequence i goes to DP replica i mod dp. Every forward's ZeRO-3 gathers span all ranks, so
  // every replica runs the same number of forwards: where n does not divide evenly, a replica
  // with one fewer runs a last forward on sequence 0 that counts for nothing.
  const int64_t rounds = (n + dp_size_ - 1) / dp_size_;
  const int64_t mine_n = (n - dp_rank_ + dp_size_ - 1) / dp_size_;  // i = r dp + rank < n
  // One sequence held at a time, whatever n (--val-sequences 2^63 held them all: the kernel's OOM
  // killer ended the run). With packed documents the predictions are counted in a first pass,
  // reading each sequence twice, as the loss's scale needs them before the first forward.
  auto index = [&](int64_t r) { return r < mine_n ? r * dp_size_ + dp_rank_ : 0; };
  double mine_predicted = 0;
  if (opt_.packed)
    for (int64_t r = 0; r < mine_n; ++r)
      mine_predicted += double(predictions(data(index(r)).documents, s));
  const double predicted = opt_.packed ? dp_sum(mine_predicted) : double(n) * double(s - 1);
  // Nothing predicted (every document one token): no loss, not a loss of 0.
  if (predicted == 0) return std::numeric_limits<double>::quiet_NaN();
  double mine = 0;
  for (int64_t r = 0; r < rounds; ++r) {
    const Sequence q = data(index(r));
    LossSpec spec{predicted > 0 ? 1.0 / predicted : 0.0, {}};
    spec.documents = q.documents;
    const double loss = dec_->loss(q.tokens, *zero_, spec).loss;
    if (r < mine_n) mine += loss;
  }
  return dp_sum(mine);
}

StepResult Trainer::step(int64_t t, const SequenceFn& data) {
  // One sequence held (every micro-step's at once was micro_steps x S tokens per rank outside the
  // arenas and the plan: --micro-steps 256 at S = 1M held 1.3 GB more).
  Sequence held;
  return step_views(t, [&](int64_t at, int micro, int dp_rank) {
    held = data(at, micro, dp_rank);
    return SequenceView{held.tokens, held.group, held.documents};
  });
}

StepResult Trainer::step_views(int64_t t, const SequenceViewFn& data) {
  const int64_t s = opt_.decoder.seq_len;
  auto fetch = [&](int micro) {
    SequenceView seq = data(t, micro, dp_rank_);
    if (int64_t(seq.tokens.size()) != s)
      throw Error(
          fmt::format("the data gave {} tokens for a sequence of {}", seq.tokens.size(), s));
    return seq;
  };
  // With packed documents the loss is the mean over the global batch's predictions inside
  // documents, counted in a first pass before the first forward (one sequence at a time).
  double mine_predicted = 0, mine_docs = 0;
  if (opt_.packed)
    for (int micro = 0; micro < opt_.micro_steps; ++micro) {
      const SequenceView seq = fetch(micro);
      mine_predicted += double(predictions(seq.documents, s));
      mine_docs += seq.documents ? double(seq.documents->count()) : 1.0;
    }
  const double predicted =
      opt_.packed ? dp_sum(mine_predicted) : double(dp_size_) * opt_.micro_steps * double(s - 1);
  StepResult r;
  r.documents = opt_.packed ? int64_t(dp_sum(mine_docs)) : int64_t(dp_size_) * opt_.micro_steps;
  // Every rank has the same sums: every rank refuses alike. (A loss of 0 looked like a perfect
  // model.) The planner's meta device moves no data: its sums say nothing.
  if (predicted == 0 && dev_.backend().kind() != BackendKind::kMeta)
    throw ConfigError(fmt::format(
        "step {}: the step's {} documents are one token each, so it predicts nothing (a "
        "document's last token has no next token); check {} (an end-of-text id that is every "
        "token?) and the data",
        t + 1, r.documents, setting_ref("data.documents")));
  double mine[3] = {0, 0, 0};  // scaled loss, group loss sum, group predictions
  zero_->zero_grads();
  for (int micro = 0; micro < opt_.micro_steps; ++micro) {
    const SequenceView seq = fetch(micro);
    LossSpec spec{predicted > 0 ? 1.0 / predicted : 0.0, seq.group};
    spec.documents = seq.documents;
    const StepLoss l = dec_->run(seq.tokens, *zero_, spec);
    mine[0] += l.loss;
    mine[1] += l.group_sum;
    for (size_t p = 0; p + 1 < seq.group.size(); ++p) mine[2] += seq.group[p] != 0;
    r.fwd_s += dec_->forward_seconds();
    r.bwd_s += dec_->backward_seconds();
  }
  zero_->finish_grads();
  // Over the DP groups, in rank order: the same bits on every rank.
  std::vector<double> parts(3 * static_cast<size_t>(dp_size_));
  dp_->all_gather(mine, parts.data(), sizeof(mine));
  double group_sum = 0, group_count = 0;
  for (size_t i = 0; i < parts.size(); i += 3) {
    r.loss += parts[i];
    group_sum += parts[i + 1];
    group_count += parts[i + 2];
  }
  r.group_loss = group_count > 0 ? group_sum / group_count : 0.0;
  r.grad_norm = zero_->grad_norm();
  r.lr = opt_.schedule.lr_at(t);
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))
    throw StepDiverged(
        render_setting_refs(fmt::format("step {}: the loss ({}) or the gradient norm ({}) is not "
                                        "finite; lower {} or check the data",
                                        t + 1, r.loss, r.grad_norm, setting_ref("train.lr"))),
        r);
  const double clip = opt_.grad_clip > 0 && r.grad_norm > opt_.grad_clip
                          ? opt_.grad_clip / (r.grad_norm + 1e-6)
                          : 1.0;
  zero_->step(opt_.optimizer, r.lr, clip, t + 1);
  return r;
}

}  // namespace upipe
