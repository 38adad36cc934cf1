#include "apps/upipe/report.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "attention/methods.h"
#include "backend/cpu/cpu_isa.h"

namespace upipe::app {

nlohmann::json resolved_knobs_json(const AttentionConfig& cfg, int ranks) {
  const MethodKnobs k = resolved_knobs(cfg, ranks);
  return {{"stage_heads", k.stage_heads},
          {"ulysses_degree", k.ulysses_degree},
          {"chunks", k.chunks},
          {"overlap", k.overlap}};
}

nlohmann::json config_json(const AttentionConfig& cfg, int ranks) {
  return {{"method", cfg.knobs.method},
          {"seq_len", cfg.seq_len},
          {"heads", cfg.heads},
          {"kv_heads", cfg.kv_heads},
          {"head_dim", cfg.head_dim},
          {"dtype", dtype_name(cfg.dtype)},
          {"stage_heads", cfg.knobs.stage_heads},
          {"ulysses_degree", cfg.knobs.ulysses_degree},
          {"chunks", cfg.knobs.chunks},
          {"overlap", cfg.knobs.overlap},
          {"resolved_knobs", resolved_knobs_json(cfg, ranks)},
          {"knobs_text", knobs_text(cfg, ranks)}};
}

nlohmann::json tags_json(const TagBytes& b) {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < kNumTags; ++i)
    if (b.v[size_t(i)] != 0) j[tag_name(Tag(i))] = b.v[size_t(i)];
  return j;
}

nlohmann::json comm_json(const CommStats& s) {
  nlohmann::json j = nlohmann::json::object();
  for (int op = 0; op < kNumCommOps; ++op)
    if (s.calls[size_t(op)] > 0)
      j[comm_op_name(CommOp(op))] = {{"calls", s.calls[size_t(op)]},
                                     {"bytes", s.bytes_sent[size_t(op)]}};
  return j;
}

void print_json(nlohmann::json j) {
  j["isa"] = cpu_isa_name(cpu_isa());
  nlohmann::json env = nlohmann::json::object();
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv(*e);
    const size_t eq = kv.find('=');
    if (kv.rfind("UPIPE_", 0) == 0 && eq != std::string::npos)
      env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (!env.empty()) j["env"] = env;
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace upipe::app
