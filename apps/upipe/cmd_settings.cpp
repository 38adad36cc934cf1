// `upipe settings [--markdown]`: every setting of the run file and the command lines, with its
// flag, type, default, the commands that take it and what it means (train/run_config.h's table).
// --markdown prints the table docs/training.md carries.
#include <fmt/format.h>

#include <cstdio>

#include "apps/upipe/commands.h"
#include "train/run_config.h"

namespace upipe::app {
namespace {

struct Options {
  bool markdown = false;
};

int run(Process& proc, const Options& o) {
  if (!proc.root()) return 0;
  if (o.markdown) {
    std::printf("| key | flag | type | default | commands | meaning |\n");
    std::printf("| --- | --- | --- | --- | --- | --- |\n");
  }
  for (const SettingInfo& s : settings()) {
    const std::string flag = s.short_flag.empty() ? s.flag : s.flag + ", " + s.short_flag;
    if (o.markdown)
      std::printf("| `%s` | `%s` | %s | `%s` | %s | %s |\n", s.key.c_str(), s.flag.c_str(),
                  s.type.c_str(), s.default_value.c_str(), commands_of(s.scopes).c_str(),
                  s.doc.c_str());
    else
      std::printf("%-26s %-22s %-9s %-10s %s\n    %s\n", s.key.c_str(), flag.c_str(),
                  s.type.c_str(), s.default_value.c_str(), commands_of(s.scopes).c_str(),
                  s.doc.c_str());
  }
  // The defaults above are every command's; the demo is a training run that starts from its own.
  std::string demo;
  for (const std::string& a : demo_settings()) demo += (demo.empty() ? "" : " ") + a;
  std::printf(o.markdown ? "\n`upipe demo` starts from its own values of these: `%s`, then what is "
                           "typed.\n"
                         : "\nupipe demo starts from its own values of these: %s, then what is "
                           "typed.\n",
              demo.c_str());
  return 0;
}

}  // namespace

Runner add_settings_command(CLI::App& cmd) {
  auto opt = std::make_shared<Options>();
  cmd.add_flag("--markdown", opt->markdown, "a Markdown table (as docs/training.md has)");
  return [opt](Process& p) { return run(p, *opt); };
}

}  // namespace upipe::app
