// Every reader of a file a user hands upipe, against a few hundred seeded random damages of a good
// file each (common/mutations.h): a safetensors checkpoint and its sharded index, llm.c .bin and
// .npy token files, a Megatron indexed dataset (.idx and .bin), a Hugging Face config.json, a run
// file, a document-length file, a metrics file being resumed and a Hugging Face model's weights
// through load_params. Each damaged file is either
// refused with a one-line ConfigError (never another exception, a crash, an allocation the file
// cannot justify, or UB: the suite runs this under ASan and UBSan) or read into values that pass
// the reader's own contract: ids inside the vocabulary, tensors inside their file, documents
// ascending inside their .bin, a model the engine can size. The checkpoint's checksummed chain
// is held to more (loaded values equal to the original's) in multirank/test_checkpoint.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/device.h"
#include "backend/tensor_ops.h"
#include "common/mutations.h"
#include "core/errors.h"
#include "model/config.h"
#include "model/doc_lens.h"
#include "model/safetensors.h"
#include "model/tokens.h"
#include "model/weights.h"
#include "train/checkpoint.h"
#include "train/indexed_dataset.h"
#include "train/metrics.h"
#include "train/run_config.h"
#include "unit/expect_config_error.h"
#include "unit/temp_dir.h"

namespace upipe {
namespace {

namespace fs = std::filesystem;
const std::string kSrc = UPIPE_SOURCE_DIR;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f) << path;
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The mutants of `original`, written in turn to `path`, each given to `read`. Counts refusals and
// reads; a failure names the damage. `read` asserts its own contract on what it read.
struct Tally {
  int refused = 0, read = 0;
};
Tally each_mutant(const std::string& original, const std::string& path, uint64_t seed, int count,
                  size_t hot, const std::function<void()>& read) {
  Tally t;
  test::for_each_mutant(original, seed, count, hot, [&](const test::Mutant& m) {
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(m.bytes.data(), std::streamsize(m.bytes.size()));
    }
    SCOPED_TRACE(path + ": " + m.what);
    try {
      read();
      ++t.read;
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << "a multi-line error: " << msg;
      EXPECT_LT(msg.size(), 2000u) << "an error that quotes too much: " << msg.substr(0, 300);
      ++t.refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a ConfigError: " << e.what();
    }
  });
  // Restore the good file for whatever the caller does next.
  std::ofstream(path, std::ios::binary | std::ios::trunc) << original;
  return t;
}

// Every seed's mutants are mostly refused, and at least some damage (data bytes) reads: a reader
// that refused everything would pass the contract trivially.
void expect_both(const Tally& t, const std::string& what) {
  EXPECT_GT(t.refused, 0) << what;
  EXPECT_GT(t.read, 0) << what;
  std::printf("%s: %d refused, %d read\n", what.c_str(), t.refused, t.read);
}

// A safetensors reader's whole contract on whatever opened: every tensor lies inside its file,
// is as large as its shape, and reads (or is refused for its dtype) without error.
void read_every_tensor(const SafetensorsReader& r) {
  for (const std::string& name : r.names()) {
    const SafetensorsTensor& t = r.tensor(name);
    const int64_t file_size = int64_t(fs::file_size(r.files()[size_t(t.file)]));
    ASSERT_GE(t.offset, 0) << name;
    ASSERT_LE(t.offset + t.nbytes, file_size) << name;
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      ASSERT_GE(d, 0) << name;
      numel *= d;
    }
    ASSERT_EQ(numel, t.numel) << name;
    std::vector<float> v(size_t(t.numel));
    r.read(name, t.shape, DType::kF32, v.data());
    if (t.numel > 1) r.read_range(name, 1, t.numel - 1, DType::kF32, v.data());
  }
}

std::string small_safetensors(const TempDir& d, const std::string& name) {
  std::vector<float> a(24), b(10);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.5f - 3;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(i);
  const std::string p = d.file(name);
  write_safetensors(p,
                    {{"model.a.weight", DType::kF32, {4, 6}, a.data()},
                     {"model.b.weight", DType::kF32, {10}, b.data()},
                     {"model.c.weight",
                      DType::kBF16,
                      {2, 3},
                      nullptr,
                      [](int64_t first, int64_t n, void* dst) {
                        auto* o = static_cast<uint16_t*>(dst);
                        for (int64_t i = 0; i < n; ++i) o[i] = uint16_t(0x3f80 + first + i);
                      }}},
                    {{"format", "pt"}, {"note", "mutation test"}});
  return p;
}

