// --weights and --mlock, shared by the tools that load a model: how a
// .colibri file's weights are held (engine/core/mapped_file.h).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "model/model.h"

namespace colibri_tools {

struct WeightsFlags {
  std::string memory = "auto";
  bool lock = false;

  void add(CLI::App& app) {
    app.add_option("--weights", memory,
                   "How a .colibri file's weights are held: copy (read into huge-page memory at load; decode "
                   "streams them about a quarter faster), map (the page cache's pages: instant, shared, "
                   "4 KiB pages), auto (copy when it fits in available memory with a tenth to spare, else "
                   "map; always map with --expert-cache-mb)")
        ->check(CLI::IsMember({"auto", "map", "copy"}))
        ->capture_default_str();
    app.add_flag("--mlock", lock, "Lock the weights in RAM (a refusal is reported with how to allow it)");
  }

  // `expert_budget`: an expert store will read experts from the file.
  colibri::LoadOptions load_options(bool expert_budget = false) const {
    colibri::LoadOptions options;
    // The flag's choices (checked above) are the parser's names.
    options.set_weights_memory(*colibri::weights_memory_from_name(memory), expert_budget);
    options.lock = lock;
    return options;
  }
};

}  // namespace colibri_tools
