// libFuzzer harness: a checkpoint's meta.json as --resume reads it (read_checkpoint_info), then
// the run file and the model it records parsed and the resume checked against the run itself.
// The harness writes DONE with meta.json's checksum (so the fuzzer gets past it) and the step
// of meta.json's first "step": N, into a directory named "ckpt" (no step in its name). Seeds: the
// meta.json of a small run's checkpoint (tools/fuzz/seeds.py).
#include <fmt/format.h>
#include <xxhash.h>

#include <charconv>
#include <filesystem>

#include "fuzz_common.h"
#include "model/config.h"
#include "train/checkpoint.h"
#include "train/resume.h"
#include "train/run_config.h"

using namespace upipe;

namespace {

// The digits after the first "step": in `text`, or "0".
std::string step_of(std::string_view text) {
  const size_t at = text.find("\"step\":");
  if (at == std::string_view::npos) return "0";
  size_t b = at + 7;
  while (b < text.size() && text[b] == ' ') ++b;
  size_t e = b;
  while (e < text.size() && e - b < 20 && text[e] >= '0' && text[e] <= '9') ++e;
  return e > b ? std::string(text.substr(b, e - b)) : "0";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view meta = fuzz::as_text(data, size);
  const std::filesystem::path dir = fuzz::scratch() / "ckpt";
  std::filesystem::create_directories(dir);
  fuzz::write_file("ckpt/meta.json", meta);
  fuzz::write_file("ckpt/DONE", fmt::format("step {}\nmeta.json xxh3-64 {:016x}\n", step_of(meta),
                                            XXH3_64bits(meta.data(), meta.size())));
  fuzz::refused_or_read([&] {
    const CheckpointInfo info = read_checkpoint_info(dir.string());
    fuzz::require(info.world >= 1 && info.cp_size >= 1 && info.world % info.cp_size == 0,
                  "world and cp_size");
    fuzz::require(info.step >= 0, "a negative step");
    SettingSources ignored;
    RecordedRun rec{parse_run_toml(info.run_toml, info.path + "/meta.json", &ignored),
                    info.step,
                    info.world,
                    info.cp_size,
                    info.path,
                    info.data};
    parse_model_config(info.model_json, info.path + "/meta.json (model)");
    RunConfig now = rec.config;
    now.train.steps = rec.step < (int64_t(1) << 40) ? rec.step + 1 : rec.step;
    check_resume(rec, now, info.world, /*accept=*/false);
  });
  return 0;
}
