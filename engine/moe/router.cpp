#include "moe/router.h"

#include <cmath>

namespace colibri {

Status validate(const RouterSpec& spec) {
  if (spec.n_experts <= 0) return make_error("the number of experts must be positive, got {}", spec.n_experts);
  if (spec.top_k <= 0 || spec.top_k > spec.n_experts)
    return make_error("top_k must be in [1, {}] (the number of experts), got {}", spec.n_experts, spec.top_k);
  return Status::Ok();
}

Status route_top_k(const RouterSpec& spec, std::span<const float> logits, std::span<float> probabilities,
                   std::span<std::int32_t> experts, std::span<float> weights) {
  return route_top_k_masked(spec, logits, {}, probabilities, experts, weights);
}

Status route_top_k_masked(const RouterSpec& spec, std::span<const float> logits, std::span<const std::uint8_t> allowed,
                          std::span<float> probabilities, std::span<std::int32_t> experts, std::span<float> weights) {
  const auto n = static_cast<std::size_t>(spec.n_experts);
  const auto k = static_cast<std::size_t>(spec.top_k);
  if (logits.size() != n || probabilities.size() != n)
    return make_error("router: expected {} logits, got {}", n, logits.size());
  if (experts.size() != k || weights.size() != k)
    return make_error("router: expected room for {} experts", k);
  if (!allowed.empty() && allowed.size() != n)
    return make_error("router: expected {} allowed flags, got {}", n, allowed.size());

  float max = -INFINITY;
  for (std::size_t e = 0; e < n; ++e) {
    if (!std::isfinite(logits[e])) return make_error("router: logit of expert {} is not finite", e);
    max = std::fmax(max, logits[e]);
  }
  float sum = 0.0f;
  for (std::size_t e = 0; e < n; ++e) {
    probabilities[e] = std::exp(logits[e] - max);
    sum += probabilities[e];
  }
  for (std::size_t e = 0; e < n; ++e) probabilities[e] /= sum;

  // Insertion into a k-long sorted list: O(n k), which for k <= 8 beats any
  // sort. Experts arrive in index order and only a strictly higher
  // probability moves ahead, so ties go to the lower index.
  std::size_t filled = 0;
  for (std::size_t e = 0; e < n; ++e) {
    if (!allowed.empty() && allowed[e] == 0) continue;
    const float p = probabilities[e];
    if (filled == k && !(p > weights[k - 1])) continue;
    std::size_t slot = filled < k ? filled++ : k - 1;
    while (slot > 0 && p > weights[slot - 1]) {
      weights[slot] = weights[slot - 1];
      experts[slot] = experts[slot - 1];
      --slot;
    }
    weights[slot] = p;
    experts[slot] = static_cast<std::int32_t>(e);
  }
  if (filled < k) return make_error("router: only {} experts allowed, top_k is {}", filled, k);
  if (spec.normalize_top_k) {
    float chosen = 0.0f;
    for (std::size_t i = 0; i < k; ++i) chosen += weights[i];
    for (std::size_t i = 0; i < k; ++i) weights[i] /= chosen;
  }
  return Status::Ok();
}

}  // namespace colibri
