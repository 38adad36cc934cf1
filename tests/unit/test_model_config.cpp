// ModelConfig from Hugging Face config.json (both RoPE forms), presets and their parameter
// counts, the HF tensor names and shapes, the AttentionConfig mapping, and every refusal as a
// one-line ConfigError naming the file and the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "model/config.h"
#include "model/hf_names.h"
#include "unit/temp_dir.h"

namespace upipe {
namespace {

// A Llama-3.1-8B-shaped config.json with the fields of `extra` (", key: value, ...") set on top
// (a key of extra replaces the base's: a config.json may not give a key twice).
std::string llama_json(const std::string& extra = "") {
  nlohmann::json j = nlohmann::json::parse(
      R"({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
          "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
          "vocab_size": 128256, "rms_norm_eps": 1e-05, "rope_theta": 500000.0})");
  if (!extra.empty()) j.update(nlohmann::json::parse("{" + extra.substr(1) + "}"));
  return j.dump();
}

// Expects a ConfigError of one line containing every one of `parts`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no ConfigError; expected one containing '" << parts.front() << "'";
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
  }
}

TEST(ModelConfig, HubRopeScalingLlama3) {
  ModelConfig m =
      parse_model_config(llama_json(R"(, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
                    "rope_type": "llama3"}, "torch_dtype": "bfloat16",
                    "max_position_embeddings": 131072)"),
                         "a/config.json");
  EXPECT_EQ(m.family, ModelFamily::kLlama);
  EXPECT_EQ(m.head_dim, 128);  // hidden / heads when absent
  EXPECT_FALSE(m.qk_norm);
  EXPECT_EQ(m.rope.theta, 500000.0);
  EXPECT_TRUE(m.rope.scaling.enabled);
  EXPECT_EQ(m.rope.scaling.factor, 8.0);
  EXPECT_EQ(m.rope.scaling.low_freq_factor, 1.0);
  EXPECT_EQ(m.rope.scaling.high_freq_factor, 4.0);
  EXPECT_EQ(m.rope.scaling.original_max_position, 8192);
  EXPECT_EQ(m.max_position_embeddings, 131072);
  EXPECT_EQ(m.torch_dtype, "bfloat16");
  EXPECT_EQ(m.rms_norm_eps, 1e-5);
  EXPECT_EQ(m.source, "a/config.json");
}

TEST(ModelConfig, HubRopeScalingOldTypeKeyAndNull) {
  ModelConfig m = parse_model_config(
      llama_json(R"(, "rope_scaling": {"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
      "b");
  EXPECT_TRUE(m.rope.scaling.enabled);
  EXPECT_EQ(m.rope.scaling.factor, 32.0);
  ModelConfig n = parse_model_config(llama_json(R"(, "rope_scaling": null)"), "c");
  EXPECT_FALSE(n.rope.scaling.enabled);
  EXPECT_EQ(n.rope.theta, 500000.0);
  ModelConfig d =
      parse_model_config(llama_json(R"(, "rope_scaling": {"rope_type": "default"})"), "d");
  EXPECT_FALSE(d.rope.scaling.enabled);
}

TEST(ModelConfig, Transformers5RopeParameters) {
  // transformers 5 writes rope_parameters and dtype instead of rope_theta/rope_scaling and
  // torch_dtype.
  std::string base = R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 256, "dtype": "float32", )";
  ModelConfig m = parse_model_config(
      base + R"("rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
                "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}})",
      "t5");
  EXPECT_EQ(m.rope.theta, 500000.0);
  EXPECT_TRUE(m.rope.scaling.enabled);
  EXPECT_EQ(m.rope.scaling.factor, 8.0);
  EXPECT_EQ(m.torch_dtype, "float32");
  EXPECT_EQ(m.rms_norm_eps, 1e-6);  // transformers' default

  ModelConfig q = parse_model_config(
      R"({"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
          "rope_parameters": {"rope_type": "default", "rope_theta": 1000000}})",
      "q5");
  EXPECT_EQ(q.rope.theta, 1e6);
  EXPECT_FALSE(q.rope.scaling.enabled);
  EXPECT_TRUE(q.qk_norm);
  EXPECT_EQ(q.num_key_value_heads, 4);  // defaults to the query heads
  EXPECT_EQ(q.head_dim, 128);           // Qwen3Config's default, not hidden / heads
}