size_t safetensors_header_end(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return size_t(8 + n);
}

TEST(FileMutations, SafetensorsFile) {
  TempDir d;
  const std::string p = small_safetensors(d, "model.safetensors");
  const std::string good = slurp(p);
  read_every_tensor(SafetensorsReader(p));
  const Tally t = each_mutant(good, p, 11, 400, safetensors_header_end(good),
                              [&] { read_every_tensor(SafetensorsReader(p)); });
  expect_both(t, "model.safetensors");
}

TEST(FileMutations, SafetensorsShardedIndex) {
  TempDir d;
  small_safetensors(d, "model-00001-of-00002.safetensors");
  {
    std::vector<float> e(8, 1.0f);
    write_safetensors(d.file("model-00002-of-00002.safetensors"),
                      {{"model.e.weight", DType::kF32, {8}, e.data()}});
  }
  const std::string index = R"({
  "metadata": {"total_size": 196},
  "weight_map": {
    "model.a.weight": "model-00001-of-00002.safetensors",
    "model.b.weight": "model-00001-of-00002.safetensors",
    "model.c.weight": "model-00001-of-00002.safetensors",
    "model.e.weight": "model-00002-of-00002.safetensors"
  }
}
)";
  const std::string p = d.write("model.safetensors.index.json", index);
  read_every_tensor(SafetensorsReader(d.path().string()));
  const Tally t = each_mutant(index, p, 12, 300, 0,
                              [&] { read_every_tensor(SafetensorsReader(d.path().string())); });
  EXPECT_GT(t.refused, 0);
  std::printf("model.safetensors.index.json: %d refused, %d read\n", t.refused, t.read);
}

// A Hugging Face model directory's weights as load_params reads them (every tensor by name, its
// shape checked against config.json, converted to fp32), or the ConfigError.
std::map<std::string, std::vector<float>> load_weights(const std::string& dir) {
  Device dev;
  const ModelConfig m = load_model_config(dir);
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : load_params(dev, m, dir, DType::kF32, 0))
    out[name] = download(dev, t);
  return out;
}

// The transformers fixture's model.safetensors damaged, half in its header: refused, or every
// tensor of the model loaded at its size. Damage to the data loads other values: safetensors
// carries no checksum (upipe's own checkpoints do, multirank/test_checkpoint.cpp).
TEST(FileMutations, HuggingFaceWeights) {
  TempDir d;
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(kSrc + "/tests/fixtures/hf/llama/" + f, d.file(f));
  const std::string p = d.file("model.safetensors");
  const std::string good = slurp(p);
  const auto original = load_weights(d.path().string());
  int same = 0, other = 0;
  const Tally t = each_mutant(good, p, 80, 150, safetensors_header_end(good), [&] {
    const auto got = load_weights(d.path().string());
    ASSERT_EQ(got.size(), original.size());
    for (const auto& [name, v] : got) ASSERT_EQ(v.size(), original.at(name).size()) << name;
    ++(got == original ? same : other);
  });
  expect_both(t, "llama model.safetensors through load_params");
  std::printf("  of those read: %d the original weights, %d other values\n", same, other);
}

// The fixture's weights rewritten with `edit` applied to its tensors (name -> fp32 values and
// shape) into dir/model.safetensors beside its config.json.
void write_edited_weights(
    const TempDir& d,
    const std::function<
        void(std::map<std::string, std::pair<std::vector<float>, std::vector<int64_t>>>&)>& edit) {
  const std::string src = kSrc + "/tests/fixtures/hf/llama";
  fs::copy_file(src + "/config.json", d.file("config.json"), fs::copy_options::overwrite_existing);
  const SafetensorsReader r(src);
  std::map<std::string, std::pair<std::vector<float>, std::vector<int64_t>>> t;
  for (const std::string& n : r.names()) {
    const SafetensorsTensor& x = r.tensor(n);
    std::vector<float> v(size_t(x.numel));
    r.read(n, x.shape, DType::kF32, v.data());
    t[n] = {std::move(v), x.shape};
  }
  edit(t);
  std::vector<SafetensorsWriteItem> items;
  for (const auto& [n, x] : t) items.push_back({n, DType::kF32, x.second, x.first.data(), nullptr});
  write_safetensors(d.file("model.safetensors"), items);
}

