// Bytes of weights one decode step reads, computed from a loaded model in the
// formats it stores them (values, scales and minimums): the numerator of the
// roofline fraction.
#pragma once

#include <cstdint>

#include "model/model.h"

namespace colibri::benchtool {

struct WeightTraffic {
  std::uint64_t attention = 0;  // q, k, v, o (+ biases, norms) of every layer
  std::uint64_t router = 0;     // router (+ shared-expert gate) of every MoE layer
  std::uint64_t experts = 0;    // top_k routed experts (+ shared expert) per MoE layer, dense FFNs
  std::uint64_t embedding = 0;  // the one embedding row a token reads
  std::uint64_t lm_head = 0;    // lm_head and final norm
  std::uint64_t total() const { return attention + router + experts + embedding + lm_head; }
};

// Per decode step, assuming every layer's top_k experts are distinct from the
// previous token's (no reuse through the cache, the bandwidth-bound case).
WeightTraffic decode_step_traffic(const Model& model);

}  // namespace colibri::benchtool
