// r3 command-line entry point. Errors become one line on stderr and a non-zero exit code.
#include <cstdio>
#include <map>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "core/check.h"

int main(int argc, char** argv) {
  // Logs, progress and timings go to stderr so stdout stays machine-readable (--json).
  auto logger = spdlog::stderr_color_mt("r3");
  logger->set_pattern("[r3] %^%l%$: %v");
  spdlog::set_default_logger(logger);

  CLI::App app{"r3: MoE inference with rollout routing replay (routed-experts capture)", "r3"};
  app.require_subcommand(1);
  app.fallthrough();  // global flags such as --quiet may follow the subcommand
  std::map<CLI::App*, r3::cli::Command> commands;
  for (auto add : {&r3::cli::add_forward_command, &r3::cli::add_generate_command,
                   &r3::cli::add_eplb_plan_command}) {
    r3::cli::Command run = add(app);
    commands[app.get_subcommands({}).back()] = std::move(run);
  }
  bool quiet = false;
  app.add_flag("-q,--quiet", quiet, "Only warnings and errors on stderr");

  // CLI11 reports an unknown command only as "a subcommand is required"; name it instead.
  std::string known;
  bool is_known = false;
  for (const auto& [sub, run] : commands) {
    known += (known.empty() ? "" : ", ") + sub->get_name();
    is_known = is_known || (argc > 1 && sub->get_name() == argv[1]);
  }
  if (argc > 1 && argv[1][0] != '-' && !is_known) {
    std::fprintf(stderr, "r3: error: unknown command '%s' (commands: %s; see --help)\n", argv[1],
                 known.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "r3: error: %s (see --help)\n", e.what());
    return 2;
  }
  if (quiet) spdlog::set_level(spdlog::level::warn);
  try {
    for (auto& [sub, run] : commands) {
      if (sub->parsed()) return run();
    }
  } catch (const r3::Error& e) {
    std::fprintf(stderr, "r3: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "r3: internal error: %s\n", e.what());
    return 1;
  }
  return 1;
}
