// The routing-fidelity flags shared by colibri-perplexity and colibri-bench
// (--routing, --n-group, --topk-group, --load-window, --load-threshold) and
// how both print a measured row (docs/ROUTING.md).
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/routing_fidelity.h"

namespace colibri_tools {

struct RoutingFlags {
  std::string routing;  // empty: off
  colibri::RoutingOptions options;

  // Returns the --routing option (so other options can need it).
  CLI::Option* add(CLI::App& app) {
    CLI::Option* mode = app.add_option(
        "--routing", routing, "Measure a routing mode against standard routing: int8, group-limited, hash, load-aware or all");
    app.add_option("--n-group", options.n_group,
                   "group-limited: expert groups (default: 4 when the experts divide by 4, else 2)");
    app.add_option("--topk-group", options.topk_group, "group-limited: groups kept (default: half)");
    app.add_option("--load-window", options.load_window, "load-aware: tokens in the sliding window")
        ->capture_default_str();
    app.add_option("--load-threshold", options.load_threshold,
                   "load-aware: share of the window's tokens above which an expert passes tokens on")
        ->capture_default_str();
    return mode;
  }

  bool enabled() const { return !routing.empty(); }

  // The modes --routing selects, each with the other flags' values; nullopt
  // for a name that is none of them (see refusal()).
  std::optional<std::vector<colibri::RoutingOptions>> modes() const {
    std::vector<colibri::RoutingOptions> out;
    for (auto mode : {colibri::RoutingMode::Int8, colibri::RoutingMode::GroupLimited, colibri::RoutingMode::Hash,
                      colibri::RoutingMode::LoadAware}) {
      if (routing != "all" && routing != colibri::routing_mode_name(mode)) continue;
      colibri::RoutingOptions o = options;
      o.mode = mode;
      out.push_back(o);
    }
    if (out.empty()) return std::nullopt;
    return out;
  }

  std::string refusal() const {
    return fmt::format("--routing '{}' is not int8, group-limited, hash, load-aware or all", routing);
  }
};

// What a row's mode was run with (or, for int8, what its early exit did).
inline std::string routing_notes(const colibri::RoutingFidelity& row) {
  std::string notes;
  if (row.options.mode == colibri::RoutingMode::GroupLimited)
    notes = fmt::format("{} groups, best {} kept", row.options.n_group, row.options.topk_group);
  if (row.options.mode == colibri::RoutingMode::LoadAware)
    notes = fmt::format("window {}, threshold {}", row.options.load_window, row.options.load_threshold);
  if (row.options.mode == colibri::RoutingMode::Int8)
    notes = fmt::format("early exit cut {} of {} router rows short", row.int8_rows_skipped,
                        row.int8_rows_skipped + row.int8_rows_scored);
  return notes;
}

inline nlohmann::json routing_row_json(const colibri::RoutingFidelity& row) {
  return {{"mode", colibri::routing_mode_name(row.options.mode)},
          {"top1_agreement", row.result.top1_agreement()},
          {"mean_kl", row.result.mean_kl()},
          {"perplexity", row.result.perplexity()},
          {"standard_perplexity", row.result.base_perplexity()},
          {"tokens_scored", row.result.scored},
          {"notes", routing_notes(row)}};
}

// The table's header and rows, without a trailing newline.
inline std::string routing_table_header() {
  return fmt::format("{:<14} {:>10} {:>12} {:>10} {:>12}  {}", "mode", "top-1 agr", "mean KL", "ppl", "standard ppl",
                     "notes");
}

inline std::string routing_table_row(const colibri::RoutingFidelity& row) {
  return fmt::format("{:<14} {:>10.4f} {:>12.6f} {:>10.4f} {:>12.4f}  {}", colibri::routing_mode_name(row.options.mode),
                     row.result.top1_agreement(), row.result.mean_kl(), row.result.perplexity(),
                     row.result.base_perplexity(), routing_notes(row));
}

}  // namespace colibri_tools
