// The settings table: defaults, TOML parsing, command-line flags in every spelling (the flag,
// the short flag, the dotted key, the older aliases with their notes), every refusal as a
// one-line ConfigError naming the file / flag and the setting (with a "did you mean" for unknown
// ones), validation per setting with the setting named as the user wrote it, the printed-back
// config reading back to the same config, the spelling convention of the flags, and
// docs/training.md documenting every setting.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/setting_ref.h"
#include "core/spelling.h"
#include "train/run_config.h"
#include "train/run_options.h"
#include "unit/expect_config_error.h"
#include "unit/temp_dir.h"

namespace upipe {
namespace {

std::vector<std::string> args(std::initializer_list<const char*> a) {
  return {a.begin(), a.end()};
}

// Restores the default speller when a test that installs one ends.
struct SpellerGuard {
  ~SpellerGuard() { set_setting_speller(nullptr); }
};

TEST(RunConfig, DefaultsAreValidAndRunWithoutAFile) {
  const RunConfig c = load_run_config("");
  EXPECT_EQ(c, RunConfig{});
  EXPECT_EQ(c.model.name, "tiny");
  EXPECT_EQ(c.parallel.knobs.method, "upipe");
  EXPECT_EQ(c.parallel.cp_size, 0);
  EXPECT_EQ(c.comm.timeout, 600);
  EXPECT_EQ(c.data.kind, "copy");
  EXPECT_EQ(c.memory.device_bytes, int64_t(1024) << 30);
  EXPECT_EQ(c.memory.host_bytes, int64_t(256) << 30);
  EXPECT_EQ(c.memory.policy, MemoryPolicy{});
  EXPECT_DOUBLE_EQ(c.min_lr(), 3e-5);
}

TEST(RunConfig, ParsesEverySectionFromToml) {
  const RunConfig c = parse_run_toml(R"(
[model]
name = "llama3-8b"
init_from = "/ckpt/hf"
[parallel]
cp_size = 4
method = "upipe-fpdt"
stage_heads = 8
ulysses_degree = 2
chunks = 3
[train]
steps = 5000
seq_len = 131072
micro_steps = 4
lr = 1e-4
min_lr_ratio = 0.05
warmup_steps = 200
weight_decay = 0.0
beta1 = 0.8
beta2 = 0.99
eps = 1e-6
grad_clip = 0.5
seed = 42
[memory]
dtype = "bf16"
residual_dtype = "bf16"
recompute = "block"
stash_dtype = "bf16"
offload_stash = true
tile_tokens = 2048
device_memory = "80G"
host_memory = 1073741824
[data]
kind = "files"
path = "/data/*.bin"
[checkpoint]
dir = "ckpt"
interval = 500
keep = 2
[metrics]
path = "m.jsonl"
log_interval = 10
progress = "lines"
[comm]
timeout = 30
)",
                                     "run.toml");
  EXPECT_EQ(c.model.name, "llama3-8b");
  EXPECT_EQ(c.model.init_from, "/ckpt/hf");
  EXPECT_EQ(c.parallel.cp_size, 4);
  EXPECT_EQ(c.parallel.knobs, (MethodKnobs{"upipe-fpdt", 8, 2, 3}));
  EXPECT_EQ(c.train.steps, 5000);
  EXPECT_EQ(c.train.seq_len, 131072);
  EXPECT_EQ(c.train.micro_steps, 4);
  EXPECT_EQ(c.train.lr, 1e-4);
  EXPECT_EQ(c.train.min_lr_ratio, 0.05);
  EXPECT_EQ(c.train.warmup_steps, 200);
  EXPECT_EQ(c.train.weight_decay, 0.0);
  EXPECT_EQ(c.train.beta1, 0.8);
  EXPECT_EQ(c.train.beta2, 0.99);
  EXPECT_EQ(c.train.eps, 1e-6);
  EXPECT_EQ(c.train.grad_clip, 0.5);
  EXPECT_EQ(c.train.seed, 42);
  const MemoryPolicy& p = c.memory.policy;
  EXPECT_EQ(p.dtype, DType::kBF16);
  EXPECT_EQ(p.residual_dtype, DType::kBF16);
  EXPECT_EQ(p.recompute, Recompute::kBlock);
  EXPECT_EQ(p.stash_dtype, DType::kBF16);
  EXPECT_TRUE(p.offload_stash);
  EXPECT_EQ(p.tile_tokens, 2048);
  EXPECT_EQ(c.memory.device_bytes, int64_t(80) << 30);
  EXPECT_EQ(c.memory.host_bytes, int64_t(1) << 30);  // an integer is a number of bytes
  EXPECT_EQ(c.data.kind, "files");
  EXPECT_EQ(c.data.path, "/data/*.bin");
  EXPECT_EQ(c.checkpoint.dir, "ckpt");
  EXPECT_EQ(c.checkpoint.interval, 500);
  EXPECT_EQ(c.checkpoint.keep, 2);
  EXPECT_EQ(c.metrics.path, "m.jsonl");
  EXPECT_EQ(c.metrics.log_interval, 10);
  EXPECT_EQ(c.metrics.progress, "lines");
  EXPECT_EQ(c.comm.timeout, 30.0);  // an integer is accepted for a float key
  // Dotted keys are the same tables.
  EXPECT_EQ(parse_run_toml("train.steps = 7\nmodel.name = \"qwen3-8b\"", "d.toml").train.steps, 7);
}

// Run files written before the settings were renamed still read the same, with a note each.
TEST(RunConfig, OlderKeysInRunFilesStillWork) {
  SettingSources src;
  const RunConfig c = parse_run_toml(R"(
[parallel]
head_chunk = 4
[train]
dtype = "bf16"
tile_tokens = 64
offload_checkpoints = true
checkpoint_dtype = "bf16"
residual_dtype = "bf16"
checkpoint_granularity = "none"
[memory]
budget_gib = 0.5
[comm]
timeout_s = 2.5
)",
                                     "old.toml", &src);
  EXPECT_EQ(c.parallel.knobs.stage_heads, 4);
  EXPECT_EQ(c.memory.policy,
            (MemoryPolicy{DType::kBF16, DType::kBF16, Recompute::kNone, DType::kBF16, true, 64}));
  EXPECT_EQ(c.memory.device_bytes, int64_t(1) << 29);
  EXPECT_EQ(c.comm.timeout, 2.5);
  EXPECT_EQ(src.notes.size(), 9u);
  EXPECT_NE(std::find(src.notes.begin(), src.notes.end(),
                      "train.checkpoint_dtype is now memory.stash_dtype in the run file"),
            src.notes.end());
  EXPECT_EQ(src.spelled.at("memory.stash_dtype"), "train.checkpoint_dtype in old.toml");
}