TEST(ModelConfig, LoadFromDirectoryFileOrPreset) {
  TempDir dir;
  dir.write("config.json", llama_json(R"(, "head_dim": 64, "tie_word_embeddings": true)"));
  ModelConfig a = load_model_config(dir.path().string());
  ModelConfig b = load_model_config(dir.file("config.json"));
  EXPECT_EQ(a.head_dim, 64);
  EXPECT_TRUE(a.tie_word_embeddings);
  EXPECT_EQ(a.source, dir.file("config.json"));
  EXPECT_EQ(b.hidden_size, 4096);
  ModelConfig p = load_model_config("qwen3-32b");
  EXPECT_EQ(p.source, "preset qwen3-32b");
  EXPECT_EQ(p.hidden_size, 5120);
  EXPECT_EQ(p.q_dim(), 8192);  // D != H*d
}

TEST(ModelConfig, PresetShapesAndParameterCounts) {
  for (const std::string& name : model_preset_names()) {
    ModelConfig m = model_preset(name);
    int64_t sum = 0;
    for (const HfTensorSpec& t : hf_tensors(m)) sum += t.numel();
    EXPECT_EQ(sum, parameter_count(m)) << name;
  }
  // Published sizes: Llama-3-8B 8.03B, Llama-3-70B 70.6B, Qwen3-8B 8.19B, Qwen3-32B 32.8B.
  EXPECT_EQ(parameter_count(model_preset("llama3-8b")), 8030261248);
  EXPECT_EQ(parameter_count(model_preset("llama3.1-8b")), 8030261248);
  EXPECT_EQ(parameter_count(model_preset("llama3-70b")), 70553706496);
  EXPECT_EQ(parameter_count(model_preset("qwen3-8b")), 8190735360);
  EXPECT_EQ(parameter_count(model_preset("qwen3-32b")), 32762123264);

  ModelConfig l31 = model_preset("llama3.1-8b");
  EXPECT_TRUE(l31.rope.scaling.enabled);
  EXPECT_EQ(l31.rope.scaling.factor, 8.0);
  EXPECT_FALSE(model_preset("llama3-8b").rope.scaling.enabled);
  ModelConfig q = model_preset("qwen3-8b");
  EXPECT_EQ(q.rope.theta, 1e6);
  EXPECT_EQ(q.rms_norm_eps, 1e-6);
  EXPECT_TRUE(q.qk_norm);
  ModelConfig t = model_preset("tiny");
  EXPECT_EQ(t.hidden_size, 64);
  EXPECT_EQ(t.head_dim, 16);
  EXPECT_EQ(t.num_key_value_heads, 2);
}

TEST(ModelConfig, AttentionConfigMapping) {
  ModelConfig m = model_preset("qwen3-32b");
  AttentionConfig a = to_attention_config(m);
  EXPECT_EQ(a.heads, 64);
  EXPECT_EQ(a.kv_heads, 8);
  EXPECT_EQ(a.head_dim, 128);
  EXPECT_EQ(a.model_dim(), 5120);
  EXPECT_EQ(a.q_dim(), 8192);
  EXPECT_TRUE(a.qk_norm);
  EXPECT_FLOAT_EQ(a.norm_eps, 1e-6f);
  EXPECT_EQ(a.rope.theta, 1e6);
  a.seq_len = 1024;
  EXPECT_NO_THROW(a.validate_shape());
  AttentionConfig l = to_attention_config(model_preset("llama3.1-8b"));
  EXPECT_FALSE(l.qk_norm);
  EXPECT_TRUE(l.rope.scaling.enabled);
  EXPECT_EQ(l.rope.scaling.original_max_position, 8192);
}

