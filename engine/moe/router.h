// Expert selection from router (gate) logits: softmax over all experts, the
// top-k by probability, optionally renormalised over the k. Shared by the
// forward pass, the routing endpoint and the C ABI's routing API.
#pragma once

#include <cstdint>
#include <span>

#include "core/result.h"

namespace colibri {

struct RouterSpec {
  std::int32_t n_experts = 0;
  std::int32_t top_k = 0;
  bool normalize_top_k = false;  // weights of the k chosen experts sum to 1
};

Status validate(const RouterSpec& spec);

// Chooses spec.top_k experts from `logits` (n_experts values; not modified).
// `probabilities` (n_experts) receives the softmax; `experts` and `weights`
// (top_k each) receive the choice in descending order of probability, ties to
// the lower expert index. Allocation-free: all storage is the caller's.
// Non-finite logits are an error naming the expert.
Status route_top_k(const RouterSpec& spec, std::span<const float> logits, std::span<float> probabilities,
                   std::span<std::int32_t> experts, std::span<float> weights);

// The same, choosing only among experts with allowed[e] != 0 (every expert
// when `allowed` is empty); the softmax still spans all of them. Fewer
// allowed experts than top_k is an error.
Status route_top_k_masked(const RouterSpec& spec, std::span<const float> logits, std::span<const std::uint8_t> allowed,
                          std::span<float> probabilities, std::span<std::int32_t> experts, std::span<float> weights);

}  // namespace colibri