// Beyond the format: a tensor the config's model does not use (the config does not describe the
// weights) and a value that is not finite are refused naming the tensor; RoPE's inv_freq buffers
// of older checkpoints are not weights and load.
TEST(FileMutations, WeightsTheConfigDoesNotDescribeAreRefused) {
  TempDir d;
  using T = std::map<std::string, std::pair<std::vector<float>, std::vector<int64_t>>>;
  write_edited_weights(d, [](T& t) {
    t["model.layers.0.self_attn.q_norm.weight"] = {std::vector<float>(16, 1.0f), {16}};
  });
  expect_config_error([&] { load_weights(d.path().string()); },
                      {"holds 1 tensor(s) the model of its config.json does not use "
                       "(model.layers.0.self_attn.q_norm.weight)"});
  write_edited_weights(d, [](T& t) {
    t["model.layers.9.mlp.up_proj.weight"] = {std::vector<float>(4, 1.0f), {2, 2}};
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = {std::vector<float>(8, 1.0f), {8}};
  });
  expect_config_error([&] { load_weights(d.path().string()); },
                      {"(model.layers.9.mlp.up_proj.weight)"});
  write_edited_weights(d, [](T& t) {
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = {std::vector<float>(8, 1.0f), {8}};
  });
  EXPECT_FALSE(load_weights(d.path().string()).empty());
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    write_edited_weights(d, [&](T& t) { t["model.layers.1.mlp.down_proj.weight"].first[5] = bad; });
    expect_config_error([&] { load_weights(d.path().string()); },
                        {"tensor model.layers.1.mlp.down_proj.weight holds"});
  }
}

// A token file's contract: what reads is inside the vocabulary, through every entry point.
void read_tokens_checked(const std::string& p, int64_t vocab) {
  const TokenFileInfo info = inspect_token_file(p);
  ASSERT_GE(info.count, 0);
  ASSERT_LE(info.data_offset + info.count * info.width, int64_t(fs::file_size(p)));
  check_token_ids(info, info.count, vocab);
  const std::vector<int32_t> ids = read_tokens(p, vocab);
  ASSERT_EQ(int64_t(ids.size()), info.count);
  for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < vocab) << id;
  if (info.count > 2) {
    std::vector<int32_t> mid(size_t(info.count - 2));
    read_token_range(info, 1, info.count - 2, vocab, mid.data());
    ASSERT_TRUE(std::equal(mid.begin(), mid.end(), ids.begin() + 1));
  }
}

TEST(FileMutations, TokenFiles) {
  TempDir d;
  std::vector<int32_t> ids(300);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37) % 251);
  for (int width : {2, 4}) {
    const std::string p = d.file("tokens" + std::to_string(width) + ".bin");
    write_bin_tokens(p, ids, width);
    const std::string good = slurp(p);
    read_tokens_checked(p, 256);
    expect_both(
        each_mutant(good, p, 20 + uint64_t(width), 300, 12, [&] { read_tokens_checked(p, 256); }),
        "llm.c .bin, width " + std::to_string(width));
  }
  const std::string npy = d.file("tokens.npy");
  fs::copy_file(kSrc + "/tests/fixtures/hf/llama/tokens.npy", npy);
  const std::string good = slurp(npy);
  read_tokens_checked(npy, 256);
  expect_both(each_mutant(good, npy, 24, 300, 128, [&] { read_tokens_checked(npy, 256); }),
              "tokens.npy");
}

