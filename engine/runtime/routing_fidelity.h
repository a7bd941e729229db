// What an opt-in routing mode (moe/routing_modes.h) costs on a model: the
// same text through the model with standard routing and with the mode,
// compared position by position (top-1 agreement of next-token choices, mean
// KL divergence of the distributions, perplexity of both).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "core/result.h"
#include "model/model.h"
#include "moe/routing_modes.h"
#include "runtime/perplexity.h"

namespace colibri {

// A ModeRouter over `model`'s routers (one per layer; dense layers have none).
// For group-limited routing, n_group 0 means 4 groups when the experts divide
// by 4 (else 2) and topk_group 0 means half of them; router->options() holds
// the values used.
Result<std::shared_ptr<ModeRouter>> make_mode_router(const Model& model, const RoutingOptions& options);

struct RoutingFidelity {
  RoutingOptions options;
  PerplexityResult result;  // model = with the mode, base = standard routing
  std::uint64_t int8_rows_skipped = 0;  // Int8: router rows the early exit cut short
  std::uint64_t int8_rows_scored = 0;
};

// One row per mode, each over the same windows of `tokens`.
Result<std::vector<RoutingFidelity>> measure_routing_fidelity(const std::shared_ptr<const Model>& model,
                                                              std::span<const std::int32_t> tokens,
                                                              std::span<const RoutingOptions> modes,
                                                              const PerplexityOptions& options);

}  // namespace colibri
