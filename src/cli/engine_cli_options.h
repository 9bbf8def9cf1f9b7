// Options of the serving engine that every command running it shares (generate, bench, serve):
// batching, prefill chunks, KV blocks, prefix caching and expert-parallel ranks.
#pragma once

#include <CLI/CLI.hpp>

#include "engine/engine.h"

namespace r3::cli {

struct EngineCliOptions {
  engine::EngineOptions engine;
  bool no_prefix_caching = false;

  void add_to(CLI::App& command);
  engine::EngineOptions options() const;
};

}  // namespace r3::cli
