// The settings (train/run_config.h) on one command's command line: the command declares which
// scope of settings it takes, and add_settings registers their flags (with their older spellings,
// hidden) on its CLI11 subcommand, so that they appear in its --help and take their values the
// way every flag does. resolve_settings then reads them after the run file, in the order typed.
// Older spellings print a one-line note (rank 0); from then on errors name each setting as the
// user wrote it.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "apps/upipe/cli.h"
#include "model/config.h"
#include "train/run_config.h"

namespace upipe::app {

// What the user typed for the settings of one command, "--flag=value" each, in order.
struct SettingArgs {
  uint32_t scope = 0;
  std::vector<std::string> args;
};

// Lets `cmd` take the settings of `scope`, listed in its --help, and those of `also`, taken (and
// validated as `also` validates them) but not listed; the returned object fills as CLI11 parses.
// `preset`: the command's own defaults ("--flag=value", as resolve_settings takes them), shown
// in its --help in place of the settings' defaults.
std::shared_ptr<SettingArgs> add_settings(CLI::App& cmd, uint32_t scope, uint32_t also = 0,
                                          const std::vector<std::string>& preset = {});

// The options `cmd` lists in its --help ("--steps", "--json", ...; not the hidden older
// spellings): what a misspelt option is compared with.
std::vector<std::string> listed_options(const CLI::App& cmd);

struct Settings {
  RunConfig config;
  SettingSources sources;
  bool given(const std::string& key) const { return sources.spelled.count(key) > 0; }
};

// The defaults (or `base`, the run a checkpoint recorded), then the run file (`run_file`, "" =
// none), then `preset` arguments (a command's own
// defaults, e.g. the demo's), then what the user typed (args, and anything CLI11 did not know,
// which is refused with the nearest setting suggested); the notes on older spellings are printed
// by rank 0; the speller naming settings as given is installed; then validated for the scope,
// unless `validated` is false (what `train --resume` typed is validated on top of the
// checkpoint's run, not alone).
Settings resolve_settings(const Process& proc, const SettingArgs& args, const CLI::App& cmd,
                          const std::string& run_file = "",
                          const std::vector<std::string>& preset = {},
                          const RunConfig* base = nullptr, bool validated = true);

// From now on, errors name the attention shape's settings (heads, kv-heads, head dim, hidden
// size) as the fields of m's config.json: "num_key_value_heads of tiny".
void spell_model_fields(const Settings& s, const ModelConfig& m);

}  // namespace upipe::app
