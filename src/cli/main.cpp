// r3 command-line entry point. Errors become one line on stderr and a non-zero exit code.
#include <cstdio>
#include <map>
#include <new>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "core/check.h"

namespace {

// Errors are one line: a newline or other control character in a message (from a user's
// input, e.g. --ids "1\n2", or a file) is shown escaped.
std::string one_line(const char* message) {
  std::string out;
  for (const char* p = message; *p != 0; ++p) {
    const auto c = static_cast<unsigned char>(*p);
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += ' ';
    else if (c < 0x20 || c == 0x7f) out += "?";
    else out += *p;
  }
  return out;
}

int fail(const char* kind, const char* message, int code) {
  std::fprintf(stderr, "r3: %s: %s\n", kind, one_line(message).c_str());
  return code;
}

}  // namespace

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
                   &r3::cli::add_eplb_plan_command, &r3::cli::add_bench_command, &r3::cli::add_serve_command}) {
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
    const std::string message = "unknown command '" + std::string(argv[1]) + "' (commands: " + known + "; see --help)";
    return fail("error", message.c_str(), 2);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return fail("error", (std::string(e.what()) + " (see --help)").c_str(), 2);
  }
  if (quiet) spdlog::set_level(spdlog::level::warn);
  try {
    for (auto& [sub, run] : commands) {
      if (sub->parsed()) return run();
    }
  } catch (const r3::Error& e) {
    return fail("error", e.what(), 1);
  } catch (const std::bad_alloc&) {
    return fail("error", "out of memory: an allocation failed (a model, cache or option too large for this machine?)",
                1);
  } catch (const std::length_error& e) {
    return fail("error", (std::string("a size is too large: ") + e.what()).c_str(), 1);
  } catch (const std::exception& e) {
    return fail("internal error", e.what(), 1);
  }
  return 1;
}
