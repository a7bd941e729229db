#include "runtime/routing_fidelity.h"

#include <algorithm>

namespace colibri {

Result<std::shared_ptr<ModeRouter>> make_mode_router(const Model& model, const RoutingOptions& options) {
  const ModelConfig& c = model.config();
  if (c.n_experts <= 0) return make_error("routing modes need a mixture-of-experts model; this one has no experts");
  RoutingOptions resolved = options;
  if (resolved.n_group == 0) resolved.n_group = c.n_experts % 4 == 0 ? 4 : 2;
  if (resolved.topk_group == 0) resolved.topk_group = std::max(1, resolved.n_group / 2);
  std::vector<const Matrix*> routers;
  for (const LayerWeights& layer : model.weights().layers)
    routers.push_back(layer.is_moe ? &layer.router : nullptr);
  auto router = ModeRouter::create(resolved, RouterSpec{c.n_experts, c.top_k, c.norm_topk}, routers);
  if (!router) return router.error();
  return std::make_shared<ModeRouter>(std::move(router).value());
}

Result<std::vector<RoutingFidelity>> measure_routing_fidelity(const std::shared_ptr<const Model>& model,
                                                              std::span<const std::int32_t> tokens,
                                                              std::span<const RoutingOptions> modes,
                                                              const PerplexityOptions& options) {
  std::vector<RoutingFidelity> rows;
  for (const RoutingOptions& mode : modes) {
    auto router = make_mode_router(*model, mode);
    if (!router) return make_error("routing mode {}: {}", routing_mode_name(mode.mode), router.error().message);
    PerplexityOptions with_mode = options;
    with_mode.router = *router;
    auto result = measure_perplexity(model, model, tokens, with_mode);
    if (!result) return make_error("routing mode {}: {}", routing_mode_name(mode.mode), result.error().message);
    rows.push_back({(*router)->options(), *result, (*router)->int8_rows_skipped(), (*router)->int8_rows_scored()});
  }
  return rows;
}

}  // namespace colibri
