// Which experts a layer will likely choose, for prefetch: the layer's router
// applied to a vector the forward pass already has (layer L's output standing
// in for layer L+1's input), top-k by logit. Softmax is monotonic, so the
// top-k of the logits is the top-k of the probabilities route_top_k takes;
// ties go to the lower expert index, as there.
#pragma once

#include <cstdint>
#include <span>

#include "core/result.h"
#include "model/weights.h"

namespace colibri {

// router: [n_experts, hidden]; x: hidden values; logits: n_experts of scratch;
// experts: receives min(top_k, n_experts) indices, best first. Allocation-free.
Status predict_experts(const Matrix& router, const float* x, std::span<float> logits,
                       std::span<std::int32_t> experts);

}  // namespace colibri
