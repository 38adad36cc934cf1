// `upipe`: the command-line entry point. It owns the error boundary: an error on any rank, at any
// point, ends every rank within seconds through MpiRuntime::fail_job, its cause printed once:
// bad input (ConfigError) and a size overflow that input validation did not catch (SizeError)
// with status 2, out-of-memory with status 3, anything else with status 1. An error every rank
// raises alike (bad input checked before any communication) ends the job cleanly with one line;
// an error of some ranks only ends it through MPI_Abort, so no rank is left waiting in a
// collective. A collective that makes no progress for --timeout seconds (a rank stuck or dead)
// ends the job through the watchdog, status 4.
#include <fmt/format.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "apps/upipe/commands.h"
#include "apps/upipe/settings_cli.h"
#include "backend/cpu/cpu_isa.h"
#include "comm/mpi/mpi_comm.h"
#include "core/check.h"
#include "core/errors.h"
#include "core/join.h"
#include "core/spelling.h"
#include "core/stop_signal.h"
#include "core/watchdog.h"

namespace {

// The listed option of `cmd` nearest to what was typed (`--tokeniser`, `--rank=8`); "" if none.
std::string nearest_option(const CLI::App& cmd, const std::string& typed) {
  const std::string name = typed.substr(0, typed.find('='));
  const std::string near = upipe::closest_name(name, upipe::app::listed_options(cmd));
  return !near.empty() && upipe::near_enough(name, near) ? near : "";
}

// The chain of commands CLI11 parsed ("upipe bench comm") and the deepest of them.
std::pair<std::string, const CLI::App*> parsed_chain(const CLI::App& cli) {
  std::string name = "upipe";
  const CLI::App* at = &cli;
  while (!at->get_subcommands().empty()) {
    at = at->get_subcommands().front();
    name += " " + at->get_name();
  }
  return {name, at};
}

// The names of the commands of `cmd` ("kernel", "attention", ... for `upipe bench`).
std::vector<std::string> command_names(const CLI::App& cmd) {
  std::vector<std::string> names;
  for (const CLI::App* sub : cmd.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  return names;
}

// "upipe bench has no command 'attn'; did you mean 'attention'? Its commands: ...": the command
// the word is likely a misspelling or an abbreviation of, where one is.
std::string no_command(const std::string& chain, const CLI::App& at, const std::string& word) {
  const std::vector<std::string> names = command_names(at);
  const std::string likely = upipe::likely_name(word, names);
  const std::string list = upipe::join(names, ", ");
  if (likely.empty())
    return fmt::format("{} has no command '{}'; its commands: {} ({} --help)", chain, word, list,
                       chain);
  return fmt::format("{} has no command '{}'; did you mean '{}'? Its commands: {} ({} --help)",
                     chain, word, likely, list, chain);
}

// What to say when a command needs a subcommand and got none: the deepest command parsed, the
// word typed where its subcommand goes (unknown there) and the subcommands it has.
std::string missing_command(const CLI::App& cli, const std::vector<std::string>& args) {
  const auto [chain, at] = parsed_chain(cli);
  size_t next = 1;  // the first word after the chain of parsed commands
  for (const CLI::App* c = &cli; c != at;) {
    c = c->get_subcommands().front();
    while (next < args.size() && args[next] != c->get_name()) ++next;
    ++next;
  }
  const std::string list = upipe::join(command_names(*at), ", ");
  for (; next < args.size(); ++next) {
    const std::string& word = args[next];
    if (word.starts_with("-"))
      return fmt::format("{} takes no option {} before its command; its commands: {} ({} --help)",
                         chain, word.substr(0, word.find('=')), list, chain);
    return no_command(chain, *at, word);
  }
  return fmt::format("{} needs a command: {} ({} --help says what each does)", chain, list, chain);
}

// A word a command that also takes settings (`upipe demo`) left over, that is likely one of its
// commands misspelt or abbreviated (`upipe demo atention`): said as such, not as a stray
// argument. A word after an unknown `--flag` is that flag's value; "" when there is none.
std::string misspelt_command(const CLI::App& cli) {
  const auto [chain, at] = parsed_chain(cli);
  if (command_names(*at).empty()) return "";
  const std::vector<std::string> rest = at->remaining();
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest[i].starts_with("-")) {
      if (rest[i].find('=') == std::string::npos) ++i;
      continue;
    }
    if (!upipe::likely_name(rest[i], command_names(*at)).empty())
      return no_command(chain, *at, rest[i]);
  }
  return "";
}

