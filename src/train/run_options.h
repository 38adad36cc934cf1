// A run's settings (run_config.h) as the options of what runs them: the decoder, the trainer and
// the device. The one place a setting is turned into the engine's options; the knob and memory
// policy structs pass through unchanged.
#pragma once

#include <cstdint>

#include "backend/device.h"
#include "model/decoder.h"
#include "train/run_config.h"
#include "train/trainer.h"

namespace upipe {

// seq_len: the sequence's S (train.seq_len, or a token file's length).
DecoderOptions decoder_options(const RunConfig& c, int64_t seq_len);
TrainOptions train_options(const RunConfig& c);
// The CPU backend with the device and host memory settings as its arenas' budgets.
DeviceOptions device_options(const RunConfig& c);

}  // namespace upipe
