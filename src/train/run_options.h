// A run's settings (run_config.h) as the options of what runs them: the decoder, the trainer and
// the device. The one place a setting is turned into the engine's options; the knob and memory
// policy structs pass through unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// What a valid run may still not mean to do, one line each, naming the settings as the user
// spelled them: a sequence longer than the model's context (max_position_embeddings), a warmup
// as long as the run (the learning rate never reaches train.lr).
std::vector<std::string> run_warnings(const RunConfig& c, const ModelConfig& m);

}  // namespace upipe
