#include "train/run_options.h"

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
  return {BackendKind::kCpu, c.memory.device_bytes, c.memory.host_bytes};
}

}  // namespace upipe
