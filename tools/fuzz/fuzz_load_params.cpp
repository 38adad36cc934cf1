// libFuzzer harness: load_params' matching of Hugging Face safetensors weights to a model (the tiny
// preset, or tiny-qwen3: tied embeddings and QK-norms). Structure-aware: the harness starts from
// the model's exact tensors (hf_tensors) and applies the edits the input spells, 3 bytes each
// (op, target, argument): drop, rename (among the model's names, a tied lm_head, an inv_freq
// buffer, names of other models, garbage), dtype (every one the format defines), a shape near the
// right one, the values (a number, a NaN or an infinity), an extra or duplicated tensor, and, once
// any tensor moves to a second shard, a sharded checkpoint with model.safetensors.index.json (an
// index that may name the wrong shard). Every tensor's elements hold one value (its "value"), so
// what loads is checked to be a value the file gave that name, from the shard the index names (and
// a name both shards hold, refused).
// The first byte picks the model. Seeds: a few edit lists (tools/fuzz/seeds.py).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backend/tensor_ops.h"
#include "fuzz_common.h"
#include "model/hf_names.h"
#include "model/weights.h"

using namespace upipe;
namespace fs = std::filesystem;

namespace {

struct Entry {
  std::string name;
  std::string dtype = "F32";
  std::vector<int64_t> shape;
  int value = 1;    // every element's value
  int special = 0;  // 0: none, 1: a NaN, 2: an infinity at element `at`
  int64_t at = 0;
  int shard = 0;    // 0 or 1
  int mapped = -1;  // the shard the index names for it (-1: its own)
};

const char* const kDTypes[] = {"F32", "BF16", "F16", "F64", "I64", "I32",     "I16",     "I8",
                               "U8",  "BOOL", "U16", "U32", "U64", "F8_E5M2", "F8_E4M3", "F128"};

int64_t dtype_bytes(const std::string& t) {
  if (t == "F64" || t == "I64" || t == "U64") return 8;
  if (t == "F32" || t == "I32" || t == "U32") return 4;
  if (t == "F16" || t == "BF16" || t == "I16" || t == "U16") return 2;
  return 1;  // also F128, which the format does not define: its size is never read
}

// A name among those a weight file might hold for `m`.
std::string pick_name(const std::vector<HfTensorSpec>& specs, uint8_t a) {
  static const char* const other[] = {"lm_head.weight",
                                      "model.embed_tokens.weight",
                                      "model.layers.0.self_attn.rotary_emb.inv_freq",
                                      "model.layers.0.self_attn.q_norm.weight",
                                      "model.layers.2.mlp.gate_proj.weight",
                                      "model.layers.-1.mlp.up_proj.weight",
                                      "model.norm.bias",
                                      "",
                                      "__metadata__x",
                                      "model.layers.0.self_attn.q_proj.weight\n"};
  const size_t n = sizeof other / sizeof *other;
  return a < n ? other[a] : specs[(a - n) % specs.size()].name;
}

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The bytes of one element of dtype t holding v.
std::string element(const std::string& t, float v) {
  std::string b(size_t(dtype_bytes(t)), '\0');
  if (t == "F32") {
    const uint32_t u = f32_bits(v);
    std::memcpy(b.data(), &u, 4);
  } else if (t == "BF16") {
    const uint16_t h = uint16_t(f32_bits(v) >> 16);
    std::memcpy(b.data(), &h, 2);
  } else if (t == "F16") {  // a value in [1, 200]: exact in half precision
    const int ex = std::ilogb(v);
    const uint16_t h = std::isnan(v) ? 0x7e00
                       : std::isinf(v)
                           ? 0x7c00
                           : uint16_t(((ex + 15) << 10) | (int(std::ldexp(v, 10 - ex)) - 1024));
    std::memcpy(b.data(), &h, 2);
  } else {
    std::memset(b.data(), std::isfinite(v) ? int(v) : 0xff, b.size());
  }
  return b;
}

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= std::max<int64_t>(d, 0);
  return n;
}

