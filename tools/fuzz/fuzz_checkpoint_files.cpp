// libFuzzer harness: a training checkpoint's rank files and meta.json as `upipe export` reads them
// (CheckpointReader, then every tensor of its model read). Structure-aware: the input is a bundle
// of records, each a 4-byte little-endian length and its bytes (record 0 meta.json, record 1 + q
// rank_0000q.safetensors), and before the reader runs the harness recomputes what the writer
// would have written about the mutated files (in meta.json: each rank file's bytes, header_xxh3
// and pieces_xxh3, of the tensors unit<u>.<field> its header places; DONE: meta.json's checksum
// and step), so the fuzzer gets past the checksums to the parse and the cross-file checks behind
// them. Seeds: checkpoints of a 1-layer model (vocabulary 16) on 1, 2 and 3 ranks, written by the
// real writer (save_checkpoint, the ranks as threads): UPIPE_FUZZ_WRITE_SEEDS=DIR writes them into
// DIR and exits (tools/fuzz/seeds.py runs it).
#include <fmt/format.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "fuzz_checkpoint_writer.h"
#include "model/hf_names.h"

using namespace upipe;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void add_record(std::string& bundle, const std::string& bytes) {
  const uint32_t n = uint32_t(bytes.size());
  bundle.append(reinterpret_cast<const char*>(&n), 4);
  bundle += bytes;
}

// The checkpoint of step 3 that `world` threads write, as a bundle.
std::string written_checkpoint(int world) {
  const fs::path dir = fuzz::scratch() / fmt::format("seed_world{}", world);
  fs::remove_all(dir);
  const std::string path =
      fuzz::write_checkpoint(dir.string(), fuzz::small_model(16), world, 3, "");
  std::string bundle;
  add_record(bundle, slurp(fs::path(path) / "meta.json"));
  for (int q = 0; q < world; ++q)
    add_record(bundle, slurp(fs::path(path) / fmt::format("rank_{:05d}.safetensors", q)));
  fs::remove_all(dir);
  return bundle;
}

// ---- The harness: the bundle as a checkpoint directory, its checksums made consistent ----

std::vector<std::string_view> records(std::string_view in) {
  std::vector<std::string_view> v;
  while (in.size() >= 4 && v.size() < 9) {
    uint32_t n = 0;
    std::memcpy(&n, in.data(), 4);
    in.remove_prefix(4);
    const size_t take = std::min<size_t>(n, in.size());
    v.push_back(in.substr(0, take));
    in.remove_prefix(take);
  }
  return v;
}

uint64_t xxh3(std::string_view b) {
  return XXH3_64bits(b.data(), b.size());
}

// o[key] when o is an object that has it, else null (a const json's operator[] must not miss).
const json* member(const json& o, const std::string& key) {
  if (!o.is_object()) return nullptr;
  const auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

// A whole number >= 0 of `v` (null: none), else `none`.
uint64_t whole(const json* v, uint64_t none) {
  return v && v->is_number_unsigned() ? v->get<uint64_t>() : none;
}

// What the writer records of a rank file `f` under the units and piece size of meta.json `j`:
// its bytes, its header's checksum and every piece's, where the header says where the tensors are.
void record_rank_file(const json& j, std::string_view f, json& entry) {
  entry["bytes"] = f.size();
  uint64_t n = 0;
  if (f.size() < 8) return;
  std::memcpy(&n, f.data(), 8);
  if (n > f.size() - 8) return;
  entry["header_xxh3"] = fmt::format("{:016x}", xxh3(f.substr(0, 8 + n)));
  const json head = json::parse(f.substr(8, n), nullptr, false);
  const json* checksum = member(j, "checksum");
  const uint64_t pe = whole(checksum ? member(*checksum, "piece_elements") : nullptr, 0);
  const json* units = member(j, "units");
  if (pe == 0 || !units || !units->is_array()) return;
  const char* fields[] = {"master", "exp_avg", "exp_avg_sq"};
  json pieces = json::array();
  for (size_t u = 0; u < units->size(); ++u) {
    const uint64_t shard = whole(member((*units)[u], "shard"), 0);
    for (const char* field : fields) {
      const json* t = member(head, fmt::format("unit{}.{}", u, field));
      const json* off = t ? member(*t, "data_offsets") : nullptr;
      if (!off || !off->is_array() || off->empty()) return;
      const uint64_t at = 8 + n + std::min<uint64_t>(whole(&(*off)[0], 0), f.size());
      for (uint64_t p = 0; p < shard && pieces.size() < 4096; p += pe) {
        const uint64_t a = std::min<uint64_t>(at + p * 4, f.size());
        const uint64_t b = std::min<uint64_t>(at + std::min(p + pe, shard) * 4, f.size());
        pieces.push_back(fmt::format("{:016x}", xxh3(f.substr(a, b - a))));
      }
    }
  }
  entry["pieces_xxh3"] = pieces;
}

// meta.json's text with the rank files' records recomputed (as read: unchanged when it is no
// JSON object), and the step DONE names.
std::string consistent_meta(std::string_view text, const std::vector<std::string_view>& files,
                            std::string* step) {
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return std::string(text);
  if (json* list = j.contains("files") ? &j["files"] : nullptr; list && list->is_array())
    for (size_t q = 0; q < list->size() && q < files.size(); ++q)
      if ((*list)[q].is_object()) record_rank_file(j, files[q], (*list)[q]);
  if (const json* s = member(j, "step"); s && s->is_number_integer()) *step = s->dump();
  return j.dump(1) + "\n";
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* out = std::getenv("UPIPE_FUZZ_WRITE_SEEDS")) {
    fs::create_directories(out);
    for (int world : {1, 2, 3})
      std::ofstream(fs::path(out) / fmt::format("world{}", world), std::ios::binary)
          << written_checkpoint(world);
    fs::remove_all(fuzz::scratch());
    std::_Exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> rec = records(fuzz::as_text(data, size));
  if (rec.empty()) return 0;
  const fs::path dir = fuzz::scratch() / "ckpt";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<std::string_view> files(rec.begin() + 1, rec.end());
  for (size_t q = 0; q < files.size(); ++q)
    fuzz::write_file(fmt::format("ckpt/rank_{:05d}.safetensors", q), files[q]);
  std::string step = "0";
  const std::string meta = consistent_meta(rec[0], files, &step);
  fuzz::write_file("ckpt/meta.json", meta);
  fuzz::write_file("ckpt/DONE", fmt::format("step {}\nmeta.json xxh3-64 {:016x}\n", step,
                                            XXH3_64bits(meta.data(), meta.size())));
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
