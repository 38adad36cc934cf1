// Checkpoints under faults, on real ranks: a flipped byte in a rank file's data or header, a
// truncated file, an edited meta.json (with or without a matching DONE), a rank file of another
// checkpoint, a value that is not finite or a negative second moment forged past the checksums —
// each refused with a ConfigError naming the file; steps of 10^8 and more; runs that
// never mix in one directory (a fresh run refuses another run's checkpoints, pruning removes only
// this run's, --resume refuses an ambiguous directory, overwriting is explicit); a model with the
// same element counts but another architecture refused naming the first field that differs;
// random damage to any file of a checkpoint (common/mutations.h) either refused or harmless: what
// loads or exports is bitwise the bytes that were saved.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "backend/tensor_ops.h"
#include "common/mutations.h"
#include "core/build_info.h"
#include "core/errors.h"
#include "multirank/mpi_test_main.h"
#include "multirank/shared_dir.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/zero.h"

namespace upipe {
namespace {
namespace fs = std::filesystem;
using test::SharedDir;

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void spit(const std::string& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// Rank 0 rewrites file p with f applied to its bytes; every rank waits for it.
void edit_file(Communicator& world, const std::string& p,
               const std::function<void(std::string&)>& f) {
  world.barrier();
  if (world.rank() == 0) {
    std::string b = slurp(p);
    f(b);
    spit(p, b);
  }
  world.barrier();
}

// A checkpoint of the tiny model's random initialisation (seed) at `step`.
std::string save(Communicator& world, const CheckpointRun& run, int64_t step, uint64_t seed = 3,
                 const ModelConfig& m = load_model_config("tiny")) {
  Device dev;
  Zero3 z(dev, world, m, DType::kF32);
  z.init(nullptr, seed);
  return save_checkpoint(run, step, z, world.size(), "");
}

// load_checkpoint on every rank; "" when it loaded, else the ConfigError's message.
std::string load_error(const std::string& path, const ModelConfig& m = load_model_config("tiny")) {
  Device dev;
  Zero3 z(dev, test::world(), m, DType::kF32);
  try {
    load_checkpoint(path, z);
    return "";
  } catch (const ConfigError& e) {
    return e.what();
  }
}

void expect_has(const std::string& msg, const std::vector<std::string>& parts) {
  EXPECT_FALSE(msg.empty()) << "no error";
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
}

// meta.json edited by f, and DONE rewritten to match it (what a consistent forgery needs).
void forge_meta(Communicator& world, const std::string& ck,
                const std::function<void(nlohmann::json&)>& f) {
  edit_file(world, ck + "/meta.json", [&](std::string& text) {
    nlohmann::json j = nlohmann::json::parse(text);
    f(j);
    text = j.dump(1) + "\n";
    spit(ck + "/DONE", fmt::format("step {}\nmeta.json xxh3-64 {:016x}\n", j["step"].get<int64_t>(),
                                   XXH3_64bits(text.data(), text.size())));
  });
}

TEST(Checkpoint, CorruptionIsRefusedNamingTheFile) {
  Communicator& world = test::world();
  SharedDir dir(world);
  const std::string ck = save(world, {dir.path(), "run-a", 0}, 1);
  EXPECT_EQ(load_error(ck), "");
  const int last = world.size() - 1;
  const std::string mine = fmt::format("{}/rank_{:05d}.safetensors", ck, last);
  const std::string pristine = world.rank() == 0 ? slurp(mine) : "";
  auto restore = [&] { edit_file(world, mine, [&](std::string& b) { b = pristine; }); };

  // A bit flipped in the first tensor's data (unit0.master, the embedding): only the rank that
  // reads that piece (the last rank, whose own shard it is) sees it, and names the file.
  edit_file(world, mine, [](std::string& b) {
    uint64_t n = 0;
    std::memcpy(&n, b.data(), 8);
    b[8 + n + 5] ^= 0x10;
  });
  const std::string data_err = load_error(ck);
  if (world.rank() == last)
    expect_has(data_err, {mine, "do not match their checksum"});
  else
    EXPECT_EQ(data_err, "") << "rank " << world.rank() << " does not read that piece";
  {  // export reads everything: every rank refuses
    const CheckpointReader reader(ck);
    const ModelConfig& m = reader.model();
    const std::vector<HfTensorSpec> specs = hf_tensors(m);
    std::string err;
    try {
      for (size_t i = 0; i < specs.size(); ++i) {
        std::vector<float> v(size_t(specs[i].numel()));
        reader.read(int(i), v.data());
      }
    } catch (const ConfigError& e) {
      err = e.what();
    }
    expect_has(err, {mine, "checksum"});
  }
  restore();
  // A byte of the header (its run id), a truncated file, another checkpoint's file.
  edit_file(world, mine, [](std::string& b) { b[b.find("run-a") + 4] = 'b'; });
  expect_has(load_error(ck), {mine, "header does not match"});
  restore();
  edit_file(world, mine, [](std::string& b) { b.resize(b.size() - 8); });
  expect_has(load_error(ck), {mine, "meta.json says", "truncated"});
  restore();
  EXPECT_EQ(load_error(ck), "");
  // meta.json edited (its world): DONE's checksum no longer matches.
  edit_file(world, ck + "/meta.json", [&](std::string& t) {
    const size_t at = t.find("\"world\": ") + 9;
    t.replace(at, 1, std::to_string(world.size() + 1));
  });
  expect_has(load_error(ck), {ck + "/meta.json", "does not match the checksum in"});
  // ... and forged consistently: checked against the rank files it lists.
  forge_meta(world, ck, [&](nlohmann::json& j) {
    j["world"] = world.size() + 1;
    j["cp_size"] = world.size() + 1;
  });
  expect_has(load_error(ck), {"rank files listed for world"});
}

TEST(Checkpoint, RankFilesMustBelongToTheCheckpoint) {
  Communicator& world = test::world();
  SharedDir dir(world);
  const std::string a = save(world, {dir.path(), "run-a", 0}, 1);
  const std::string b = save(world, {dir.path(), "run-a", 2}, 2);  // the same values, step 2
  world.barrier();
  if (world.rank() == 0)
    fs::copy_file(b + "/rank_00000.safetensors", a + "/rank_00000.safetensors",
                  fs::copy_options::overwrite_existing);
  world.barrier();
  expect_has(load_error(a), {a + "/rank_00000.safetensors", "header does not match"});
  // A meta.json forged to accept that header: the file's own metadata still names step 2.
  const std::string header = [&] {
    const std::string f = slurp(a + "/rank_00000.safetensors");
    uint64_t n = 0;
    std::memcpy(&n, f.data(), 8);
    return fmt::format("{:016x}", XXH3_64bits(f.data(), 8 + n));
  }();
  forge_meta(world, a, [&](nlohmann::json& j) { j["files"][0]["header_xxh3"] = header; });
  expect_has(load_error(a), {"its step is 2, meta.json's is 1", "belongs to another checkpoint"});
}

TEST(Checkpoint, StepsOfAnyCount) {
  Communicator& world = test::world();
  SharedDir dir(world);
  save(world, {dir.path(), "run-a", 1}, 99999999);
  const std::string big = save(world, {dir.path(), "run-a", 1}, 123456789);
  EXPECT_EQ(fs::path(big).filename(), "step_123456789");
  EXPECT_EQ(latest_checkpoint(dir.path()), big);
  EXPECT_FALSE(fs::exists(dir.path() + "/step_99999999")) << "keep = 1 prunes the older one";
  EXPECT_EQ(read_checkpoint_info(big).step, 123456789);
  EXPECT_EQ(load_error(big), "");
  const CheckpointStart cs = open_checkpoint_run(world, dir.path(), true, false, 1);
  EXPECT_EQ(cs.resume_from, big);
}

// meta.json names the build that wrote it (build_id(): version and git commit); a checkpoint
// without that field (an older one), another build's, or a field of another type (a forgery with
// a matching DONE) loads all the same: the field informs, it never refuses.
TEST(Checkpoint, RecordsTheBuildThatWroteIt) {
  Communicator& world = test::world();
  SharedDir dir(world);
  const std::string ck = save(world, {dir.path(), "run-a", 0}, 5);
  const std::string id = build_id();
  EXPECT_NE(id.find(std::string(build_info().version) + " (git "), std::string::npos) << id;
  EXPECT_EQ(read_checkpoint_info(ck).written_by, id);
  EXPECT_EQ(nlohmann::json::parse(slurp(ck + "/meta.json")).at("upipe"), id);
  forge_meta(world, ck, [](nlohmann::json& j) { j["upipe"] = "9.9.9 (git 0123456789ab)"; });
  EXPECT_EQ(read_checkpoint_info(ck).written_by, "9.9.9 (git 0123456789ab)");
  EXPECT_EQ(load_error(ck), "");
  forge_meta(world, ck, [](nlohmann::json& j) { j["upipe"] = 42; });
  EXPECT_EQ(read_checkpoint_info(ck).written_by, "");
  EXPECT_EQ(load_error(ck), "");
  forge_meta(world, ck, [](nlohmann::json& j) { j.erase("upipe"); });
  EXPECT_EQ(read_checkpoint_info(ck).written_by, "");
  EXPECT_EQ(load_error(ck), "");
}

// export --tokenizer DIR: the ids a tokenizer.json's post-processor adds to every text count as
// its ids (TemplateProcessing's, Bert's [token, id] pairs, inside a Sequence): past the
// vocabulary, refused (they were not looked at, and the export accepted an id of 656 for 256).
TEST(Checkpoint, ExportRefusesPostProcessorIdsPastTheVocabulary) {
  Communicator& world = test::world();
  SharedDir dir(world);
  const std::string ck = save(world, {dir.path(), "run-a", 0}, 1);  // tiny: vocabulary 256
  if (world.rank() != 0) return;
  const CheckpointReader reader(ck);
  const std::string tok = dir.path() + "/tok";
  fs::create_directories(tok);
  auto with_post = [&](const nlohmann::json& post) {
    const nlohmann::json j = {{"model", {{"type", "WordLevel"}, {"vocab", {{"a", 0}, {"b", 1}}}}},
                              {"added_tokens", nlohmann::json::array()},
                              {"post_processor", post}};
    spit(tok + "/tokenizer.json", j.dump());
    try {
      plan_tokenizer(reader, {TokenizerChoice::Kind::kDir, tok});
      return std::string();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
  };
  auto template_ids = [](int64_t id) {
    return nlohmann::json{
        {"type", "TemplateProcessing"},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {id}}, {"tokens", {"<s>"}}}}}}};
  };
  EXPECT_EQ(with_post(template_ids(255)), "");
  expect_has(with_post(template_ids(656)), {"has token ids up to 656", "vocabulary of 256"});
  const nlohmann::json bert = {
      {"type", "BertProcessing"}, {"sep", {"[SEP]", 300}}, {"cls", {"[CLS]", 1}}};
  expect_has(with_post({{"type", "Sequence"}, {"processors", {bert}}}),
             {"has token ids up to 300"});
  expect_has(with_post(template_ids(-1)), {"has the token id -1, which is no id"});
}