// One safetensors file of the entries of `shard`, laid out in order (names written as given,
// duplicates included: the header is built as text).
void write_file(const std::string& path, const std::vector<Entry>& es, int shard) {
  std::string head = R"({"__metadata__":{"format":"pt"})", data;
  for (const Entry& e : es) {
    if (e.shard != shard) continue;
    const int64_t n = elements(e.shape), w = dtype_bytes(e.dtype), at = int64_t(data.size());
    const std::string one = element(e.dtype, float(e.value));
    for (int64_t i = 0; i < n; ++i) data += one;
    if (e.special && e.at < n)
      data.replace(size_t(at + e.at * w), size_t(w),
                   element(e.dtype, e.special == 1 ? NAN : INFINITY));
    std::string shape;
    for (int64_t d : e.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    head += fmt::format(R"(,{}:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})",
                        nlohmann::json(e.name).dump(), e.dtype, shape, at, data.size());
  }
  head += "}";
  head.append(size_t(-head.size() % 8), ' ');
  const uint64_t n = head.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << head << data;
}

// The entries the input's edits make of the model's tensors.
std::vector<Entry> edited(const std::vector<HfTensorSpec>& specs, const uint8_t* p, size_t n) {
  std::vector<Entry> es;
  for (size_t i = 0; i < specs.size(); ++i)
    es.push_back({specs[i].name, "F32", specs[i].shape, int(i % 200) + 1});
  for (size_t k = 0; k + 3 <= n && !es.empty(); k += 3) {
    const uint8_t op = p[k], a = p[k + 2];
    const size_t t = p[k + 1] % es.size();
    Entry& e = es[t];
    switch (op % 10) {
      case 0:
        es.erase(es.begin() + ptrdiff_t(t));
        break;
      case 1:
        e.name = pick_name(specs, a);
        break;
      case 2:
        e.dtype = kDTypes[a % (sizeof kDTypes / sizeof *kDTypes)];
        break;
      case 3: {  // a shape near the right one
        const size_t d = e.shape.empty() ? 0 : (a / 6) % e.shape.size();
        switch (a % 6) {
          case 0:
            if (!e.shape.empty()) ++e.shape[d];
            break;
          case 1:
            if (!e.shape.empty()) --e.shape[d];
            break;
          case 2:
            if (!e.shape.empty()) e.shape[d] = 0;
            break;
          case 3:
            if (!e.shape.empty()) e.shape.pop_back();
            break;
          case 4:
            e.shape.push_back(1);
            break;
          case 5:
            if (e.shape.size() > 1) std::swap(e.shape[0], e.shape[1]);
            break;
        }
        break;
      }
      case 4:
        if (a < 200)
          e.value = a + 1;
        else
          e.special = 1 + a % 2, e.at = a;
        break;
      case 5: {  // an extra tensor of that shape
        Entry x = e;
        x.name = pick_name(specs, a);
        es.push_back(x);
        break;
      }
      case 6: {  // the same name again, another value
        Entry x = e;
        x.value = a % 200 + 1;
        es.push_back(x);
        break;
      }
      case 7:
        e.shard = 1 - e.shard;
        break;
      case 8:
        e.mapped = a % 3 == 2 ? -1 : a % 3;
        break;
      default:
        std::swap(es[t], es[a % es.size()]);
        break;
    }
  }
  return es;
}

// The directory of the entries: model.safetensors, or two shards and their index when an entry
// lies in the second shard (the index naming each name's last entry's shard, or `mapped`).
void write_weights(const fs::path& dir, const std::vector<Entry>& es) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  const bool sharded = std::any_of(es.begin(), es.end(), [](const Entry& e) { return e.shard; });
  if (!sharded) return write_file((dir / "model.safetensors").string(), es, 0);
  const char* names[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
  nlohmann::json map = nlohmann::json::object();
  for (const Entry& e : es) map[e.name] = names[e.mapped < 0 ? e.shard : e.mapped];
  for (int s = 0; s < 2; ++s) write_file((dir / names[s]).string(), es, s);
  std::ofstream((dir / "model.safetensors.index.json").string())
      << nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump(1);
}

// Whether `got` (every element) is a value an entry of `name` holds in the shard the index names.
bool from_the_file(const std::vector<Entry>& es, const std::string& name,
                   const std::vector<float>& got) {
  const bool sharded = std::any_of(es.begin(), es.end(), [](const Entry& e) { return e.shard; });
  int shard = -1;  // the one the index names (the last entry's, as write_weights maps it)
  for (const Entry& e : es)
    if (e.name == name) shard = e.mapped < 0 || !sharded ? e.shard : e.mapped;
  for (const Entry& e : es)
    if (e.name == name && e.shard == shard && (!e.special || e.at >= elements(e.shape)) &&
        std::all_of(got.begin(), got.end(), [&](float v) { return v == float(e.value); }))
      return true;
  return false;
}

// Whether a name is held by both shards, each of which the index names for some tensor (a sharded
// checkpoint only; the index maps each name as write_weights does).
bool in_two_shards(const std::vector<Entry>& es) {
  std::set<std::string> held[2];
  std::map<std::string, int> mapped;
  for (const Entry& e : es) {
    held[e.shard].insert(e.name);
    mapped[e.name] = e.mapped < 0 ? e.shard : e.mapped;
  }
  bool named[2] = {false, false};
  for (const auto& [n, s] : mapped) named[s] = true;
  if (held[1].empty() || !named[0] || !named[1]) return false;
  for (const std::string& n : held[0])
    if (held[1].count(n)) return true;
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const ModelConfig models[] = {load_model_config("tiny"), load_model_config("tiny-qwen3")};
  const ModelConfig& m = models[data[0] % 2];
  const std::vector<HfTensorSpec> specs = hf_tensors(m);
  const std::vector<Entry> es = edited(specs, data + 1, size - 1);
  const fs::path dir = fuzz::scratch() / "model";
  write_weights(dir, es);
  static Device dev;
  fuzz::refused_or_read([&] {
    const ParamMap p = load_params(dev, m, dir.string(), DType::kF32, 1);
    fuzz::require(!in_two_shards(es), "a tensor of two shards read from one");
    for (const HfTensorSpec& s : specs)
      fuzz::require(from_the_file(es, s.name, download(dev, p.at(s.name).mat())),
                    "a tensor loaded with values its file does not give it");
  });
  return 0;
}
