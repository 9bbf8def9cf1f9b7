// Options every model command shares (--model, --threads) and loading the model with a timing
// line on stderr.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "backend/context.h"
#include "models/causal_lm.h"
#include "models/load_options.h"

namespace r3::cli {

struct ModelOptions {
  std::string model_dir;
  int threads = 0;
  std::string moe_path = "monolithic";  // fastest on CPU: see README, Performance
  models::LoadOptions load_options;

  void add_to(CLI::App& command);
  std::unique_ptr<models::CausalLM> load() const;  // logs load time and model summary
  // The CPU execution context the commands run on (its thread pool has `threads` threads).
  std::unique_ptr<backend::Context> make_context() const;
};

}  // namespace r3::cli