TEST(Checkpoint, RunsNeverMix) {
  Communicator& world = test::world();
  SharedDir dir(world);
  const std::string d = dir.path();
  save(world, {d, "run-a", 0}, 1);
  save(world, {d, "run-a", 0}, 2);
  try {
    open_checkpoint_run(world, d, false, false, 3);
    ADD_FAILURE() << "a fresh run accepted another run's checkpoints";
  } catch (const ConfigError& e) {
    expect_has(e.what(), {"holds checkpoints of another run", "--overwrite"});
  }
  const CheckpointStart resumed = open_checkpoint_run(world, d, true, false, 3);
  EXPECT_EQ(resumed.run.run_id, "run-a");
  EXPECT_EQ(resumed.resume_from, d + "/step_00000002");
  // Another run's pruning (keep = 1) removes only its own older checkpoints; its stale temporary
  // goes, another run's temporary stays.
  world.barrier();
  if (world.rank() == 0)
    for (const auto& [name, id] :
         {std::pair{"step_00000005.tmp", "run-b"}, std::pair{"step_00000006.tmp", "run-x"}}) {
      fs::create_directory(d + "/" + name);
      spit(d + "/" + name + "/run_id", std::string(id) + "\n");
    }
  world.barrier();
  save(world, {d, "run-b", 1}, 3);
  save(world, {d, "run-b", 1}, 4);
  world.barrier();
  for (const char* kept : {"step_00000001", "step_00000002", "step_00000004", "step_00000006.tmp"})
    EXPECT_TRUE(fs::exists(d + "/" + kept)) << kept;
  for (const char* gone : {"step_00000003", "step_00000005.tmp"})
    EXPECT_FALSE(fs::exists(d + "/" + gone)) << gone;
  try {
    open_checkpoint_run(world, d, true, false, 3);
    ADD_FAILURE() << "--resume picked one of two runs";
  } catch (const ConfigError& e) {
    expect_has(e.what(), {"holds checkpoints of 2 runs"});
  }
  try {
    save(world, {d, "run-b", 1}, 2);  // run-a's step 2
    ADD_FAILURE() << "a run replaced another run's checkpoint";
  } catch (const ConfigError& e) {
    expect_has(e.what(), {"step_00000002 belongs to another run (run run-a)"});
  }
  world.barrier();
  EXPECT_EQ(read_checkpoint_info(d + "/step_00000002").run_id, "run-a");
  // Overwriting is explicit: a fresh run with it gets a new identity, and once its first
  // checkpoint is complete every other run's entry is gone.
  const CheckpointStart fresh = open_checkpoint_run(world, d, false, true, 3);
  EXPECT_EQ(fresh.run.run_id.size(), 32u);
  EXPECT_FALSE(fresh.resume_from.has_value());
  save(world, fresh.run, 2);
  world.barrier();
  std::vector<std::string> left;  // besides the lock file rank 0 holds (.upipe-lock)
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().filename() != ".upipe-lock") left.push_back(e.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"step_00000002"});
  EXPECT_EQ(read_checkpoint_info(d + "/step_00000002").run_id, fresh.run.run_id);
}

