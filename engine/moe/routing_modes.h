// Opt-in alternatives to standard top-k routing (moe/router.h), each trading
// some fidelity for a property an edge deployment may want:
//  - Int8: integer-only scoring. The router matrix is quantized once with ONE
//    scale for the whole tensor, so int32 dot products rank experts exactly as
//    their (quantized) logits do; a scan with per-row bounds on what the rest
//    of a row can add skips experts that cannot reach the current top-k.
//  - GroupLimited: experts partitioned into n_group equal groups; the
//    topk_group groups with the best expert are kept, top-k is taken inside
//    them (DeepSeek-V2's n_group / topk_group). Keeps a token's experts on few
//    groups, e.g. few NUMA nodes or few files.
//  - Hash: experts from a hash of (token id, layer), weights 1/k, no router
//    arithmetic at all: for models trained with hash layers.
//  - LoadAware: standard scores, but an expert that took more than a
//    threshold share of the layer's recent assignments (a sliding window)
//    passes the token on to its next-best expert.
// Standard routing stays the default everywhere; tools/colibri-bench measures
// each mode's cost against it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "model/weights.h"
#include "moe/router.h"

namespace colibri {

enum class RoutingMode : std::uint8_t { Standard, Int8, GroupLimited, Hash, LoadAware };

std::string_view routing_mode_name(RoutingMode mode);
std::optional<RoutingMode> routing_mode_from_name(std::string_view name);

struct RoutingOptions {
  RoutingMode mode = RoutingMode::Standard;
  // GroupLimited: n_experts must divide into n_group groups; 1 <= topk_group
  // <= n_group, and topk_group groups must hold at least top_k experts.
  std::int32_t n_group = 0;
  std::int32_t topk_group = 0;
  // LoadAware: the window counts the layer's last `load_window` tokens; an
  // expert chosen for more than load_threshold of them is skipped while
  // better-than-nothing alternatives remain. Uniform load is top_k / n_experts.
  std::int32_t load_window = 64;
  double load_threshold = 0.5;
};

Status validate(const RoutingOptions& options, const RouterSpec& spec);

// Per-model state of a routing mode: the int8 router copies, the load
// windows. One instance per decoding thread (LoadAware keeps history);
// route() allocates nothing.
class ModeRouter {
 public:
  // routers: each MoE layer's router matrix (empty Matrix for dense layers).
  // Int8 mode quantizes them here.
  static Result<ModeRouter> create(const RoutingOptions& options, const RouterSpec& spec,
                                   std::span<const Matrix* const> routers);

  const RoutingOptions& options() const { return options_; }

  // Chooses experts for one token of `layer`. `logits` are the router's f32
  // logits (ignored by Int8, which scores `x`, and by Hash); `x` is the
  // normalised hidden state the router reads; `token` the input token id.
  // Outputs as route_top_k: probabilities (n_experts), experts and weights
  // (top_k) in descending order.
  Status route(std::int32_t layer, std::int32_t token, std::span<const float> x, std::span<const float> logits,
               std::span<float> probabilities, std::span<std::int32_t> experts, std::span<float> weights);

  // Experts skipped by the int8 early exit (Int8 mode), for the stats.
  std::uint64_t int8_rows_skipped() const { return rows_skipped_; }
  std::uint64_t int8_rows_scored() const { return rows_scored_; }

 private:
  struct Int8Layer {
    std::vector<std::int8_t> q;          // [n_experts][cols]
    std::vector<std::int64_t> suffix;    // [n_experts][chunks + 1]: sum of |q| from chunk c on
    float scale = 0.0f;                  // one for the tensor
    std::int32_t cols = 0;
  };
  struct LoadWindow {
    std::vector<std::int32_t> history;  // [load_window][top_k] ring of chosen experts, -1 empty
    std::vector<std::int32_t> counts;   // [n_experts]
    std::int32_t next = 0;
  };

  Status route_int8(std::int32_t layer, std::span<const float> x, std::span<float> probabilities,
                    std::span<std::int32_t> experts, std::span<float> weights);
  Status route_group_limited(std::span<const float> logits, std::span<float> probabilities,
                             std::span<std::int32_t> experts, std::span<float> weights);
  void route_hash(std::int32_t layer, std::int32_t token, std::span<float> probabilities,
                  std::span<std::int32_t> experts, std::span<float> weights) const;
  Status route_load_aware(std::int32_t layer, std::span<const float> logits, std::span<float> probabilities,
                          std::span<std::int32_t> experts, std::span<float> weights);

  RoutingOptions options_;
  RouterSpec spec_;
  std::vector<Int8Layer> int8_;      // per layer (empty for dense layers)
  std::vector<LoadWindow> windows_;  // per layer
  std::vector<std::int8_t> xq_;      // scratch: x quantized
  std::vector<std::uint8_t> mask_;   // scratch: experts allowed
  std::uint64_t rows_skipped_ = 0;
  std::uint64_t rows_scored_ = 0;
};

}  // namespace colibri
