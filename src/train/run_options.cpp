#include "train/run_options.h"

#include <fmt/format.h>

#include "core/setting_ref.h"

namespace upipe {

DecoderOptions decoder_options(const RunConfig& c, int64_t seq_len) {
  return {seq_len, c.parallel.knobs, c.memory.policy};
}

TrainOptions train_options(const RunConfig& c) {
  TrainOptions o;
  o.cp_size = c.parallel.cp_size;
  o.micro_steps = c.train.micro_steps;
  o.decoder = decoder_options(c, c.train.seq_len);
  o.schedule = {c.train.lr, c.min_lr(), c.train.warmup_steps, c.train.steps};
  o.optimizer = {c.train.beta1, c.train.beta2, c.train.eps, c.train.weight_decay};
  o.grad_clip = c.train.grad_clip;
  o.packed = c.data.documents != "none";
  return o;
}

DeviceOptions device_options(const RunConfig& c) {
  return {parse_backend_kind(c.device.backend), c.memory.device_bytes, c.memory.host_bytes};
}

std::vector<std::string> run_warnings(const RunConfig& c, const ModelConfig& m) {
  std::vector<std::string> w;
  if (m.max_position_embeddings > 0 && c.train.seq_len > m.max_position_embeddings)
    w.push_back(fmt::format(
        "{} is longer than the model's context (max_position_embeddings = {} in {}): RoPE "
        "positions past it were never trained; extend the context on purpose (rope_scaling) or "
        "train shorter sequences",
        setting_value("train.seq_len", c.train.seq_len), m.max_position_embeddings, m.source));
  if (c.train.warmup_steps >= c.train.steps)
    w.push_back(
        fmt::format("{} is {} the run ({}): the learning rate {} {} and never decays",
                    setting_value("train.warmup_steps", c.train.warmup_steps),
                    c.train.warmup_steps > c.train.steps ? "longer than" : "as long as",
                    setting_value("train.steps", c.train.steps),
                    c.train.warmup_steps > c.train.steps ? "never reaches" : "reaches",
                    c.train.warmup_steps > c.train.steps
                        ? setting_value("train.lr", c.train.lr)
                        : setting_value("train.lr", c.train.lr) + " only at the last step"));
  if (!c.data.val_path.empty() && c.metrics.val_interval == 0)
    w.push_back(fmt::format(
        "{} is given but {}: the run never validates; give {} to measure the held-out loss",
        setting_value("data.val_path", c.data.val_path),
        setting_value("metrics.val_interval", c.metrics.val_interval),
        setting_ref("metrics.val_interval")));
  return w;
}

}  // namespace upipe
