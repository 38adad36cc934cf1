#include "apps/upipe/settings_cli.h"

#include <fmt/format.h>

#include <cstdio>
#include <map>
#include <set>

#include "attention/methods.h"
#include "core/errors.h"

namespace upipe::app {

std::shared_ptr<SettingArgs> add_settings(CLI::App& cmd, uint32_t scope, uint32_t also,
                                          const std::vector<std::string>& preset) {
  auto out = std::make_shared<SettingArgs>();
  // The default shown for a setting: the preset's value where it sets one.
  auto shown_default = [&preset](const SettingInfo& s) {
    for (const std::string& p : preset)
      for (const std::string& name : {s.flag, "--" + s.key})
        if (p.starts_with(name + "=")) return p.substr(name.size() + 1);
    return s.default_value;
  };
  out->scope = scope | also;
  cmd.allow_extras();
  for (const SettingInfo& s : settings()) {
    if (!(s.scopes & (scope | also))) continue;
    const bool listed = (s.scopes & scope) != 0;
    // The visible option (flag, short flag) and, hidden, every other spelling of the setting.
    std::vector<std::string> names{s.short_flag.empty() ? s.flag : s.flag + "," + s.short_flag,
                                   "--" + s.key};
    for (const std::string& a : s.aliases) names.push_back(a[0] == '-' ? a : "--" + a);
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string used = names[i].substr(0, names[i].find(','));
      const std::string doc = i == 0 ? fmt::format("{} (default {})", s.doc, shown_default(s)) : "";
      CLI::Option* o = s.type == "bool"
                           ? cmd.add_flag(
                                 names[i],
                                 [out, used](int64_t n) {
                                   out->args.push_back(used + (n > 0 ? "=true" : "=false"));
                                 },
                                 doc)
                           : cmd.add_option(
                                    names[i],
                                    [out, used](const CLI::results_t& r) {
                                      for (const std::string& v : r)
                                        out->args.push_back(used + "=" + v);
                                      return true;
                                    },
                                    doc)
                                 ->expected(1);
      o->trigger_on_parse()->group(i == 0 && listed ? "Settings" : "");
    }
  }
  return out;
}

std::vector<std::string> listed_options(const CLI::App& cmd) {
  std::vector<std::string> names;
  for (const CLI::Option* o : cmd.get_options())
    if (!o->get_group().empty())  // not the hidden older spellings
      for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
  return names;
}

Settings resolve_settings(const Process& proc, const SettingArgs& args, const CLI::App& cmd,
                          const std::string& run_file, const std::vector<std::string>& preset,
                          const RunConfig* base, bool validated) {
  const uint32_t scope = args.scope;
  Settings s;
  // What CLI11 did not know is refused first: a mistyped flag's value may have been taken for
  // the run file.
  RunConfig scratch;
  apply_overrides(scratch, cmd.remaining(), scope, nullptr, listed_options(cmd));
  if (base) s.config = *base;
  if (!run_file.empty()) {
    // The run file's settings over the base's: parsed alone, then applied where it sets them.
    SettingSources file;
    const RunConfig f = read_run_file(run_file, &file);
    for (const auto& [key, value] : setting_values(f))
      if (file.spelled.count(key)) apply_override(s.config, key, value);
    s.sources = file;
  }
  apply_overrides(s.config, preset, scope, &s.sources);
  apply_overrides(s.config, args.args, scope, &s.sources);
  // A recorded run given another method now (train --resume --method=M --accept-changes): the
  // recorded knobs M does not take are dropped, not refused as if typed (knobs typed now stay,
  // and are checked).
  if (base && s.given("parallel.method") &&
      s.config.parallel.knobs.method != base->parallel.knobs.method) {
    MethodKnobs& now = s.config.parallel.knobs;
    MethodKnobs k = knobs_for(now, method_info(now.method));
    if (s.given("parallel.stage_heads")) k.stage_heads = now.stage_heads;
    if (s.given("parallel.ulysses_degree")) k.ulysses_degree = now.ulysses_degree;
    if (s.given("parallel.chunks")) k.chunks = now.chunks;
    if (s.given("parallel.overlap")) k.overlap = now.overlap;
    now = k;
  }
  // A fresh run from a Hugging Face directory's weights is that directory's model unless a model
  // is named (`train --init-from DIR` alone fine-tunes DIR).
  if (!base && !s.config.model.init_from.empty() && !s.sources.spelled.count("model.name"))
    s.config.model.name = s.config.model.init_from;
  static std::set<std::string> printed;  // once per process, however often settings are read
  if (proc.root())
    for (const std::string& n : s.sources.notes)
      if (printed.insert(n).second)
        std::fprintf(stderr, "upipe: note: %s (the old spelling still works)\n", n.c_str());
  s.sources.scopes = scope;
  for (const CLI::Option* o : cmd.get_options())
    for (const std::string& n : o->get_lnames()) s.sources.own_flags.insert("--" + n);
  set_setting_speller(setting_speller(s.sources));
  if (validated) validate(s.config, scope);
  return s;
}

void spell_model_fields(const Settings& s, const ModelConfig& m) {
  static const std::map<std::string, std::string> kFields = {
      {"attention.heads", "num_attention_heads"},
      {"attention.kv_heads", "num_key_value_heads"},
      {"attention.head_dim", "head_dim"},
      {"attention.hidden_size", "hidden_size"}};
  SettingSpeller base = setting_speller(s.sources);
  set_setting_speller([base, fields = kFields, source = m.source](
                          std::string_view key, const std::optional<std::string>& value) {
    const auto it = fields.find(std::string(key));
    if (it == fields.end()) return base(key, value);
    return value ? fmt::format("{} = {} in {}", it->second, *value, source)
                 : fmt::format("{} of {}", it->second, source);
  });
}

}  // namespace upipe::app
