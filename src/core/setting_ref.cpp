#include "core/setting_ref.h"

#include <utility>

namespace upipe {
namespace {

// A reference is kOpen key [kValue value] kClose; none of these bytes appears in user text that
// reaches a message (flags and keys are printable).
constexpr char kOpen = '\x1e', kValue = '\x1d', kClose = '\x1f';

SettingSpeller& speller() {
  static SettingSpeller s;
  return s;
}

std::string spell(std::string_view key, const std::optional<std::string>& value) {
  if (speller()) return speller()(key, value);
  const std::string flag = default_flag(key);
  return value ? flag + " " + *value : flag;
}

}  // namespace

// Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on an operator+ chain.
std::string setting_ref(std::string_view key) {
  std::string out(1, kOpen);
  out.append(key);
  out += kClose;
  return out;
}

std::string setting_value(std::string_view key, std::string_view value) {
  std::string out(1, kOpen);
  out.append(key);
  out += kValue;
  out.append(value);
  out += kClose;
  return out;
}

void set_setting_speller(SettingSpeller s) {
  speller() = std::move(s);
}

std::string render_setting_refs(std::string_view text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t open = text.find(kOpen, i);
    const size_t close = open == std::string_view::npos ? open : text.find(kClose, open);
    if (close == std::string_view::npos) {
      out += text.substr(i);
      break;
    }
    out += text.substr(i, open - i);
    const std::string_view ref = text.substr(open + 1, close - open - 1);
    const size_t v = ref.find(kValue);
    if (v == std::string_view::npos)
      out += spell(ref, std::nullopt);
    else
      out += spell(ref.substr(0, v), std::string(ref.substr(v + 1)));
    i = close + 1;
  }
  return out;
}

std::string default_flag(std::string_view key) {
  const size_t dot = key.rfind('.');
  std::string name(dot == std::string_view::npos ? key : key.substr(dot + 1));
  for (char& c : name)
    if (c == '_') c = '-';
  return "--" + name;
}

}  // namespace upipe
