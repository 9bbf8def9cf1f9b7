// The r3 subcommands. Each registers its options on the CLI11 app and returns the function
// that runs it once the command line has been parsed.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace r3::cli {

using Command = std::function<int()>;

Command add_forward_command(CLI::App& app);
Command add_generate_command(CLI::App& app);
Command add_eplb_plan_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_serve_command(CLI::App& app);

}  // namespace r3::cli
