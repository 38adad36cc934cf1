// A training checkpoint as one fuzz input, for the harnesses of its readers (fuzz_checkpoint_files:
// export's; fuzz_resume_checkpoint: --resume's): a bundle of records, each a 4-byte little-endian
// length and its bytes (record 0 meta.json, record 1 + q rank_0000q.safetensors). Laid out as a
// checkpoint directory, what the writer would have written about the mutated files is recomputed
// (in meta.json: each rank file's bytes, header_xxh3 and pieces_xxh3, of the tensors
// unit<u>.<field> its header places; DONE: meta.json's checksum and step), so the fuzzer gets past
// the checksums to the parse and the cross-file checks behind them. One format, so the two
// harnesses' corpora seed each other.
#pragma once

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_checkpoint_writer.h"

namespace upipe::fuzz {

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline void add_record(std::string& bundle, const std::string& bytes) {
  const uint32_t n = uint32_t(bytes.size());
  bundle.append(reinterpret_cast<const char*>(&n), 4);
  bundle += bytes;
}

// The checkpoint of step 3 of small_model(16) that `world` ranks write (write_checkpoint), as a
// bundle.
inline std::string written_checkpoint(int world) {
  const std::filesystem::path dir = scratch() / fmt::format("seed_world{}", world);
  std::filesystem::remove_all(dir);
  const std::string path = write_checkpoint(dir.string(), small_model(16), world, 3, "");
  std::string bundle;
  add_record(bundle, slurp(std::filesystem::path(path) / "meta.json"));
  for (int q = 0; q < world; ++q)
    add_record(bundle,
               slurp(std::filesystem::path(path) / fmt::format("rank_{:05d}.safetensors", q)));
  std::filesystem::remove_all(dir);
  return bundle;
}

// The bundle's records (at most 9: meta.json and 8 rank files); a last one cut short is what
// is there.
inline std::vector<std::string_view> records(std::string_view in) {
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

namespace bundle_detail {

using json = nlohmann::json;

inline uint64_t xxh3(std::string_view b) {
  return XXH3_64bits(b.data(), b.size());
}

// o[key] when o is an object that has it, else null (a const json's operator[] must not miss).
inline const json* member(const json& o, const std::string& key) {
  if (!o.is_object()) return nullptr;
  const auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

// A whole number >= 0 of `v` (null: none), else `none`.
inline uint64_t whole(const json* v, uint64_t none) {
  return v && v->is_number_unsigned() ? v->get<uint64_t>() : none;
}

// What the writer records of a rank file `f` under the units and piece size of meta.json `j`:
// its bytes, its header's checksum and every piece's, where the header says where the tensors are.
inline void record_rank_file(const json& j, std::string_view f, json& entry) {
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

}  // namespace bundle_detail

// meta.json's text with the rank files' records recomputed (as read: unchanged when it is no
// JSON object), and the step DONE names (meta.json's "step" when it is an integer, else "0").
inline std::string consistent_meta(std::string_view text,
                                   const std::vector<std::string_view>& files, std::string* step) {
  using bundle_detail::json;
  json j = json::parse(text, nullptr, false);
  *step = "0";
  if (!j.is_object()) return std::string(text);
  if (json* list = j.contains("files") ? &j["files"] : nullptr; list && list->is_array())
    for (size_t q = 0; q < list->size() && q < files.size(); ++q)
      if ((*list)[q].is_object()) bundle_detail::record_rank_file(j, files[q], (*list)[q]);
  if (const json* s = bundle_detail::member(j, "step"); s && s->is_number_integer())
    *step = s->dump();
  return j.dump(1) + "\n";
}

// The bundle's records laid out as the checkpoint directory `dir` (under the scratch directory,
// made afresh), its checksums made consistent; returns the step DONE names.
inline std::string write_bundle(const std::string& dir, const std::vector<std::string_view>& rec) {
  std::filesystem::remove_all(scratch() / dir);
  std::filesystem::create_directories(scratch() / dir);
  const std::vector<std::string_view> files(rec.begin() + 1, rec.end());
  for (size_t q = 0; q < files.size(); ++q)
    write_file(fmt::format("{}/rank_{:05d}.safetensors", dir, q), files[q]);
  std::string step;
  const std::string meta = consistent_meta(rec[0], files, &step);
  write_file(dir + "/meta.json", meta);
  write_file(dir + "/DONE", fmt::format("step {}\nmeta.json xxh3-64 {:016x}\n", step,
                                        XXH3_64bits(meta.data(), meta.size())));
  return step;
}

}  // namespace upipe::fuzz