TEST(Checkpoint, AnotherArchitectureIsRefused) {
  Communicator& world = test::world();
  SharedDir dir(world);
  const std::string ck = save(world, {dir.path(), "run-a", 0}, 1);
  // 2 heads of 32 instead of 4 of 16: the same element count in every tensor.
  ModelConfig other = load_model_config("tiny");
  other.num_attention_heads = 2;
  other.num_key_value_heads = 1;
  other.head_dim = 32;
  const std::vector<ZeroUnitLayout> a = zero_layout(load_model_config("tiny"), 1),
                                    b = zero_layout(other, 1);
  for (size_t u = 0; u < a.size(); ++u) ASSERT_EQ(a[u].numel, b[u].numel);
  expect_has(load_error(ck, other),
             {"written for another model", "field 'head_dim': the checkpoint has 16"});
}

bool same_bytes(const std::vector<std::vector<float>>& a,
                const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4) != 0)
      return false;
  return true;
}

// The whole model as export reads it (every tensor, fp32), or the ConfigError's message.
std::vector<std::vector<float>> export_all(const std::string& ck, std::string* err) {
  std::vector<std::vector<float>> out;
  try {
    const CheckpointReader reader(ck);
    const std::vector<HfTensorSpec> specs = hf_tensors(reader.model());
    for (size_t i = 0; i < specs.size(); ++i) {
      out.emplace_back(size_t(specs[i].numel()));
      reader.read(int(i), out.back().data());
    }
  } catch (const ConfigError& e) {
    *err = e.what();
  }
  return out;
}