// An indexed dataset's contract: documents ascending from 0 inside the .bin, ids readable.
void read_dataset_checked(const std::string& prefix) {
  const IndexedDataset ds = read_indexed_dataset(prefix);
  ASSERT_GE(ds.documents(), 0);
  ASSERT_EQ(ds.doc_starts.front(), 0);
  for (size_t i = 1; i < ds.doc_starts.size(); ++i)
    ASSERT_LT(ds.doc_starts[i - 1], ds.doc_starts[i]);
  ASSERT_LE(ds.doc_starts.back(), ds.bin.count);
  ASSERT_LE(ds.bin.data_offset + ds.bin.count * ds.bin.width,
            int64_t(fs::file_size(prefix + ".bin")));
  std::vector<int32_t> v(size_t(ds.bin.count));
  read_token_range(ds.bin, 0, ds.bin.count, int64_t(1) << 20, v.data());
}

TEST(FileMutations, MegatronIndexedDataset) {
  TempDir d;
  for (const std::string name : {"split", "uint16"}) {
    const std::string prefix = d.file(name);
    for (const char* ext : {".idx", ".bin"})
      fs::copy_file(kSrc + "/tests/fixtures/megatron/" + name + ext, prefix + ext);
    read_dataset_checked(prefix);
    const Tally idx = each_mutant(slurp(prefix + ".idx"), prefix + ".idx", 30, 300, 34,
                                  [&] { read_dataset_checked(prefix); });
    // Every byte of an index is a size, an offset or a boundary: nearly all damage is refused.
    EXPECT_GT(idx.refused, 0) << name;
    std::printf("%s.idx: %d refused, %d read\n", name.c_str(), idx.refused, idx.read);
    const Tally bin = each_mutant(slurp(prefix + ".bin"), prefix + ".bin", 31, 100, 0,
                                  [&] { read_dataset_checked(prefix); });
    EXPECT_GT(bin.refused, 0) << "a shorter .bin must be refused";
    std::printf("%s.bin: %d refused, %d read\n", name.c_str(), bin.refused, bin.read);
  }
}

// A config.json's contract: what parses is a model the engine can size and lay out.
void parse_config_checked(const std::string& p) {
  const ModelConfig m = load_model_config(p);
  ASSERT_GT(m.hidden_size, 0);
  ASSERT_GT(m.num_hidden_layers, 0);
  ASSERT_LE(m.num_hidden_layers, kMaxLayers);
  ASSERT_GT(m.vocab_size, 0);
  to_attention_config(m);
  ASSERT_GT(parameter_count(m), 0);
  ASSERT_GT(layer_parameter_count(m), 0);
}

TEST(FileMutations, ModelConfigJson) {
  TempDir d;
  for (const std::string fixture :
       {"llama/config.json", "qwen3/config.json", "qwen3/config.rope_parameters.json"}) {
    const std::string good = slurp(kSrc + "/tests/fixtures/hf/" + fixture);
    const std::string p = d.file("config.json");
    std::ofstream(p, std::ios::binary | std::ios::trunc) << good;
    parse_config_checked(p);
    expect_both(each_mutant(good, p, 40 + good.size(), 400, 0, [&] { parse_config_checked(p); }),
                fixture);
  }
}

TEST(FileMutations, RunFiles) {
  TempDir d;
  for (const std::string example :
       {"copy-task.toml", "text-corpus.toml", "llama3-8b-long-context.toml"}) {
    const std::string good = slurp(kSrc + "/examples/" + example);
    const std::string p = d.file("run.toml");
    std::ofstream(p, std::ios::binary | std::ios::trunc) << good;
    auto load = [&] {
      const RunConfig c = read_run_file(p);
      validate(c, kScopePlan);
      // What validated writes itself back and reads the same.
      const RunConfig back = parse_run_toml(to_toml(c), "to_toml");
      ASSERT_EQ(to_toml(back), to_toml(c));
    };
    load();
    expect_both(each_mutant(good, p, 50 + good.size(), 300, 0, load), example);
  }
}

