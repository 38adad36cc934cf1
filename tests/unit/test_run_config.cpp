// The run file: defaults, TOML parsing, --section.key overrides, every refusal as a one-line
// ConfigError naming the file / flag and the key (with a "did you mean" for unknown keys),
// validation per key, the printed-back config reading back to the same config, and
// docs/training.md documenting every key.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "train/run_config.h"
#include "unit/expect_config_error.h"
#include "unit/temp_dir.h"

namespace upipe {
namespace {

std::vector<std::string> args(std::initializer_list<const char*> a) {
  return {a.begin(), a.end()};
}

TEST(RunConfig, DefaultsAreValidAndRunWithoutAFile) {
  const RunConfig c = load_run_config("");
  EXPECT_EQ(c, RunConfig{});
  EXPECT_EQ(c.model.name, "tiny");
  EXPECT_EQ(c.parallel.method, "upipe");
  EXPECT_EQ(c.parallel.cp_size, 0);
  EXPECT_EQ(c.comm.timeout_s, 600);
  EXPECT_EQ(c.data.kind, "copy");
  EXPECT_EQ(c.budget_bytes(), int64_t(1024) << 30);
  EXPECT_DOUBLE_EQ(c.min_lr(), 3e-5);
}

TEST(RunConfig, ParsesEverySectionFromToml) {
  const RunConfig c = parse_run_toml(R"(
[model]
name = "llama3-8b"
init_from = "/ckpt/hf"
[parallel]
cp_size = 4
method = "ring"
head_chunk = 8
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
dtype = "bf16"
tile_tokens = 2048
offload_checkpoints = true
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
[memory]
budget_gib = 80
[comm]
timeout_s = 30.5
)",
                                     "run.toml");
  EXPECT_EQ(c.model.name, "llama3-8b");
  EXPECT_EQ(c.model.init_from, "/ckpt/hf");
  EXPECT_EQ(c.parallel.cp_size, 4);
  EXPECT_EQ(c.parallel.method, "ring");
  EXPECT_EQ(c.parallel.head_chunk, 8);
  EXPECT_EQ(c.parallel.ulysses_degree, 2);
  EXPECT_EQ(c.parallel.chunks, 3);
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
  EXPECT_EQ(c.train.dtype, "bf16");
  EXPECT_EQ(c.train.tile_tokens, 2048);
  EXPECT_TRUE(c.train.offload_checkpoints);
  EXPECT_EQ(c.data.kind, "files");
  EXPECT_EQ(c.data.path, "/data/*.bin");
  EXPECT_EQ(c.checkpoint.dir, "ckpt");
  EXPECT_EQ(c.checkpoint.interval, 500);
  EXPECT_EQ(c.checkpoint.keep, 2);
  EXPECT_EQ(c.metrics.path, "m.jsonl");
  EXPECT_EQ(c.metrics.log_interval, 10);
  EXPECT_EQ(c.metrics.progress, "lines");
  EXPECT_EQ(c.memory.budget_gib, 80.0);  // an integer is accepted for a float key
  EXPECT_EQ(c.comm.timeout_s, 30.5);
  EXPECT_EQ(c.budget_bytes(), int64_t(80) << 30);
  validate(c);
  // Dotted keys are the same tables.
  EXPECT_EQ(parse_run_toml("train.steps = 7\nmodel.name = \"qwen3-8b\"", "d.toml").train.steps, 7);
}

TEST(RunConfig, TomlErrorsNameFileLineAndKey) {
  expect_config_error([] { parse_run_toml("[train]\nsteps = \"abc\"\n", "run.toml"); },
                      {"run.toml:2:", "train.steps must be an integer", "string"});
  expect_config_error([] { parse_run_toml("[train]\nlr = \"fast\"\n", "run.toml"); },
                      {"run.toml:2:", "train.lr must be a number"});
  expect_config_error([] { parse_run_toml("[train]\nsteps = 1.5\n", "r.toml"); },
                      {"r.toml:2:", "train.steps must be an integer", "floating"});
  expect_config_error([] { parse_run_toml("[train]\noffload_checkpoints = 1\n", "r.toml"); },
                      {"train.offload_checkpoints must be true or false"});
  expect_config_error([] { parse_run_toml("[parallel]\ncp_size = 5000000000\n", "r.toml"); },
                      {"r.toml:2:", "parallel.cp_size", "out of range"});
  expect_config_error([] { parse_run_toml("[train]\nlearning_rate = 1e-3\n", "r.toml"); },
                      {"r.toml:2:", "unknown key 'train.learning_rate'", "did you mean"});
  expect_config_error([] { parse_run_toml("[train]\nwarmup = 10\n", "r.toml"); },
                      {"unknown key 'train.warmup'", "'train.warmup_steps'"});
  expect_config_error([] { parse_run_toml("[trian]\nsteps = 10\n", "r.toml"); },
                      {"unknown key 'trian.steps'", "'train.steps'"});
  expect_config_error([] { parse_run_toml("steps = 10\n", "r.toml"); },
                      {"r.toml:1:", "'steps' is not a [section]", "'train.steps'"});
  expect_config_error([] { parse_run_toml("[train]\nsteps = \n", "bad.toml"); }, {"bad.toml:2:"});
}

TEST(RunConfig, Int64KeysTakeLargeValues) {
  EXPECT_EQ(parse_run_toml("[train]\nsteps = 5000000000\n", "r").train.steps, 5000000000);
}

TEST(RunConfig, OverridesBothFormsAndTypes) {
  RunConfig c;
  apply_overrides(c, args({"--train.lr=1e-3", "--train.steps", "250", "--model.name=qwen3-8b",
                           "--train.offload_checkpoints=true", "--memory.budget_gib", "0.5",
                           "--data.path=a=b.bin"}));
  EXPECT_EQ(c.train.lr, 1e-3);
  EXPECT_EQ(c.train.steps, 250);
  EXPECT_EQ(c.model.name, "qwen3-8b");
  EXPECT_TRUE(c.train.offload_checkpoints);
  EXPECT_EQ(c.memory.budget_gib, 0.5);
  EXPECT_EQ(c.data.path, "a=b.bin");  // only the first '=' splits
  apply_override(c, "train.offload_checkpoints", "0");
  EXPECT_FALSE(c.train.offload_checkpoints);
}

TEST(RunConfig, OverrideErrorsNameTheKey) {
  RunConfig c;
  expect_config_error([&] { apply_overrides(c, args({"--train.steps=abc"})); },
                      {"--train.steps", "'abc' is not an integer"});
  expect_config_error([&] { apply_overrides(c, args({"--train.steps=12x"})); },
                      {"--train.steps", "'12x'"});
  expect_config_error([&] { apply_overrides(c, args({"--train.steps="})); },
                      {"--train.steps", "is not an integer"});
  expect_config_error([&] { apply_overrides(c, args({"--train.lr=fast"})); },
                      {"--train.lr", "not a finite number"});
  expect_config_error([&] { apply_overrides(c, args({"--train.lr=nan"})); },
                      {"--train.lr", "not a finite number"});
  expect_config_error([&] { apply_overrides(c, args({"--train.offload_checkpoints=yes"})); },
                      {"--train.offload_checkpoints", "not true or false"});
  expect_config_error([&] { apply_overrides(c, args({"--parallel.head_chunk=99999999999"})); },
                      {"parallel.head_chunk", "out of range"});
  expect_config_error([&] { apply_overrides(c, args({"--train.setps=5"})); },
                      {"unknown key 'train.setps'", "did you mean 'train.steps'"});
  expect_config_error([&] { apply_overrides(c, args({"--lr=5"})); },
                      {"unknown key 'lr'", "did you mean 'train.lr'"});
  expect_config_error([&] { apply_overrides(c, args({"--train.steps"})); },
                      {"--train.steps needs a value"});
  expect_config_error([&] { apply_overrides(c, args({"--train.stepz"})); },
                      {"unknown key 'train.stepz'", "'train.steps'"});
  expect_config_error([&] { apply_overrides(c, args({"steps=5"})); },
                      {"unexpected argument 'steps=5'", "--section.key=value"});
  EXPECT_EQ(c, RunConfig{});  // nothing was applied by a failed override
}

TEST(RunConfig, ClosestKey) {
  EXPECT_EQ(closest_run_key("train.seqlen"), "train.seq_len");
  EXPECT_EQ(closest_run_key("cp_size"), "parallel.cp_size");
  EXPECT_EQ(closest_run_key("metrics.pth"), "metrics.path");
  EXPECT_EQ(closest_run_key("comm.timeout"), "comm.timeout_s");
}

TEST(RunConfig, ValidationNamesTheKey) {
  struct Case {
    const char* override_arg;
    const char* key;
    const char* text;
  };
  const Case cases[] = {
      {"--model.name=", "model.name", "is empty"},
      {"--parallel.cp_size=-1", "parallel.cp_size", ">= 0"},
      {"--parallel.method=zigzag", "parallel.method", "'zigzag' is unknown"},
      {"--parallel.head_chunk=-2", "parallel.head_chunk", ">= 0"},
      {"--parallel.ulysses_degree=-2", "parallel.ulysses_degree", ">= 0"},
      {"--parallel.chunks=-2", "parallel.chunks", ">= 0"},
      {"--train.steps=0", "train.steps", "must be positive"},
      {"--train.seq_len=1", "train.seq_len", "[2,"},
      {"--train.micro_steps=0", "train.micro_steps", ">= 1"},
      {"--train.lr=-0.1", "train.lr", ">= 0"},
      {"--train.min_lr_ratio=1.5", "train.min_lr_ratio", "[0, 1]"},
      {"--train.warmup_steps=-1", "train.warmup_steps", ">= 0"},
      {"--train.weight_decay=-1", "train.weight_decay", ">= 0"},
      {"--train.beta1=1", "train.beta1", "[0, 1)"},
      {"--train.beta2=-0.5", "train.beta2", "[0, 1)"},
      {"--train.eps=0", "train.eps", "> 0"},
      {"--train.grad_clip=-1", "train.grad_clip", "0 = no clipping"},
      {"--train.seed=-3", "train.seed", ">= 0"},
      {"--train.dtype=fp16", "train.dtype", "choose fp32 or bf16"},
      {"--train.tile_tokens=0", "train.tile_tokens", "[1, 2^30]"},
      {"--data.kind=text", "data.kind", "choose files, random or copy"},
      {"--data.kind=files", "data.path", "is required"},
      {"--train.seq_len=1023", "train.seq_len", "must be even"},
      {"--checkpoint.interval=-1", "checkpoint.interval", ">= 0"},
      {"--checkpoint.keep=0", "checkpoint.keep", ">= 1"},
      {"--metrics.log_interval=0", "metrics.log_interval", ">= 1"},
      {"--metrics.progress=fancy", "metrics.progress", "choose auto, bar or lines"},
      {"--memory.budget_gib=0", "memory.budget_gib", "at least one byte"},
      {"--memory.budget_gib=1e12", "memory.budget_gib", "1 EiB"},
      {"--comm.timeout_s=-1", "comm.timeout_s", ">= 0"},
      {"--train.checkpoint_dtype=fp16", "train.checkpoint_dtype", "choose fp32 or bf16"},
      {"--train.residual_dtype=fp16", "train.residual_dtype", "choose fp32 or bf16"},
      {"--train.checkpoint_granularity=op", "train.checkpoint_granularity", "choose layer, block or none"},
      {"--train.residual_dtype=bf16", "train.residual_dtype", "needs train.dtype = bf16"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.override_arg);
    const std::vector<std::string> a = {k.override_arg};
    expect_config_error([&] { load_run_config("", a); },
                        {k.key, k.text, std::string("--") + k.key + "=VALUE"});
  }
  // Consistent values pass: files with a path, an odd length for random data.
  load_run_config("", args({"--data.kind=files", "--data.path=x.bin"}));
  load_run_config("", args({"--data.kind=random", "--train.seq_len=1023"}));
}

TEST(RunConfig, FileThenOverridesThenValidation) {
  TempDir d;
  const std::string p =
      d.write("run.toml", "[train]\nsteps = 10\nlr = 1e-3\n[data]\nkind = \"random\"\n");
  const RunConfig c = load_run_config(p, args({"--train.steps=20"}));
  EXPECT_EQ(c.train.steps, 20);  // the command line wins
  EXPECT_EQ(c.train.lr, 1e-3);   // the file's value stays
  EXPECT_EQ(c.data.kind, "random");
  expect_config_error([&] { load_run_config(d.file("none.toml")); },
                      {"cannot open run file", "none.toml"});
  expect_config_error([&] { load_run_config(p, args({"--train.steps=0"})); }, {"train.steps"});
}

TEST(RunConfig, PrintedConfigReadsBackTheSame) {
  const RunConfig defaults;
  EXPECT_EQ(parse_run_toml(to_toml(defaults), "printed"), defaults);
  RunConfig c;
  apply_overrides(c, args({"--model.name=dir with \"quotes\" and \\ back\tslash", "--train.lr=0.1",
                           "--train.eps=1e-300", "--memory.budget_gib=1024", "--train.seed=7",
                           "--train.offload_checkpoints=true", "--comm.timeout_s=2.5",
                           "--train.steps=123456789012"}));
  const std::string text = to_toml(c);
  EXPECT_EQ(parse_run_toml(text, "printed"), c) << text;
  EXPECT_NE(text.find("[train]\n"), std::string::npos);
  EXPECT_NE(text.find("budget_gib = 1024.0"), std::string::npos) << text;
  EXPECT_NE(text.find("steps = 123456789012"), std::string::npos) << text;
  // Every key is printed, once, with its comment.
  for (const RunKeyInfo& k : run_config_keys()) {
    const std::string leaf = k.name.substr(k.name.find('.') + 1);
    EXPECT_NE(text.find("\n" + leaf + " = "), std::string::npos) << k.name;
    EXPECT_NE(text.find(k.doc), std::string::npos) << k.name;
  }
}

TEST(RunConfig, KeyTableMatchesTheStruct) {
  const auto& keys = run_config_keys();
  ASSERT_EQ(keys.size(), 35u);
  EXPECT_EQ(keys.front().name, "model.name");
  EXPECT_EQ(keys.front().type, "string");
  EXPECT_EQ(keys.front().default_value, "\"tiny\"");
  auto find = [&](const std::string& name) {
    for (const RunKeyInfo& k : keys)
      if (k.name == name) return k;
    ADD_FAILURE() << name;
    return RunKeyInfo{};
  };
  EXPECT_EQ(find("train.lr").default_value, "0.0003");
  EXPECT_EQ(find("train.lr").type, "float");
  EXPECT_EQ(find("train.steps").type, "int");
  EXPECT_EQ(find("comm.timeout_s").default_value, "600.0");
  EXPECT_EQ(find("train.offload_checkpoints").default_value, "false");
  EXPECT_EQ(find("data.path").default_value, "\"\"");
}

// docs/training.md's "Run file" section has a row for every key with its type and default.
TEST(RunConfig, DocsListEveryKey) {
  std::ifstream f(std::string(UPIPE_SOURCE_DIR) + "/docs/training.md");
  ASSERT_TRUE(f) << "docs/training.md";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  const size_t begin = doc.find("## Run file");
  ASSERT_NE(begin, std::string::npos);
  const std::string section = doc.substr(begin, doc.find("\n## ", begin + 1) - begin);
  for (const RunKeyInfo& k : run_config_keys()) {
    const std::string row = "| `" + k.name + "` | " + k.type + " | `" + k.default_value + "` |";
    EXPECT_NE(section.find(row), std::string::npos) << "missing row: " << row;
  }
}

}  // namespace
}  // namespace upipe