TEST(RunConfig, TomlErrorsNameFileLineAndKey) {
  expect_config_error([] { parse_run_toml("[train]\nsteps = \"abc\"\n", "run.toml"); },
                      {"run.toml:2:", "train.steps must be an integer", "string"});
  expect_config_error(
      [] { parse_run_toml("[train]\nseq_len = \"128K\"\n", "run.toml"); },
      {"run.toml:2: train.seq_len must be an integer, got the TOML string \"128K\"; write it in "
       "digits: 128K is 131072 (x 1024) or 128000 (x 1000)"});
  expect_config_error([] { parse_run_toml("[train]\nlr = \"fast\"\n", "run.toml"); },
                      {"run.toml:2:", "train.lr must be a number"});
  expect_config_error([] { parse_run_toml("[train]\nsteps = 1.5\n", "r.toml"); },
                      {"r.toml:2:", "train.steps must be an integer", "floating"});
  expect_config_error([] { parse_run_toml("[memory]\noffload_stash = 1\n", "r.toml"); },
                      {"memory.offload_stash must be true or false"});
  expect_config_error([] { parse_run_toml("[memory]\ndtype = \"fp16\"\n", "r.toml"); },
                      {"r.toml:2:", "memory.dtype", "'fp16' is unknown; choose fp32 or bf16"});
  expect_config_error([] { parse_run_toml("[memory]\ndevice_memory = \"80X\"\n", "r.toml"); },
                      {"r.toml:2:", "memory.device_memory", "unknown size unit"});
  expect_config_error([] { parse_run_toml("[parallel]\nstage_heads = \"some\"\n", "r.toml"); },
                      {"r.toml:2:", "parallel.stage_heads must be a whole number or \"auto\""});
  expect_config_error([] { parse_run_toml("[parallel]\ncp_size = 5000000000\n", "r.toml"); },
                      {"r.toml:2:", "parallel.cp_size", "out of range"});
  expect_config_error([] { parse_run_toml("[train]\nlearning_rate = 1e-3\n", "r.toml"); },
                      {"r.toml:2:", "unknown key 'train.learning_rate'", "did you mean"});
  expect_config_error([] { parse_run_toml("[train]\nwarmup = 10\n", "r.toml"); },
                      {"unknown key 'train.warmup'", "'train.warmup_steps'"});
  expect_config_error([] { parse_run_toml("[trian]\nsteps = 10\n", "r.toml"); },
                      {"unknown key 'trian.steps'", "'train.steps'"});
  // The first problem in the file is said, at its own line (toml++ walks a table by name: lr on
  // line 4 was said before steps on line 2, and [aa] before [zz]).
  expect_config_error([] { parse_run_toml("[trian]\nsteps = 10\n\nlr = 1\n", "r.toml"); },
                      {"r.toml:2: unknown key 'trian.steps'"});
  expect_config_error([] { parse_run_toml("[zz]\nsteps = 1\n[aa]\nlr = 1\n", "r.toml"); },
                      {"r.toml:2: unknown key 'zz.steps'"});
  // A key of another table is named (it said 'model.name' for [model] lr).
  expect_config_error([] { parse_run_toml("[model]\nlr = 0.1\n", "r.toml"); },
                      {"r.toml:2: unknown key 'model.lr'; did you mean 'train.lr'?"});
  // A place named in a table is that table's place (it said 'metrics.path' for [checkpoint] path).
  expect_config_error([] { parse_run_toml("[checkpoint]\npath = \"ck\"\n", "r.toml"); },
                      {"unknown key 'checkpoint.path'; did you mean 'checkpoint.dir'?"});
  expect_config_error([] { parse_run_toml("[checkpoint]\nsave-dir = \"ck\"\n", "r.toml"); },
                      {"did you mean 'checkpoint.dir'?"});
  expect_config_error([] { parse_run_toml("[metrics]\nfile = \"m.jsonl\"\n", "r.toml"); },
                      {"did you mean 'metrics.path'?"});
  expect_config_error([] { parse_run_toml("[data]\ndirectory = \"d\"\n", "r.toml"); },
                      {"did you mean 'data.path'?"});
  expect_config_error([] { parse_run_toml("[train]\nbatch_size = 8\n", "r.toml"); },
                      {"did you mean 'train.micro_steps'?", "a step's global batch is DP x"});
  expect_config_error([] { parse_run_toml("steps = 10\n", "r.toml"); },
                      {"r.toml:1:", "'steps' is not a [section]", "'train.steps'"});
  expect_config_error([] { parse_run_toml("[train]\nsteps = \n", "bad.toml"); }, {"bad.toml:2:"});
  // A key or section of the file is quoted as an excerpt (one of 3000 characters made a message of
  // over 3000), and a long one is compared with the keys by its start: a key of 2 MB took minutes
  // (the edit distance to every key) before it was refused.
  for (const std::string& text :
       {"[train]\n" + std::string(3000, 'k') + " = 1\n", std::string(3000, 's') + " = 1\n",
        "[train]\n" + std::string(2 << 20, 'k') + " = 1\n"}) {
    const auto start = std::chrono::steady_clock::now();
    try {
      parse_run_toml(text, "r.toml");
      ADD_FAILURE() << "not refused";
    } catch (const ConfigError& e) {
      EXPECT_LT(std::string(e.what()).size(), 2000u) << e.what();
      EXPECT_NE(std::string(e.what()).find("r.toml:"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  }
}

TEST(RunConfig, Int64KeysTakeLargeValues) {
  EXPECT_EQ(parse_run_toml("[train]\nsteps = 5000000000\n", "r").train.steps, 5000000000);
}

TEST(RunConfig, FlagsInEverySpelling) {
  RunConfig c;
  SettingSources src;
  apply_overrides(c,
                  args({"--lr=1e-3", "--steps", "250", "--model=qwen3-8b", "--offload-stash",
                        "--device-memory", "512M", "--data-path=a=b.bin", "-U", "4",
                        "--recompute=block", "--stash-dtype", "bf16"}),
                  kScopeTrain, &src);
  EXPECT_EQ(c.train.lr, 1e-3);
  EXPECT_EQ(c.train.steps, 250);
  EXPECT_EQ(c.model.name, "qwen3-8b");
  EXPECT_TRUE(c.memory.policy.offload_stash);
  EXPECT_EQ(c.memory.device_bytes, int64_t(512) << 20);
  EXPECT_EQ(c.data.path, "a=b.bin");  // only the first '=' splits
  EXPECT_EQ(c.parallel.knobs.stage_heads, 4);
  EXPECT_EQ(c.memory.policy.recompute, Recompute::kBlock);
  EXPECT_EQ(c.memory.policy.stash_dtype, DType::kBF16);
  EXPECT_TRUE(src.notes.empty());
  EXPECT_EQ(src.spelled.at("parallel.stage_heads"), "-U");
  // A bool flag takes the next argument only when it is a bool.
  apply_overrides(c, args({"--offload-stash", "false"}));
  EXPECT_FALSE(c.memory.policy.offload_stash);
  apply_override(c, "memory.offload_stash", "1");
  EXPECT_TRUE(c.memory.policy.offload_stash);
  // The dotted run-file form and the older flags still work, each with a note.
  apply_overrides(
      c,
      args({"--train.lr=2e-3", "--train.steps", "300", "--head-chunk=2", "--memory.budget_gib",
            "0.5", "--offload-checkpoints=false", "--checkpoint-granularity", "none",
            "--train.checkpoint_dtype=fp32", "--memory-budget=1G", "--parallel.stage_heads=8"}),
      kScopeTrain, &src);
  EXPECT_EQ(c.train.lr, 2e-3);
  EXPECT_EQ(c.train.steps, 300);
  EXPECT_EQ(c.parallel.knobs.stage_heads, 8);  // the last one given wins
  EXPECT_FALSE(c.memory.policy.offload_stash);
  EXPECT_EQ(c.memory.policy.recompute, Recompute::kNone);
  EXPECT_EQ(c.memory.policy.stash_dtype, DType::kF32);
  EXPECT_EQ(c.memory.device_bytes, int64_t(1) << 30);
  const std::set<std::string> notes(src.notes.begin(), src.notes.end());
  EXPECT_TRUE(notes.count("--head-chunk is now --stage-heads"));
  EXPECT_TRUE(notes.count("--train.lr is now --lr"));
  EXPECT_TRUE(notes.count("--memory.budget_gib is now --device-memory"));
  EXPECT_TRUE(notes.count("--memory-budget is now --device-memory"));
  EXPECT_EQ(src.notes.size(), notes.size()) << "each note once";
  // GiB aliases convert to bytes.
  apply_overrides(c, args({"--device-gib=80", "--host-gib", "1.5"}), kScopePlan);
  EXPECT_EQ(c.memory.device_bytes, int64_t(80) << 30);
  EXPECT_EQ(c.memory.host_bytes, int64_t(3) << 29);
  // Knobs take auto.
  apply_overrides(c, args({"--stage-heads=auto", "--chunks", "auto"}), kScopePlan);
  EXPECT_EQ(c.parallel.knobs.stage_heads, kKnobAuto);
  EXPECT_EQ(c.parallel.knobs.chunks, kKnobAuto);
}

TEST(RunConfig, FlagErrorsNameTheFlag) {
  RunConfig c;
  expect_config_error([&] { apply_overrides(c, args({"--steps=abc"})); },
                      {"--steps", "'abc' is not an integer"});
  expect_config_error([&] { apply_overrides(c, args({"--train.steps=12x"})); },
                      {"--train.steps", "'12x'"});
  expect_config_error([&] { apply_overrides(c, args({"--steps="})); },
                      {"--steps", "is not an integer"});
  // A sequence length as it is spoken of: the digits it may mean.
  expect_config_error(
      [&] { apply_overrides(c, args({"--seq-len=128K"})); },
      {"--seq-len: '128K' is not an integer; write it in digits: 128K is 131072 (x 1024) or "
       "128000 (x 1000)"});
  expect_config_error(
      [&] {
        apply_overrides(c, args({"--seq-len", "1M"}));
      },
      {"1M is 1048576 (x 1024^2) or 1000000 (x 1000^2)"});
  expect_config_error([&] { apply_overrides(c, args({"--steps=2g"})); },
                      {"2g is 2147483648 (x 1024^3) or 2000000000 (x 1000^3)"});
  expect_config_error([&] { apply_overrides(c, args({"--steps=-1K"})); },
                      {"'-1K' is not an integer"});
  expect_config_error([&] { apply_overrides(c, args({"--lr=fast"})); },
                      {"--lr", "not a finite number"});
  expect_config_error([&] { apply_overrides(c, args({"--lr=nan"})); },
                      {"--lr", "not a finite number"});
  expect_config_error([&] { apply_overrides(c, args({"--offload-stash=yes"})); },
                      {"--offload-stash", "not true or false"});
  expect_config_error([&] { apply_overrides(c, args({"--stage-heads=99999999999"})); },
                      {"parallel.stage_heads", "out of range"});
  expect_config_error([&] { apply_overrides(c, args({"--stage-heads=-2"})); },
                      {"--stage-heads", "not a whole number >= 0 or auto"});
  expect_config_error([&] { apply_overrides(c, args({"--dtype=fp16"})); },
                      {"--dtype", "choose fp32 or bf16"});
  expect_config_error([&] { apply_overrides(c, args({"--recompute=op"})); },
                      {"--recompute", "choose layer, block or none"});
  expect_config_error([&] { apply_overrides(c, args({"--device-memory=0"})); },
                      {"--device-memory", "less than one byte"});
  expect_config_error([&] { apply_overrides(c, args({"--device-memory=2000000T"})); },
                      {"--device-memory", "1 EiB"});
  expect_config_error([&] { apply_overrides(c, args({"--setps=5"})); },
                      {"unknown option '--setps'", "did you mean '--steps'"});
  expect_config_error([&] { apply_overrides(c, args({"--train.setps=5"})); },
                      {"unknown option '--train.setps'", "did you mean '--steps'"});
  // Names other tools use, and a setting's words after max, num or total (no suggestion before).
  const std::pair<const char*, const char*> other_names[] = {
      {"--learning-rate=1e-3", "unknown option '--learning-rate'; did you mean '--lr'?"},
      {"--max-steps=5", "unknown option '--max-steps'; did you mean '--steps'?"},
      {"--num-steps=5", "unknown option '--num-steps'; did you mean '--steps'?"},
      {"--sequence-length=64", "unknown option '--sequence-length'; did you mean '--seq-len'?"},
      {"--max-lr=1e-3", "unknown option '--max-lr'; did you mean '--lr'?"},
      {"--model-name=tiny", "unknown option '--model-name'; did you mean '--model'?"}};
  for (const auto& named : other_names)  // no structured binding: clang 14 cannot capture one
    expect_config_error([&] { apply_overrides(c, args({named.first})); }, {named.second});
  // The batch is no setting of its own: --micro-steps with what it counts.
  expect_config_error(
      [&] { apply_overrides(c, args({"--batch-size=8"})); },
      {"did you mean '--micro-steps'? (sequences per DP rank per step: a step's global batch is "
       "DP x that many sequences)"});
  // A synonym of a setting the command does not take is not suggested.
  expect_config_error([&] { apply_overrides(c, args({"--learning-rate=1e-3"}), kScopePlan); },
                      {"unknown option '--learning-rate' (`upipe settings`"});
  expect_config_error([&] { apply_overrides(c, args({"--steps"})); }, {"--steps needs a value"});
  expect_config_error([&] { apply_overrides(c, args({"steps=5"})); },
                      {"unexpected argument 'steps=5'", "--flag=value"});
  // A setting another command takes is refused by name.
  expect_config_error([&] { apply_overrides(c, args({"--steps=5"}), kScopePlan); },
                      {"--steps (train.steps) is not a setting of this command"});
  EXPECT_EQ(c, RunConfig{});  // nothing was applied by a failed override
}

TEST(RunConfig, ClosestKey) {
  EXPECT_EQ(closest_run_key("train.seqlen"), "train.seq_len");
  EXPECT_EQ(closest_run_key("cp_size"), "parallel.cp_size");
  EXPECT_EQ(closest_run_key("metrics.pth"), "metrics.path");
  EXPECT_EQ(closest_run_key("comm.timeout_s"), "comm.timeout");
  EXPECT_EQ(closest_run_key("learning_rate"), "train.lr");
  // A key of another table by its name, before any spelling near the table's own keys.
  EXPECT_EQ(closest_run_key("model.lr"), "train.lr");
  EXPECT_EQ(closest_run_key("memory.warmup_steps"), "train.warmup_steps");
  EXPECT_EQ(closest_run_key("train.num_steps"), "train.steps");
  // Nothing near: no suggestion ("zz.a" was asked whether it meant train.lr).
  EXPECT_EQ(closest_run_key("zz.a"), "");
  EXPECT_EQ(closest_run_key("qqqqqqqqqq"), "");
  EXPECT_EQ(closest_run_key("train.max_steps"), "train.steps");
}

TEST(RunConfig, ValidationNamesTheSetting) {
  struct Case {
    const char* flag;
    const char* text;
  };
  const Case cases[] = {
      {"--model=", "is empty"},
      {"--cp-size=-1", "must be in [0, 65536]"},
      {"--method=zigzag", "unknown method 'zigzag'"},
      {"--ulysses-degree=100000", "must be in [0, 65536]"},
      {"--chunks=3", "a knob of fpdt, upipe-fpdt"},
      {"--steps=0", "must be positive"},
      {"--seq-len=1", "[2,"},
      {"--micro-steps=0", ">= 1"},
      {"--lr=-0.1", ">= 0"},
      {"--min-lr-ratio=1.5", "[0, 1]"},
      {"--warmup-steps=-1", ">= 0"},
      {"--weight-decay=-1", ">= 0"},
      {"--beta1=1", "[0, 1)"},
      {"--beta2=-0.5", "[0, 1)"},
      {"--eps=0", "> 0"},
      {"--grad-clip=-1", "0 = no clipping"},
      {"--seed=-3", ">= 0"},
      {"--tile-tokens=0", "[1, 2^30]"},
      {"--data-kind=text", "choose files, random or copy"},
      {"--seq-len=1023", "must be even"},
      {"--checkpoint-interval=-1", ">= 0"},
      {"--checkpoint-keep=0", ">= 1"},
      {"--log-interval=0", ">= 1"},
      {"--progress=fancy", "choose auto, bar or lines"},
      {"--timeout=-1", "0 (no watchdog) or a number of seconds in [0.1, 1e7]"},
      {"--timeout=1e-320", "[0.1, 1e7]"},  // the watchdog fired at once, polling in a busy loop
      {"--timeout=0.05", "[0.1, 1e7]"},
      {"--timeout=1e8", "[0.1, 1e7]"},
      {"--residual-dtype=bf16", "needs --dtype bf16"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.flag);
    const std::vector<std::string> flag = {k.flag};
    expect_config_error([&] { load_run_config("", flag); },
                        {flag[0].substr(0, flag[0].find('=')), k.text});
  }
  // A setting left at its default is named by its flag.
  expect_config_error([] { load_run_config("", args({"--data-kind=files"})); },
                      {"--data-path is required"});
  // Consistent values pass: files with a path, an odd length for random data.
  load_run_config("", args({"--data-kind=files", "--data-path=x.bin"}));
  load_run_config("", args({"--data-kind=random", "--seq-len=1023"}));
  // Plans admit auto knobs and every method; runs refuse them.
  load_run_config("", args({"--stage-heads=auto", "--method=all", "--seq-len=1001"}), kScopePlan);
  expect_config_error([] { load_run_config("", args({"--stage-heads=auto"})); },
                      {"--stage-heads auto is for upipe plan"});
}

// Errors name each setting as it was given: the flag as typed, or the run file's key.
TEST(RunConfig, ErrorsSpellSettingsAsGiven) {
  SpellerGuard guard;
  TempDir d;
  const std::string p = d.write("run.toml", "[train]\nseq_len = 1023\n");
  SettingSources src;
  RunConfig c = read_run_file(p, &src);
  apply_overrides(c, args({"--head-chunk=3", "-S", "1001"}), kScopeTrain, &src);
  set_setting_speller(setting_speller(src));
  EXPECT_EQ(render_setting_refs(setting_ref("parallel.stage_heads")), "--head-chunk");
  EXPECT_EQ(render_setting_refs(setting_value("train.seq_len", 1002)), "-S 1002");
  EXPECT_EQ(render_setting_refs(setting_ref("train.steps")), "--steps");
  SettingSources file_only;
  read_run_file(p, &file_only);
  set_setting_speller(setting_speller(file_only));
  EXPECT_EQ(render_setting_refs(setting_value("train.seq_len", 1024)),
            "train.seq_len = 1024 in " + p);
  expect_config_error([&] { validate(read_run_file(p)); },
                      {"train.seq_len in " + p, "must be even"});
}

TEST(RunConfig, FileThenOverridesThenValidation) {
  const SpellerGuard guard;  // load_run_config installs the file's speller
  TempDir d;
  const std::string p =
      d.write("run.toml", "[train]\nsteps = 10\nlr = 1e-3\n[data]\nkind = \"random\"\n");
  const RunConfig c = load_run_config(p, args({"--steps=20"}));
  EXPECT_EQ(c.train.steps, 20);  // the command line wins
  EXPECT_EQ(c.train.lr, 1e-3);   // the file's value stays
  EXPECT_EQ(c.data.kind, "random");
  expect_config_error([&] { load_run_config(d.file("none.toml")); },
                      {"cannot open run file", "none.toml"});
  expect_config_error([&] { load_run_config(p, args({"--steps=0"})); }, {"--steps"});
}

TEST(RunConfig, PrintedConfigReadsBackTheSame) {
  const RunConfig defaults;
  EXPECT_EQ(parse_run_toml(to_toml(defaults), "printed"), defaults);
  RunConfig c;
  apply_overrides(
      c,
      args({"--model=dir with \"quotes\" and \\ back\tslash", "--lr=0.1", "--eps=1e-300",
            "--device-memory=1536M", "--seed=7", "--offload-stash", "--timeout=2.5",
            "--steps=123456789012", "--dtype=bf16", "--recompute=none", "--stage-heads=auto"}),
      kScopePlan | kScopeTrain);
  const std::string text = to_toml(c);
  EXPECT_EQ(parse_run_toml(text, "printed"), c) << text;
  EXPECT_NE(text.find("[memory]\n"), std::string::npos);
  EXPECT_NE(text.find("device_memory = \"1536M\""), std::string::npos) << text;
  EXPECT_NE(text.find("stage_heads = \"auto\""), std::string::npos) << text;
  EXPECT_NE(text.find("steps = 123456789012"), std::string::npos) << text;
  // Every key is printed, once, with its comment.
  for (const SettingInfo& k : settings()) {
    const std::string leaf = k.key.substr(k.key.find('.') + 1);
    EXPECT_NE(text.find("\n" + leaf + " = "), std::string::npos) << k.key;
    EXPECT_NE(text.find(k.doc), std::string::npos) << k.key;
  }
  // The flags of the changed settings give back the same config.
  const std::string flags = to_flags(c, kScopeTrain | kScopePlan);
  EXPECT_NE(flags.find("--model='dir with"), std::string::npos) << flags;
  RunConfig plain;
  apply_overrides(plain, args({"--lr=0.1", "--offload-stash", "--stage-heads=4"}));
  EXPECT_EQ(to_flags(plain, kScopeTrain), "--stage-heads=4 --lr=0.1 --offload-stash=true");
  EXPECT_EQ(to_flags(plain, kScopeBlock), "--stage-heads=4");
}

TEST(RunConfig, SizesReadAndPrint) {
  EXPECT_EQ(parse_bytes("80G", "x"), int64_t(80) << 30);
  EXPECT_EQ(parse_bytes("1.5g", "x"), int64_t(3) << 29);
  EXPECT_EQ(parse_bytes("512MiB", "x"), int64_t(512) << 20);
  EXPECT_EQ(parse_bytes("4097", "x"), 4097);
  for (int64_t b :
       {int64_t(1), int64_t(4097), int64_t(80) << 30, int64_t(1536) << 20, int64_t(1) << 60})
    EXPECT_EQ(parse_bytes(bytes_text(b), "x"), b) << bytes_text(b);
  EXPECT_EQ(bytes_text(int64_t(80) << 30), "80G");
  EXPECT_EQ(bytes_text(int64_t(1) << 40), "1T");
  // A fraction of a byte is a unit left out, refused (2.7 was read as 2 B); a fraction of a unit
  // is floored to whole bytes.
  expect_config_error([] { parse_bytes("2.7", "--device-memory"); },
                      {"'2.7' is not a whole number of bytes (a unit missing, e.g. 2.7G?)"});
  expect_config_error([] { parse_bytes("1.5b", "x"); }, {"not a whole number of bytes"});
  EXPECT_EQ(parse_bytes("0.3K", "x"), 307);
  EXPECT_EQ(parse_bytes("79.1G", "x"), int64_t(std::floor(79.1 * double(int64_t(1) << 30))));
  // Whole numbers are exact past 2^53 (a double read 2^60 - 1 as 2^60), up to 1 EiB.
  EXPECT_EQ(parse_bytes("1152921504606846975", "x"), (int64_t(1) << 60) - 1);
  EXPECT_EQ(parse_bytes("9007199254740993", "x"), (int64_t(1) << 53) + 1);
  EXPECT_EQ(parse_bytes("1048576T", "x"), int64_t(1) << 60);
  EXPECT_EQ(parse_bytes("0", "x", true), 0);
  for (const char* big : {"1152921504606846977", "1048577T", "99999999999999999999999", "1.1e9"})
    expect_config_error([&] { parse_bytes(big, "x"); },
                        {std::string(big).find('e') == std::string::npos ? "more than 1048576T"
                                                                         : "unknown size unit"});
  expect_config_error([] { parse_bytes("0", "x"); }, {"less than one byte"});
  expect_config_error([] { parse_bytes("1..5G", "x"); }, {"cannot read"});
}

// A memory budget of a number alone below 1 MiB is a unit left out (80 was a budget of 80 B:
// "--reserve (2.00 GiB) must be less than --device-memory (80 B)"); a unit, B included, is taken.
TEST(RunConfig, BudgetWithoutUnitBelowOneMiBIsRefused) {
  RunConfig c;
  expect_config_error(
      [&] {
        apply_overrides(c, args({"--device-memory", "80"}));
      },
      {"--device-memory: 80 is 80 bytes, too small for a memory budget; did you "
       "mean 80G?",
       "80B for bytes"});
  expect_config_error([&] { apply_overrides(c, args({"--host-memory=512"}), kScopePlan); },
                      {"--host-memory: 512 is 512 bytes", "did you mean 512G?"});
  expect_config_error([&] { parse_run_toml("[memory]\ndevice_memory = 80\n", "run.toml"); },
                      {"memory.device_memory: 80 is 80 bytes", "did you mean 80G?"});
  apply_overrides(c, args({"--device-memory=80B", "--host-memory=1K"}), kScopePlan);
  EXPECT_EQ(c.memory.device_bytes, 80);
  EXPECT_EQ(c.memory.host_bytes, 1024);
  apply_overrides(c, args({"--device-memory=1048576", "--device-gib=0.0001"}), kScopePlan);
  EXPECT_EQ(c.memory.device_bytes, int64_t(std::floor(0.0001 * double(int64_t(1) << 30))));
  // Written back with its unit, so a run file of it reads again.
  EXPECT_EQ(bytes_text(4097), "4097B");
  EXPECT_EQ(bytes_text(kMinUnitlessBudget + 1), "1048577");
  apply_overrides(c, args({"--device-memory=1.5K"}), kScopePlan);
  EXPECT_EQ(parse_run_toml(to_toml(c), "to_toml").memory.device_bytes, 1536);
}

// train.time_limit: units, largest first, and SLURM's --time / squeue %L forms; a bare number
// other than 0 is refused (SLURM reads it as minutes, a timeout as seconds); printed back exact.
TEST(RunConfig, DurationsReadAndPrint) {
  const std::pair<const char*, int64_t> read[] = {
      {"0", 0},         {"00", 0},          {"45s", 45},         {"90m", 5400},
      {"3h50m", 13800}, {"1d12h", 129600},  {"1d2h3m4s", 93784}, {"0h", 0},
      {"5:00", 300},    {"3:50:00", 13800}, {"03:50:00", 13800}, {"1-00:00:00", 86400},
      {"2-12", 216000}, {"1-2:30", 95400},  {"0-00:10:30", 630}, {"366d", 366 * 86400},
      {"UNLIMITED", 0}, {"INFINITE", 0}};
  for (const auto& [text, seconds] : read) {
    EXPECT_EQ(parse_duration(text, "x"), seconds) << text;
    EXPECT_EQ(parse_duration(duration_text(seconds), "x"), seconds) << text;
  }
  EXPECT_EQ(duration_text(13800), "3h50m");
  EXPECT_EQ(duration_text(93784), "1d2h3m4s");
  EXPECT_EQ(duration_text(0), "0");
  expect_config_error([] { parse_duration("240", "--time-limit"); },
                      {"--time-limit: '240' has no unit: write 240s, 240m or 240h"});
  for (const char* bad : {"", "3m50h", "3h3h", "h", "3x", "1.5h", "-1h", "1:60", "1:2:3:4", "a-1",
                          "1-", ":5", "5:", "1d-3", "9999999999s", "367d", "1-1:1:1:1"})
    expect_config_error([&] { parse_duration(bad, "x"); }, {"x: '"});
  // In a run file: a string or 0; printed as it reads back.
  RunConfig c = parse_run_toml("[train]\ntime_limit = \"3:50:00\"\n", "r.toml");
  EXPECT_EQ(c.train.time_limit_s, 13800);
  EXPECT_NE(to_toml(c).find("time_limit = \"3h50m\""), std::string::npos) << to_toml(c);
  EXPECT_EQ(parse_run_toml("[train]\ntime_limit = 0\n", "r.toml").train.time_limit_s, 0);
  expect_config_error([] { parse_run_toml("[train]\ntime_limit = 240\n", "r.toml"); },
                      {"r.toml:2:", "has no unit"});
  expect_config_error([] { parse_run_toml("[train]\ntime_limit = 1.5\n", "r.toml"); },
                      {"r.toml:2:", "must be a duration"});
}

// A run records its paths absolute (its checkpoint resumes and exports from anywhere): relative
// ones are taken from the working directory, normalised; a preset's name, an empty path and the
// settings `which` leaves out stay as they are. A trailing slash goes (a resume typed `dset/` for
// the recorded `dset` was refused as a changed data path).
TEST(RunConfig, PathsAreMadeAbsolute) {
  TempDir d;
  std::filesystem::create_directories(d.file("hf"));
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(d.path());
  RunConfig c;
  c.model.name = "./hf/";
  c.model.init_from = "hf";
  c.data.path = "data/../x.bin";
  c.data.val_path = "";
  c.checkpoint.dir = "ck";
  c.metrics.path = "/abs/m.jsonl";
  RunConfig preset = c;
  preset.model.name = "tiny";
  make_paths_absolute(c, [](std::string_view) { return true; });
  make_paths_absolute(preset, [](std::string_view k) { return k != "data.path"; });
  std::filesystem::current_path(cwd);
  const std::string root = std::filesystem::path(d.path()).lexically_normal().string();
  EXPECT_EQ(c.model.name, root + "/hf");  // a trailing slash is the same directory
  EXPECT_EQ(c.model.init_from, root + "/hf");
  EXPECT_EQ(c.data.path, root + "/x.bin");
  EXPECT_EQ(c.data.val_path, "");
  EXPECT_EQ(c.checkpoint.dir, root + "/ck");
  EXPECT_EQ(c.metrics.path, "/abs/m.jsonl");
  EXPECT_EQ(preset.model.name, "tiny");          // a preset, not a path
  EXPECT_EQ(preset.data.path, "data/../x.bin");  // left out by `which`
  EXPECT_EQ(preset.checkpoint.dir, root + "/ck");
}

TEST(RunConfig, TableFollowsTheSpellingConvention) {
  const auto& keys = settings();
  ASSERT_EQ(keys.size(), 45u);
  EXPECT_EQ(keys.front().key, "model.name");
  EXPECT_EQ(keys.front().type, "string");
  EXPECT_EQ(keys.front().default_value, "\"tiny\"");
  std::set<std::string> names;
  for (const SettingInfo& k : keys) {
    SCOPED_TRACE(k.key);
    // --name with '-' for '_', or the section and the name; model.name is --model.
    const std::string section = k.key.substr(0, k.key.find('.'));
    std::string name = k.key.substr(k.key.find('.') + 1);
    std::replace(name.begin(), name.end(), '_', '-');
    EXPECT_TRUE(k.flag == "--" + name || k.flag == "--" + section + "-" + name ||
                (k.key == "model.name" && k.flag == "--model"))
        << k.flag;
    for (const std::string& n : [&] {
           std::vector<std::string> v{k.key, k.flag};
           if (!k.short_flag.empty()) v.push_back(k.short_flag);
           for (const std::string& a : k.aliases) v.push_back(a);
           return v;
         }())
      EXPECT_TRUE(names.insert(n).second) << n << " names two settings";
    EXPECT_NE(k.scopes, 0u);
    EXPECT_EQ(find_setting(k.flag), &k);
  }
  auto find = [&](const std::string& name) { return *find_setting(name); };
  EXPECT_EQ(find("train.lr").default_value, "0.0003");
  EXPECT_EQ(find("--lr").type, "float");
  EXPECT_EQ(find("-S").key, "train.seq_len");
  EXPECT_EQ(find("--head-chunk").key, "parallel.stage_heads");
  EXPECT_EQ(find("comm.timeout").default_value, "600.0");
  EXPECT_EQ(find("memory.offload_stash").default_value, "false");
  EXPECT_EQ(find("memory.device_memory").default_value, "\"1T\"");
  EXPECT_EQ(find("data.path").default_value, "\"\"");
  EXPECT_EQ(find_setting("--no-such-flag"), nullptr);
}

// docs/training.md's "Run file" section has a row for every setting with its flag, type and
// default.
TEST(RunConfig, DocsListEverySetting) {
  std::ifstream f(std::string(UPIPE_SOURCE_DIR) + "/docs/training.md");
  ASSERT_TRUE(f) << "docs/training.md";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  const size_t begin = doc.find("## Run file");
  ASSERT_NE(begin, std::string::npos);
  const std::string section = doc.substr(begin, doc.find("\n## ", begin + 1) - begin);
  for (const SettingInfo& k : settings()) {
    const std::string row =
        "| `" + k.key + "` | `" + k.flag + "` | " + k.type + " | `" + k.default_value + "` |";
    EXPECT_NE(section.find(row), std::string::npos) << "missing row: " << row;
  }
}

// Valid runs that may not mean what they say are warned about, naming the settings.
TEST(RunConfig, WarningsForContextAndWarmup) {
  RunConfig c;
  ModelConfig m = model_preset("tiny");
  m.max_position_embeddings = 4096;
  c.train.seq_len = 4096;
  c.train.warmup_steps = 10;
  c.train.steps = 11;
  EXPECT_TRUE(run_warnings(c, m).empty());
  c.train.seq_len = 4098;
  c.train.warmup_steps = 11;
  const std::vector<std::string> w = run_warnings(c, m);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_NE(render_setting_refs(w[0]).find("--seq-len 4098 is longer than the model's context "
                                           "(max_position_embeddings = 4096"),
            std::string::npos)
      << w[0];
  EXPECT_NE(render_setting_refs(w[1]).find("--warmup-steps 11 is as long as the run (--steps 11): "
                                           "the learning rate reaches --lr 0.0003 only at the "
                                           "last step and never decays"),
            std::string::npos)
      << w[1];
  c.train.warmup_steps = 12;
  EXPECT_NE(render_setting_refs(run_warnings(c, m)[1])
                .find("--warmup-steps 12 is longer than the run (--steps 11): the learning rate "
                      "never reaches --lr 0.0003 and never decays"),
            std::string::npos);
  c.train.warmup_steps = 11;
  m.max_position_embeddings = 0;  // a config without the field: nothing to compare with
  EXPECT_EQ(run_warnings(c, m).size(), 1u);
}

TEST(RunConfig, PeakFlopsMustBeFiniteAndNonNegative) {
  RunConfig c;
  c.metrics.peak_flops = -1;
  expect_config_error([&] { validate(c, kScopeTrain); }, {"--peak-flops", ">= 0"});
  c.metrics.peak_flops = INFINITY;
  expect_config_error([&] { validate(c, kScopeTrain); }, {"--peak-flops", "finite"});
  c.metrics.peak_flops = 989e12;
  validate(c, kScopeTrain);
}

// The one edit distance behind every "did you mean" (commands, settings, run-file keys).
TEST(Spelling, EditDistanceAndNearestName) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("train", "train"), 0u);
  EXPECT_EQ(edit_distance("trian", "train"), 2u);  // a swap is two edits
  EXPECT_EQ(edit_distance("kernl", "kernel"), 1u);
  EXPECT_EQ(edit_distance("", "plan"), 4u);
  const std::vector<std::string> commands{"demo", "bench", "train", "export", "plan"};
  EXPECT_EQ(closest_name("trian", commands), "train");
  EXPECT_EQ(closest_name("plna", commands), "plan");
  EXPECT_EQ(closest_name("x", std::vector<std::string>{}), "");
  EXPECT_EQ(closest_name("dem", std::vector<std::string>{"demo", "dem0"}),
            "demo");  // first of equals
}

// A command's likely name: one typed begins, else one it abbreviates, else a near misspelling.
TEST(Spelling, LikelyCommandName) {
  const std::vector<std::string> bench{"kernel", "attention", "comm", "ops", "model"};
  EXPECT_EQ(likely_name("attn", bench), "attention");  // comm is nearer by edit distance
  EXPECT_EQ(likely_name("att", bench), "attention");
  EXPECT_EQ(likely_name("atention", bench), "attention");
  EXPECT_EQ(likely_name("kernl", bench), "kernel");
  EXPECT_EQ(likely_name("mdl", bench), "model");
  EXPECT_EQ(likely_name("co", bench), "comm");
  EXPECT_EQ(likely_name("xyz", bench), "");  // nothing near: no guess
  EXPECT_EQ(likely_name("tn", bench), "");   // an abbreviation begins as its name does
  const std::vector<std::string> top{"demo", "bench", "train", "export", "plan"};
  EXPECT_EQ(likely_name("trian", top), "train");
  EXPECT_EQ(likely_name("plna", top), "plan");
}

}  // namespace
}  // namespace upipe