TEST(FileMutations, DocumentLengthFiles) {
  TempDir d;
  const std::string p = d.file("doc_lens.npy");
  fs::copy_file(kSrc + "/tests/fixtures/hf/llama/doc_lens.npy", p);
  const std::string good = slurp(p);
  const std::vector<int64_t> lens = parse_doc_lens(p, 1 << 20);
  int64_t total = 0;
  for (int64_t n : lens) total += n;
  auto load = [&] {
    const std::vector<int64_t> got = parse_doc_lens(p, 1 << 20);
    for (int64_t n : got) ASSERT_TRUE(n >= 1 && n <= (1 << 20)) << n;
    documents_from(p, total);  // validated against the fixture's sequence length
  };
  load();
  expect_both(each_mutant(good, p, 60, 300, 128, load), "doc_lens.npy");
}

// A --doc-lens list is quoted in excerpts: 600 lengths and a 3000-character item made a message of
// over 4000 characters; the item is counted from 1.
TEST(FileMutations, DocumentLengthListQuotesExcerpts) {
  std::string list;
  for (int i = 0; i < 600; ++i) list += "7,";
  list += std::string(3000, 'x');
  try {
    parse_doc_lens(list, 1 << 20, "--doc-lens");
    FAIL() << "a length of x read";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_LT(what.size(), 400u) << what;
    EXPECT_NE(what.find("is not a document length (item 601 of '7,7,"), std::string::npos) << what;
  }
}

TEST(FileMutations, MetricsFileOfAResumedRun) {
  TempDir d;
  const std::string p = d.file("metrics.jsonl");
  std::string good;
  for (int step = 1; step <= 4; ++step) {
    StepMetrics m;
    m.step = step;
    m.loss = 5.5 - 0.25 * step;
    good += metrics_json(m) + "\n";
  }
  std::ofstream(p, std::ios::binary | std::ios::trunc) << good;
  check_metrics_file(p, /*resume=*/true, /*overwrite=*/false);
  const Tally t =
      each_mutant(good, p, 70, 300, 0, [&] { check_metrics_file(p, /*resume=*/true, false); });
  EXPECT_GT(t.refused, 0);
  std::printf("metrics.jsonl: %d refused, %d read\n", t.refused, t.read);
}

// A checkpoint's meta.json crafted with the DONE that matches it, as --resume reads it: a
// checksum of 3000 characters (not 16 hex digits) was quoted whole, a message of over 3000.
TEST(FileMutations, CheckpointMetaQuotesExcerpts) {
  TempDir d;
  const std::string dir = d.file("step_00000002");
  fs::create_directory(dir);
  nlohmann::json meta = {
      {"format", "upipe-zero3-checkpoint-2"},
      {"run_id", "r1"},
      {"step", 2},
      {"world", 1},
      {"cp_size", 1},
      {"units", {{{"numel", 4}, {"shard", 4}}}},
      {"model", slurp(kSrc + "/tests/fixtures/hf/llama/config.json")},
      {"run", slurp(kSrc + "/examples/copy-task.toml")},
      {"checksum", {{"algorithm", "xxh3-64"}, {"piece_elements", 4}}},
      {"files",
       {{{"bytes", 100},
         {"header_xxh3", std::string(3000, 'z')},
         {"pieces_xxh3", {"0000000000000001", "0000000000000002", "0000000000000003"}}}}}};
  // meta.json as given, sealed by a DONE that matches it: refused with `want`, quoting little.
  auto refused = [&](const std::string& want) {
    const std::string text = meta.dump(1) + "\n";
    std::ofstream(dir + "/meta.json", std::ios::binary | std::ios::trunc) << text;
    std::ofstream(dir + "/DONE", std::ios::binary | std::ios::trunc) << fmt::format(
        "step 2\nmeta.json xxh3-64 {:016x}\n", XXH3_64bits(text.data(), text.size()));
    try {
      read_checkpoint_info(dir);
      ADD_FAILURE() << "not refused: " << want;
    } catch (const ConfigError& e) {
      EXPECT_LT(std::string(e.what()).size(), 2000u) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused("is not a 16-digit hexadecimal checksum");
  // A run id of any length was read, and quoted in full by the messages naming the run.
  meta["files"][0]["header_xxh3"] = "0000000000000000";
  meta["run_id"] = std::string(3000, 'r');
  refused("is not a run id (up to 64 letters, digits, - and _)");
  meta["run_id"] = "a b";
  refused("is not a run id");
}

}  // namespace
}  // namespace upipe
