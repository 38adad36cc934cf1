// Settings named inside error messages. Code that refuses a value names the setting by its key
// (setting_ref("train.seq_len"), setting_value("train.seq_len", 1008)) instead of a flag, since
// the same setting reaches it from a flag, a run file or a model's config.json. The reference is
// rendered when the ConfigError is built, by the process's speller: a front end installs one that
// writes each setting the way the user gave it (the flag as typed, the run file's key, the model
// config's field); the default writes the key's canonical flag (train.seq_len -> --seq-len).
#pragma once

#include <fmt/format.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace upipe {

// A reference to the setting `key`, rendered as its name ("--seq-len").
std::string setting_ref(std::string_view key);
// A reference to the setting `key` given the value `value`, rendered as the user would write it
// ("--seq-len 1008", "seq_len = 1008 in run.toml").
std::string setting_value(std::string_view key, std::string_view value);
template <class T>
std::string setting_value(std::string_view key, const T& value) {
  return setting_value(key, std::string_view(fmt::format("{}", value)));
}

// How a setting is written: its name, and (value given) the setting with that value.
using SettingSpeller =
    std::function<std::string(std::string_view key, const std::optional<std::string>& value)>;
// Installs the process's speller (nullptr: the default).
void set_setting_speller(SettingSpeller s);
// `text` with every reference rendered by the current speller.
std::string render_setting_refs(std::string_view text);

// "--" and the key's last component with '_' written '-': train.seq_len -> --seq-len.
std::string default_flag(std::string_view key);

}  // namespace upipe