// This rank's shards as load_checkpoint fills them (master, exp_avg, exp_avg_sq of every unit),
// or the ConfigError's message.
std::vector<std::vector<float>> load_all(const std::string& ck, std::string* err) {
  Device dev;
  Zero3 z(dev, test::world(), load_model_config("tiny"), DType::kF32);
  std::vector<std::vector<float>> out;
  try {
    load_checkpoint(ck, z);
    for (int u = 0; u < z.num_units(); ++u)
      for (const Mat& m : {z.master(u), z.exp_avg(u), z.exp_avg_sq(u)})
        out.push_back(download(dev, m));
  } catch (const ConfigError& e) {
    *err = e.what();
  }
  return out;
}

// A value a run does not continue from (one that is not finite, a negative second moment), forged
// into element 0 of the last rank's unit0.<field> past every checksum: refused by the rank that
// reads it and by export, naming the file and the tensor, not loaded for the next step to diverge
// on. A finite value forged alike loads: the forgery itself is sound.
TEST(Checkpoint, ValuesARunDoesNotContinueFromAreRefused) {
  Communicator& world = test::world();
  SharedDir dir(world);
  const std::string ck = save(world, {dir.path(), "run-a", 0}, 1);
  const int last = world.size() - 1;
  const std::string mine = fmt::format("{}/rank_{:05d}.safetensors", ck, last);
  const std::string meta = ck + "/meta.json", done = ck + "/DONE";
  const std::string pristine = world.rank() == 0 ? slurp(mine) : "";
  const std::string pristine_meta = world.rank() == 0 ? slurp(meta) : "";
  const std::string pristine_done = world.rank() == 0 ? slurp(done) : "";
  // Where element 0 of `key` is in the rank file b.
  auto data_at = [](const std::string& b, const std::string& key) {
    uint64_t n = 0;
    std::memcpy(&n, b.data(), 8);
    const nlohmann::json head = nlohmann::json::parse(b.substr(8, size_t(n)));
    return size_t(8 + n + head.at(key).at("data_offsets").at(0).get<uint64_t>());
  };
  auto forge = [&](int field, const std::string& key, float v) {
    edit_file(world, mine, [&](std::string& b) { std::memcpy(&b[data_at(b, key)], &v, 4); });
    forge_meta(world, ck, [&](nlohmann::json& j) {
      const std::string b = slurp(mine);
      const int64_t shard = j["units"][0]["shard"], piece = j["checksum"]["piece_elements"];
      j["files"][last]["pieces_xxh3"][size_t(field * ((shard + piece - 1) / piece))] = fmt::format(
          "{:016x}", XXH3_64bits(b.data() + data_at(b, key), size_t(std::min(shard, piece)) * 4));
    });
  };
  auto restore = [&] {
    edit_file(world, mine, [&](std::string& b) { b = pristine; });
    edit_file(world, meta, [&](std::string& b) { b = pristine_meta; });
    edit_file(world, done, [&](std::string& b) { b = pristine_done; });
  };
  forge(0, "unit0.master", 0.5f);
  EXPECT_EQ(load_error(ck), "");
  restore();
  const struct {
    int field;
    const char* key;
    float v;
    const char* what;
  } cases[] = {{0, "unit0.master", std::numeric_limits<float>::quiet_NaN(), "holds nan"},
               {1, "unit0.exp_avg", std::numeric_limits<float>::infinity(), "holds inf"},
               {2, "unit0.exp_avg_sq", -1.0f, "a negative second moment"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key);
    forge(c.field, c.key, c.v);
    const std::string err = load_error(ck);
    if (world.rank() == last)
      expect_has(err, {mine, c.key, c.what, "damaged or its run had diverged"});
    else
      EXPECT_EQ(err, "") << "rank " << world.rank() << " does not read that element";
    if (c.field == 0) {  // export reads every rank's master
      std::string export_err;
      export_all(ck, &export_err);
      expect_has(export_err, {mine, c.key, c.what});
    }
    restore();
  }
  EXPECT_EQ(load_error(ck), "");
}

