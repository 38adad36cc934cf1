// libFuzzer harness: a training checkpoint's rank files and meta.json as `upipe export` reads them
// (CheckpointReader, then every tensor of its model read). Structure-aware: the input is a bundle
// of records, each a 4-byte little-endian length and its bytes (record 0 meta.json, record 1 + q
// rank_0000q.safetensors), and before the reader runs the harness recomputes what the writer
// would have written about the mutated files (in meta.json: each rank file's bytes, header_xxh3
// and pieces_xxh3, of the tensors unit<u>.<field> its header places; DONE: meta.json's checksum
// and step; fuzz_checkpoint_bundle.h), so the fuzzer gets past the checksums to the parse and the
// cross-file checks behind them. Seeds: checkpoints of a 1-layer model (vocabulary 16) on 1, 2
// and 3 ranks, written by the real writer (save_checkpoint, the ranks as threads):
// UPIPE_FUZZ_WRITE_SEEDS=DIR writes them into DIR and exits (tools/fuzz/seeds.py runs it).
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "fuzz_checkpoint_bundle.h"
#include "model/hf_names.h"

using namespace upipe;
namespace fs = std::filesystem;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* out = std::getenv("UPIPE_FUZZ_WRITE_SEEDS")) {
    fs::create_directories(out);
    for (int world : {1, 2, 3})
      std::ofstream(fs::path(out) / fmt::format("world{}", world), std::ios::binary)
          << fuzz::written_checkpoint(world);
    fs::remove_all(fuzz::scratch());
    std::_Exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> rec = fuzz::records(fuzz::as_text(data, size));
  if (rec.empty()) return 0;
  fuzz::write_bundle("ckpt", rec);
  const fs::path dir = fuzz::scratch() / "ckpt";
  fuzz::refused_or_read([&] {
    const CheckpointReader reader(dir.string());
    const std::vector<HfTensorSpec> specs = hf_tensors(reader.model());
    for (size_t i = 0; i < specs.size(); ++i) {
      std::vector<float> v(size_t(specs[i].numel()));
      reader.read(int(i), v.data());
    }
  });
  return 0;
}