TEST(HfNames, NamesAndShapes) {
  ModelConfig q = model_preset("qwen3-32b");
  std::vector<HfTensorSpec> layer = hf_layer_tensors(q, 3);
  ASSERT_EQ(layer.size(), 11u);
  EXPECT_EQ(layer[0].name, "model.layers.3.input_layernorm.weight");
  HfTensorSpec qp = hf_layer_tensor(q, 3, LayerWeight::kQ);
  EXPECT_EQ(qp.name, "model.layers.3.self_attn.q_proj.weight");
  EXPECT_EQ(qp.shape, (std::vector<int64_t>{8192, 5120}));
  EXPECT_EQ(hf_layer_tensor(q, 0, LayerWeight::kK).shape, (std::vector<int64_t>{1024, 5120}));
  EXPECT_EQ(hf_layer_tensor(q, 0, LayerWeight::kO).shape, (std::vector<int64_t>{5120, 8192}));
  EXPECT_EQ(hf_layer_tensor(q, 0, LayerWeight::kQNorm).name,
            "model.layers.0.self_attn.q_norm.weight");
  EXPECT_EQ(hf_layer_tensor(q, 0, LayerWeight::kKNorm).shape, (std::vector<int64_t>{128}));
  EXPECT_EQ(hf_layer_tensor(q, 63, LayerWeight::kDown).shape, (std::vector<int64_t>{5120, 25600}));
  EXPECT_EQ(hf_layer_tensor(q, 0, LayerWeight::kGate).name, "model.layers.0.mlp.gate_proj.weight");

  ModelConfig l = model_preset("llama3-8b");
  EXPECT_EQ(hf_layer_tensors(l, 0).size(), 9u);  // no QK-norm
  std::vector<HfTensorSpec> all = hf_tensors(l);
  EXPECT_EQ(all.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(all.front().shape, (std::vector<int64_t>{128256, 4096}));
  EXPECT_EQ(all[all.size() - 2].name, "model.norm.weight");
  EXPECT_EQ(all.back().name, "lm_head.weight");
  EXPECT_EQ(all.size(), 1 + 32 * 9 + 2u);

  ModelConfig tied = model_preset("tiny-qwen3");
  EXPECT_EQ(hf_tensors(tied).back().name, "model.norm.weight");
  expect_error([&] { hf_model_tensor(tied, ModelWeight::kLmHead); },
               {"preset tiny-qwen3", "tie_word_embeddings"});
  expect_error([&] { hf_layer_tensor(l, 0, LayerWeight::kQNorm); }, {"llama", "q_norm"});
  expect_error([&] { hf_layer_tensor(l, 32, LayerWeight::kQ); }, {"layer 32 out of range"});
}

TEST(ModelConfig, RefusalsNameFileAndField) {
  auto parse = [](const std::string& text) {
    return [text] { parse_model_config(text, "m/config.json"); };
  };
  std::string ok = llama_json();
  auto with = [&](const std::string& extra) { return parse(llama_json(extra)); };
  std::string f = "m/config.json";
  expect_error(with(R"(, "model_type": "mistral")"), {f, "'model_type'", "mistral", "llama"});
  expect_error(parse(R"({"hidden_size": 64})"), {f, "'model_type' is missing"});
  expect_error(parse(R"({"model_type": "llama", "hidden_size": 64, "hidden_size": 128})"),
               {f, "duplicate key 'hidden_size'"});
  expect_error(with(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0})"),
               {f, "'rope_scaling.rope_type'", "yarn", "not supported"});
  expect_error(with(R"(, "rope_scaling": {"type": "dynamic", "factor": 2.0})"),
               {f, "'rope_scaling.type'", "dynamic"});
  expect_error(with(R"(, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6})"),
               {f, "'rope_parameters.rope_type'", "yarn"});
  // rope_parameters without its own rope_theta: the top-level one, else transformers' 10000.
  EXPECT_EQ(parse_model_config(llama_json(R"(, "rope_parameters": {"rope_type": "default"})"), f)
                .rope.theta,
            500000.0);
  EXPECT_EQ(
      parse_model_config(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                   "num_hidden_layers": 2, "num_attention_heads": 4,
                                   "vocab_size": 256, "rope_parameters": {"rope_type": "default"}})",
                         f)
          .rope.theta,
      10000.0);
  // What transformers reads alike: swish is SiLU; a whole number written as a float.
  EXPECT_NO_THROW(parse_model_config(llama_json(R"(, "hidden_act": "swish")"), f));
  EXPECT_EQ(parse_model_config(llama_json(R"(, "num_hidden_layers": 4.0)"), f).num_hidden_layers,
            4);
  expect_error(with(R"(, "num_hidden_layers": 4.5)"),
               {f, "'num_hidden_layers' must be an integer (got 4.5)"});
  expect_error(with(R"(, "rope_parameters": {"rope_theta": 1e6})"),
               {f, "'rope_theta'", "contradicts"});
  // Values said as the file's fields: an integer past 2^63 - 1 (read as -1 before), a theta
  // out of range (named the flag --rope-theta), an epsilon no float holds (became 0).
  expect_error(with(R"(, "vocab_size": 18446744073709551615)"),
               {f, "'vocab_size' is too large (got 18446744073709551615)"});
  expect_error(with(R"(, "rope_theta": 0.5)"), {f, "'rope_theta' = 0.5 is outside [1, 1e+12]"});
  expect_error(parse(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                         "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
                         "rope_parameters": {"rope_type": "default", "rope_theta": 1e300}})"),
               {f, "'rope_parameters.rope_theta' = 1e+300 is outside"});
  expect_error(with(R"(, "rms_norm_eps": 1e-300)"),
               {f, "'rms_norm_eps' = 1e-300 is outside what a float holds"});
  // A rope_scaling beside rope_parameters says the same or is refused (it was ignored).
  const std::string llama3 = R"("factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192)";
  expect_error(with(R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
                       "rope_scaling": {"rope_type": "llama3", )" +
                    llama3 + "}"),
               {f, "'rope_scaling'", "contradicts rope_parameters", "keep one of them"});
  EXPECT_TRUE(parse_model_config(
                  llama_json(R"(, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, )" +
                             llama3 + R"(}, "rope_scaling": {"rope_type": "llama3", )" + llama3 +
                             "}"),
                  f)
                  .rope.scaling.enabled);
  EXPECT_FALSE(parse_model_config(llama_json(R"(, "rope_parameters": {"rope_type": "default",
                                                 "rope_theta": 5e5}, "rope_scaling": null)"),
                                  f)
                   .rope.scaling.enabled);
  expect_error(with(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
               {f, "'rope_scaling.low_freq_factor' is missing"});
  expect_error(with(R"(, "rope_scaling": "llama3")"), {f, "'rope_scaling' must be an object"});
  expect_error(with(R"(, "hidden_act": "gelu")"), {f, "'hidden_act'", "gelu", "silu"});
  // The file's strings are quoted as excerpts: one of 3000 characters made a refusal of over 3000
  // (past the 2000 a message may have).
  const std::string l(3000, 'm');
  for (const std::string extra :
       {", \"model_type\": \"" + l + "\"", ", \"hidden_act\": \"" + l + "\"",
        ", \"torch_dtype\": \"" + l + "\"", ", \"rope_scaling\": {\"rope_type\": \"" + l + "\"}"}) {
    try {
      parse_model_config(llama_json(extra), f);
      ADD_FAILURE() << "not refused: " << extra.substr(0, 30);
    } catch (const ConfigError& e) {
      EXPECT_LT(std::string(e.what()).size(), 2000u) << e.what();
      EXPECT_NE(std::string(e.what()).find("is not supported"), std::string::npos) << e.what();
    }
  }
  expect_error(with(R"(, "attention_bias": true)"), {f, "'attention_bias' = true"});
  expect_error(with(R"(, "mlp_bias": true)"), {f, "'mlp_bias' = true"});
  expect_error(with(R"(, "use_sliding_window": true)"), {f, "'use_sliding_window'"});
  expect_error(with(R"(, "layer_types": ["full_attention", "sliding_attention"])"),
               {f, "'layer_types'", "[1] = \"sliding_attention\""});
  EXPECT_NO_THROW(parse_model_config(
      llama_json(R"(, "layer_types": ["full_attention", "full_attention"])"), f));
  expect_error(with(R"(, "torch_dtype": "int8")"), {f, "'torch_dtype'", "int8"});
  expect_error(with(R"(, "dtype": "float8_e4m3fn")"), {f, "'dtype'", "float8"});
  expect_error(with(R"(, "hidden_size": "4096")"), {f, "'hidden_size' must be an integer"});
  expect_error(with(R"(, "hidden_size": 0)"), {f, "'hidden_size' must be positive"});
  expect_error(with(R"(, "num_key_value_heads": 5)"),
               {f, "'num_key_value_heads' (5) must divide num_attention_heads (32)"});
  expect_error(with(R"(, "head_dim": 65)"), {f, "'head_dim' must be even"});
  // head_dim left out: hidden_size / heads in 64 bits (2^32 over one head narrowed to 0, named
  // as a field the file did not have).
  expect_error(parse(R"({"model_type": "llama", "hidden_size": 4294967296, "intermediate_size": 8,
                         "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 8})"),
               {f, "'head_dim' is absent, and hidden_size / num_attention_heads (4294967296 / 1 = "
                   "4294967296) is not an even head dimension in [2, 1024]; give head_dim"});
  // Token ids are int32: a vocabulary past 2^31 - 1 (a division by zero drawing random tokens).
  expect_error(with(R"(, "vocab_size": 2147483648)"),
               {f, "'vocab_size' must be in [1, 2147483647] (got 2147483648)"});
  expect_error(with(R"(, "rms_norm_eps": -1)"), {f, "'rms_norm_eps' must be positive"});
  expect_error(with(R"(, "tie_word_embeddings": "no")"), {f, "'tie_word_embeddings'"});
  expect_error(parse(R"({"model_type": "llama", "intermediate_size": 1})"),
               {f, "'hidden_size' is missing"});
  expect_error(parse(ok.substr(0, ok.size() - 5)), {f, "not valid JSON"});
  // nlohmann::json throws a number outside a double as out_of_range, not parse_error.
  expect_error(parse(ok.substr(0, ok.size() - 1) + R"(, "x": 1e999})"),
               {f, "not valid JSON", "number overflow"});
  expect_error(parse("[1, 2]"), {f, "expected a JSON object"});
}