// Every file of a checkpoint damaged at random, one damage at a time: export (rank 0) and
// load_checkpoint (every rank) either refuse it with a one-line ConfigError or read exactly the
// bytes that were saved. The chain of checksums (DONE -> meta.json -> headers and pieces) leaves
// no third outcome; the damages that read are those to bytes the chain does not depend on.
// (No ASSERT between barriers: a rank that left the test early would leave the others waiting.)
TEST(Checkpoint, RandomDamageIsRefusedOrHarmless) {
  Communicator& world = test::world();
  SharedDir dir(world);
  const std::string ck = save(world, {dir.path(), "run-a", 0}, 1, 5);
  std::string err;
  const std::vector<std::vector<float>> saved_model =
      world.rank() == 0 ? export_all(ck, &err) : std::vector<std::vector<float>>{};
  EXPECT_EQ(err, "");
  const std::vector<std::vector<float>> saved_shards = load_all(ck, &err);
  EXPECT_EQ(err, "");
  // Every rank has read the pristine checkpoint before rank 0 starts damaging it (a rank still
  // reading met rank 0's first damaged DONE: a flaky "meta.json does not match" on 3 ranks).
  world.barrier();
  std::vector<std::string> files = {"DONE", "meta.json", "run_id"};
  for (int r = 0; r < world.size(); ++r) files.push_back(fmt::format("rank_{:05d}.safetensors", r));
  auto one_line = [](const std::string& e) { EXPECT_EQ(e.find('\n'), std::string::npos) << e; };
  int refused = 0, harmless = 0;
  uint64_t seed = 100;
  for (const std::string& name : files) {
    const std::string p = ck + "/" + name;
    const std::string pristine = world.rank() == 0 ? slurp(p) : "";
    // The header of a rank file is where its offsets live: half the damage goes there.
    size_t hot = 0;
    if (world.rank() == 0 && name.starts_with("rank_")) {
      uint64_t n = 0;
      std::memcpy(&n, pristine.data(), 8);
      hot = size_t(8 + n);
    }
    // Export on rank 0 alone, many damages; the other ranks wait.
    if (world.rank() == 0) {
      for (const test::Mutant& m : test::mutants(pristine, seed, 40, hot)) {
        SCOPED_TRACE(name + ": " + m.what);
        spit(p, m.bytes);
        std::string e;
        const std::vector<std::vector<float>> got = export_all(ck, &e);
        if (!e.empty()) {
          one_line(e);
          ++refused;
        } else {
          EXPECT_TRUE(same_bytes(got, saved_model)) << "the export read other bytes";
          ++harmless;
        }
      }
      spit(p, pristine);
    }
    // load_checkpoint on every rank, fewer damages: each rank refuses or loads the saved bytes.
    const std::vector<test::Mutant> some =
        world.rank() == 0 ? test::mutants(pristine, seed + 1, 8, hot)
                          : std::vector<test::Mutant>(size_t(8 * test::mutation_scale()));
    for (const test::Mutant& m : some) {
      edit_file(world, p, [&](std::string& b) { b = m.bytes; });
      SCOPED_TRACE(name + ": " + m.what);
      std::string e;
      const std::vector<std::vector<float>> got = load_all(ck, &e);
      if (!e.empty()) {
        one_line(e);
        ++refused;
      } else {
        EXPECT_TRUE(same_bytes(got, saved_shards)) << "the load read other bytes";
        ++harmless;
      }
    }
    edit_file(world, p, [&](std::string& b) { b = pristine; });
    seed += 2;
  }
  EXPECT_GT(refused, 0);
  if (world.rank() == 0) {
    EXPECT_GT(harmless, 0) << "no damage was harmless: run_id is not checked";
  }
  std::printf("rank %d: %d damaged checkpoints refused, %d harmless\n", world.rank(), refused,
              harmless);
  ASSERT_EQ(load_error(ck), "");
}

}  // namespace
}  // namespace upipe
