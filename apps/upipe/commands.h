// The `upipe` subcommands. Each registers its options on a CLI11 subcommand and returns the
// function that runs it (exit status).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "apps/upipe/cli.h"

namespace upipe::app {

using Runner = std::function<int(Process&)>;

Runner add_demo(CLI::App& app);
Runner add_bench_kernel(CLI::App& bench);
Runner add_bench_attention(CLI::App& bench);
Runner add_bench_comm(CLI::App& bench);
// `upipe bench ops`: the memory-bound kernels against a plain copy (cmd_bench_ops.cpp).
Runner add_bench_ops(CLI::App& bench);
Runner add_bench_model(CLI::App& bench);
Runner add_check(CLI::App& app);
Runner add_eval(CLI::App& app);
Runner add_train(CLI::App& app);
// `upipe demo`: upipe train on the copy task with the demo's settings (cmd_train.cpp).
Runner add_demo_train(CLI::App& app);
// The demo's own defaults over the settings' ("--flag=value" each).
const std::vector<std::string>& demo_settings();
Runner add_export(CLI::App& app);
Runner add_tokenize(CLI::App& app);
// `upipe plan`: a training step's memory on every rank, planned on the meta device (cmd_plan.cpp).
Runner add_plan(CLI::App& app);
// `upipe settings`: the table of every setting (cmd_settings.cpp).
Runner add_settings_command(CLI::App& app);
// `upipe presets`: the built-in models and their sizes (cmd_presets.cpp).
Runner add_presets(CLI::App& app);
// `upipe --version`: the build and what it runs on here (version.cpp).
std::string version_text();

}  // namespace upipe::app
