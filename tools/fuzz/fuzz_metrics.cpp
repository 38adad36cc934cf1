// libFuzzer harness: the metrics file of a resumed run (check_metrics_file with resume), once
// for any run and once for the run "r1". Seeds: a few lines metrics_json writes (seeds.py).
#include "fuzz_common.h"
#include "train/metrics.h"

using namespace upipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string p = fuzz::write_file("metrics.jsonl", fuzz::as_text(data, size));
  fuzz::refused_or_read([&] { check_metrics_file(p, /*resume=*/true, /*overwrite=*/false); });
  fuzz::refused_or_read([&] { check_metrics_file(p, /*resume=*/true, false, "r1"); });
  return 0;
}
