// libFuzzer harness: a run file (read_run_file), validated for `upipe plan`; what validates
// writes itself back (to_toml) and reads the same. Seeds: examples/*.toml.
#include "fuzz_common.h"
#include "train/run_config.h"

using namespace upipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string p = fuzz::write_file("run.toml", fuzz::as_text(data, size));
  fuzz::refused_or_read([&] {
    const RunConfig c = read_run_file(p);
    validate(c, kScopePlan);
    const RunConfig back = parse_run_toml(to_toml(c), "to_toml");
    fuzz::require(to_toml(back) == to_toml(c), "to_toml does not read back the same");
  });
  return 0;
}