TEST(ModelConfig, LoadRefusals) {
  TempDir dir;
  expect_error([&] { load_model_config(dir.path().string()); }, {"holds no config.json"});
  expect_error([&] { load_model_config("llama9-1t"); },
               {"'llama9-1t' is neither", "llama3-8b", "qwen3-32b", "tiny"});
  expect_error([&] { model_preset("llama9-1t"); }, {"unknown model preset 'llama9-1t'"});
  std::string path = dir.write("config.json", llama_json(R"(, "model_type": "gemma")"));
  expect_error([&] { load_model_config(dir.path().string()); }, {path, "'model_type'", "gemma"});
}

}  // namespace
}  // namespace upipe

namespace upipe {
namespace {

// What the exporter writes reads back to the same model, for every preset (llama3 RoPE
// scaling, QK-norm, tied and untied heads, head_dim != D/H).
TEST(ModelConfig, ConfigJsonRoundTrip) {
  for (const std::string& name : model_preset_names()) {
    const ModelConfig a = model_preset(name);
    const ModelConfig b = parse_model_config(model_config_json(a, "bfloat16"), "written");
    EXPECT_EQ(b.family, a.family) << name;
    EXPECT_EQ(b.hidden_size, a.hidden_size) << name;
    EXPECT_EQ(b.intermediate_size, a.intermediate_size) << name;
    EXPECT_EQ(b.num_hidden_layers, a.num_hidden_layers) << name;
    EXPECT_EQ(b.num_attention_heads, a.num_attention_heads) << name;
    EXPECT_EQ(b.num_key_value_heads, a.num_key_value_heads) << name;
    EXPECT_EQ(b.head_dim, a.head_dim) << name;
    EXPECT_EQ(b.vocab_size, a.vocab_size) << name;
    EXPECT_EQ(b.rms_norm_eps, a.rms_norm_eps) << name;
    EXPECT_EQ(b.tie_word_embeddings, a.tie_word_embeddings) << name;
    EXPECT_EQ(b.qk_norm, a.qk_norm) << name;
    EXPECT_EQ(b.rope.theta, a.rope.theta) << name;
    EXPECT_EQ(b.rope.scaling.enabled, a.rope.scaling.enabled) << name;
    EXPECT_EQ(b.rope.scaling.factor, a.rope.scaling.factor) << name;
    EXPECT_EQ(b.rope.scaling.original_max_position, a.rope.scaling.original_max_position) << name;
    EXPECT_EQ(b.torch_dtype, "bfloat16") << name;
  }
}

// bos/eos/pad token ids travel from a config.json to the one an export writes (Llama 3.1's list
// of eos ids and a null pad included); they are the tokenizer's, so two configs that differ only
// there are the same model; anything but an id, a list of ids or null is refused naming the field.
TEST(ModelConfig, SpecialTokenIdsAreCarriedNotCompared) {
  const ModelConfig base = model_preset("tiny");
  nlohmann::json j = nlohmann::json::parse(model_config_json(base, "float32"));
  j["bos_token_id"] = 7;
  j["eos_token_id"] = {8, 9};
  j["pad_token_id"] = nullptr;
  const ModelConfig a = parse_model_config(j.dump(), "a/config.json");
  EXPECT_EQ(a.token_ids.at("bos_token_id"), "7");
  EXPECT_EQ(a.token_ids.at("eos_token_id"), "[8,9]");
  EXPECT_EQ(a.token_ids.at("pad_token_id"), "null");
  const nlohmann::json back = nlohmann::json::parse(model_config_json(a, "bfloat16"));
  EXPECT_EQ(back["bos_token_id"], 7);
  EXPECT_EQ(back["eos_token_id"], nlohmann::json({8, 9}));
  EXPECT_TRUE(back.contains("pad_token_id") && back["pad_token_id"].is_null());
  EXPECT_EQ(parse_model_config(back.dump(), "b").token_ids, a.token_ids);
  EXPECT_EQ(first_model_difference(a, "a", base, "b"), "");
  EXPECT_FALSE(nlohmann::json::parse(model_config_json(base, "float32")).contains("bos_token_id"));
  for (const nlohmann::json& bad : {nlohmann::json("1"), nlohmann::json(1.5),
                                    nlohmann::json({1, "x"}), nlohmann::json::object()}) {
    j["eos_token_id"] = bad;
    expect_error([&] { parse_model_config(j.dump(), "c/config.json"); },
                 {"c/config.json", "eos_token_id", "is not a token id"});
  }
}

}  // namespace
}  // namespace upipe