// Is `flag` an option of `command` that takes no value (a switch: --resume, --json, a bool
// setting such as --overlap)?
bool is_switch(const CLI::App& command, std::string_view flag) {
  const CLI::Option* o = command.get_option_no_throw(std::string(flag));
  return o != nullptr && o->get_expected_max() == 0;
}

// `plan --max-seq-len 7`: a number after a switch is no value of it, and CLI11 took it for the
// run file ("cannot open run file 7") or a stray argument. Said as the switch's mistake where
// `word` looks like a number and names no file; "" otherwise.
std::string value_after_switch(const CLI::App& command, std::string_view flag,
                               std::string_view word) {
  if (!flag.starts_with("--") || flag.find('=') != std::string_view::npos ||
      !is_switch(command, flag) || word.empty() ||
      !std::isdigit(static_cast<unsigned char>(word.front())) || std::filesystem::exists(word))
    return "";
  std::string what = command.get_option(std::string(flag))->get_description();
  what = what.substr(0, what.find(" (default "));  // a setting's doc ends with its default
  const bool run_file =
      !command.get_options([](const CLI::Option* o) { return o->get_positional(); }).empty();
  return fmt::format("{} takes no value (a switch: {}); {}", flag, what,
                     run_file ? fmt::format("the {} after it was read as the run file, and there "
                                            "is no file {}: drop it",
                                            word, word)
                              : fmt::format("drop the {} after it", word));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace upipe;
  // A stop signal before `upipe train` installs its handlers (MPI_Init alone takes 0.3 s) waits
  // for them instead of killing the rank; other commands release it to its default action.
  hold_stop_signals();
  MpiRuntime mpi(&argc, &argv);
  auto world = mpi.world();
  app::Process proc{*world};

  CLI::App cli{"upipe: headwise-chunked Ulysses context parallelism for long-context training"};
  cli.require_subcommand(1);
  cli.set_version_flag(
      "--version", [] { return app::version_text(); },
      "the build (version, git commit) and the CPU, CUDA and MPI it runs on");
  std::map<CLI::App*, app::Runner> runners;
  CLI::App* demo = cli.add_subcommand(
      "demo",
      "built-in demonstration: train the tiny model on the copy task (run-file overrides "
      "such as --steps=500 apply)");
  CLI::App* demo_attn =
      demo->add_subcommand("attention", "UPipe and Ulysses checked against local, timed, planned");
  {
    app::Runner attention = app::add_demo(*demo_attn), training = app::add_demo_train(*demo);
    runners[demo] = [demo_attn, attention, training](app::Process& p) {
      return demo_attn->parsed() ? attention(p) : training(p);
    };
  }
  CLI::App* bench = cli.add_subcommand("bench", "benchmarks (physical units, JSON with --json)");
  bench->require_subcommand(1);
  CLI::App* kernel = bench->add_subcommand("kernel", "attention kernel vs GEMM on one rank");
  runners[kernel] = app::add_bench_kernel(*kernel);
  CLI::App* battn = bench->add_subcommand("attention", "one strategy's forward + backward");
  runners[battn] = app::add_bench_attention(*battn);
  CLI::App* bcomm =
      bench->add_subcommand("comm", "one collective: engine (blocking, non-blocking) vs plain MPI");
  runners[bcomm] = app::add_bench_comm(*bcomm);
  CLI::App* bops = bench->add_subcommand("ops", "memory-bound kernels vs a plain copy, one rank");
  runners[bops] = app::add_bench_ops(*bops);
  CLI::App* bmodel = bench->add_subcommand("model", "the whole decoder's forward + backward");
  runners[bmodel] = app::add_bench_model(*bmodel);
  CLI::App* check = cli.add_subcommand("check", "verify a strategy against `local`");
  runners[check] = app::add_check(*check);
  CLI::App* eval = cli.add_subcommand("eval", "a model's loss and gradients on one sequence");
  runners[eval] = app::add_eval(*eval);
  CLI::App* tokenize = cli.add_subcommand(
      "tokenize",
      "bytes as tokens (vocabulary 256): a text file -> llm.c .bin, or every file of a "
      "directory, one document each -> .bin + .idx");
  runners[tokenize] = app::add_tokenize(*tokenize);
  CLI::App* train = cli.add_subcommand(
      "train", "train a model: ZeRO-3 over DP x CP, any attention strategy (docs/training.md)");
  runners[train] = app::add_train(*train);
  CLI::App* exp =
      cli.add_subcommand("export", "a training checkpoint as a Hugging Face folder (one process)");
  runners[exp] = app::add_export(*exp);
  CLI::App* plan = cli.add_subcommand(
      "plan", "a training step's memory per rank, or the longest S that fits (docs/planner.md)");
  runners[plan] = app::add_plan(*plan);
  CLI::App* sets = cli.add_subcommand(
      "settings", "every setting: its run-file key, flag, type, default and commands");
  runners[sets] = app::add_settings_command(*sets);
  CLI::App* presets =
      cli.add_subcommand("presets", "the built-in models (--model NAME): shapes and sizes");
  runners[presets] = app::add_presets(*presets);
  app::check_switch_values(cli);

  // `--key=` (an empty value, as `dir = ""` in a run file: no checkpoints, no metrics file) is
  // given to CLI11 as `--key ""`: it refuses the first spelling ("1 required missing").
  // A switch followed by a truth value (`--offload-stash 1`, `--overlap false`, `--resume yes`)
  // is given as `--offload-stash=1`: CLI11 took the value for train's run file or left it apart.
  // A switch with nothing after its '=' (`--overlap=`, `--json=`) is refused: CLI11 reads an
  // empty value as the switch on, which `--overlap=$UNSET_VAR` did not say. Refused before
  // CLI11 parses, so `--overlap= --help` is this error too (intended: the line is wrong either
  // way).
  std::vector<std::string> split;
  std::string empty_switch;        // the first switch typed `--name=`
  std::string switch_value;        // what value_after_switch says of the first number after one
  const CLI::App* command = &cli;  // the deepest command the words typed so far name
  for (int i = 0; i < argc; ++i) {
    const std::string_view w = argv[i];
    const bool empty_value = w.size() > 3 && w.starts_with("--") && w.find('=') == w.size() - 1;
    if (i > 0 && !w.starts_with("-"))
      for (const CLI::App* sub :
           command->get_subcommands([&](const CLI::App* a) { return a->get_name() == w; }))
        command = sub;
    if (i > 1 && switch_value.empty()) switch_value = value_after_switch(*command, argv[i - 1], w);
    if (empty_value && empty_switch.empty() && is_switch(*command, w.substr(0, w.size() - 1)))
      empty_switch = w.substr(0, w.size() - 1);
    if (w.starts_with("--") && w.find('=') == std::string_view::npos && i + 1 < argc &&
        is_switch(*command, w) && app::is_truth_value(argv[i + 1])) {
      split.push_back(fmt::format("{}={}", w, argv[i + 1]));
      ++i;
      continue;
    }
    split.emplace_back(empty_value ? w.substr(0, w.size() - 1) : w);
    if (empty_value) split.emplace_back();
  }
  // `upipe help [COMMAND...]` is `upipe [COMMAND...] --help`, as git and cargo take it.
  if (split.size() >= 2 && split[1] == "help") {
    split.erase(split.begin() + 1);
    split.emplace_back("--help");
  }
  std::vector<char*> args;
  for (std::string& w : split) args.push_back(w.data());

  try {
    if (!empty_switch.empty())
      throw ConfigError(fmt::format(
          "{}= has no value: write {} alone (on), or {}=VALUE with true/false (1, 0, yes, no, "
          "on, off)",
          empty_switch, empty_switch, empty_switch));
    if (!switch_value.empty()) throw ConfigError(switch_value);
    try {
      cli.parse(int(args.size()), args.data());
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) {
        if (proc.root()) cli.exit(e);
        return 0;
      }
      // CLI11's "The following argument was not expected: --json" names no command: say which
      // command refused what, and where its options are listed.
      if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
        const auto [name, at] = parsed_chain(cli);
        // What it did not take, in the order typed (CLI11's message lists it last first).
        std::string extra = join(at->remaining(), " ");
        if (extra.empty()) {
          extra = e.what();
          if (const size_t colon = extra.find(": "); colon != std::string::npos)
            extra.erase(0, colon + 2);
        }
        std::string hint;  // the option nearest the first one it did not know
        for (const std::string& w : at->remaining())
          if (w.starts_with("--")) {
            if (const std::string near = nearest_option(*at, w); !near.empty())
              hint = fmt::format("; did you mean '{}'?", near);
            break;
          }
        throw ConfigError(fmt::format("{} takes no {}{} ({} --help lists what it takes)", name,
                                      extra, hint, name));
      }
      // CLI11's "A subcommand is required" for `upipe trian`, `upipe --foo` or a bare `upipe
      // bench`: name the word it did not know and the commands there are.
      if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr &&
          std::string_view(e.what()).find("subcommand") != std::string_view::npos)
        throw ConfigError(missing_command(cli, split));
      // "--ranks is required" for `plan --rank 8`: CLI11 checks what is required before it
      // refuses what it does not know, so the misspelt word is said first.
      if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
        const auto [name, at] = parsed_chain(cli);
        for (const std::string& w : at->remaining()) {
          if (!w.starts_with("-")) continue;
          const std::string typed = w.substr(0, w.find('='));
          const std::string near = nearest_option(*at, typed);
          throw ConfigError(
              fmt::format("unknown option '{}'{} ({} --help lists what it takes)", typed,
                          near.empty() ? "" : fmt::format("; did you mean '{}'?", near), name));
        }
      }
      // A hidden option's error is named "" by CLI11 (": msg"); its validator names it (named).
      std::string what = e.what();
      if (what.starts_with(": ")) what.erase(0, 2);
      throw ConfigError(what);
    }
    if (const std::string misspelt = misspelt_command(cli); !misspelt.empty())
      throw ConfigError(misspelt);
    // Only training stops cleanly (it installs the handlers, releasing the signals then).
    if (!train->parsed() && !(demo->parsed() && !demo_attn->parsed())) release_stop_signals();
    cpu_isa();  // the CPU kernels' path, once: UPIPE_CPU_ISA or the widest (ConfigError if absent)
    for (auto& [cmd, run] : runners)
      if (cmd->parsed() && run) return run(proc);
    throw ConfigError("no command given; try upipe --help");
  } catch (const ConfigError& e) {
    return MpiRuntime::fail_job(2, e.what(), fmt::format("upipe: error: {}", e.what()));
  } catch (const SizeError& e) {
    return MpiRuntime::fail_job(2, e.what(),
                                fmt::format("upipe: error [rank {}]: {}", proc.rank(), e.what()));
  } catch (const OutOfMemoryError& e) {
    return MpiRuntime::fail_job(3, e.what(),
                                fmt::format("upipe: [rank {}] {}", proc.rank(), e.what()));
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the user gave that cannot be used (a symlink loop, no permission) where no reader
    // named it first: said as bad input, with the path, not as an internal failure.
    const std::string what = fmt::format(
        "{}: {}", e.path1().empty() ? "a path" : e.path1().string(), e.code().message());
    return MpiRuntime::fail_job(2, what,
                                fmt::format("upipe: error [rank {}]: {}", proc.rank(), what));
  } catch (const std::exception& e) {
    return MpiRuntime::fail_job(1, e.what(),
                                fmt::format("upipe: [rank {}] fatal: {}", proc.rank(), e.what()));
  }
}
