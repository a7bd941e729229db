#include "moe/routing_modes.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>

#include "kernels/quantize.h"

namespace colibri {
namespace {

// Columns per step of the int8 scan: after each, the row's best possible
// final score is checked against the current k-th best.
constexpr std::int32_t kInt8Chunk = 256;
constexpr std::int32_t kMaxTopK = 64;

constexpr std::array<std::string_view, 5> kModeNames = {"standard", "int8", "group-limited", "hash", "load-aware"};

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Inserts (score, e) into a descending list of at most k, ties to the lower
// index (experts arrive in ascending order, so only a strictly better score
// moves ahead).
template <class Score>
void insert_top(Score score, std::int32_t e, std::size_t k, std::size_t& filled, Score* scores, std::int32_t* experts) {
  if (filled == k && !(score > scores[k - 1])) return;
  std::size_t slot = filled < k ? filled++ : k - 1;
  while (slot > 0 && score > scores[slot - 1]) {
    scores[slot] = scores[slot - 1];
    experts[slot] = experts[slot - 1];
    --slot;
  }
  scores[slot] = score;
  experts[slot] = e;
}

void normalize(std::span<float> weights) {
  float sum = 0.0f;
  for (float w : weights) sum += w;
  for (float& w : weights) w /= sum;
}

}  // namespace

std::string_view routing_mode_name(RoutingMode mode) { return kModeNames[static_cast<std::size_t>(mode)]; }

std::optional<RoutingMode> routing_mode_from_name(std::string_view name) {
  for (std::size_t i = 0; i < kModeNames.size(); ++i)
    if (name == kModeNames[i]) return static_cast<RoutingMode>(i);
  return std::nullopt;
}

Status validate(const RoutingOptions& options, const RouterSpec& spec) {
  if (Status s = validate(spec); !s.ok()) return s;
  if (spec.top_k > kMaxTopK) return make_error("routing modes support top_k up to {}, got {}", kMaxTopK, spec.top_k);
  switch (options.mode) {
    case RoutingMode::GroupLimited: {
      if (options.n_group < 1 || spec.n_experts % options.n_group != 0)
        return make_error("routing n_group must divide the {} experts into equal groups, got {}", spec.n_experts,
                          options.n_group);
      if (options.topk_group < 1 || options.topk_group > options.n_group)
        return make_error("routing topk_group must be in [1, {}] (n_group), got {}", options.n_group,
                          options.topk_group);
      const std::int32_t reachable = options.topk_group * (spec.n_experts / options.n_group);
      if (reachable < spec.top_k)
        return make_error("routing topk_group {} of {} groups reaches only {} experts, fewer than top_k {}",
                          options.topk_group, options.n_group, reachable, spec.top_k);
      break;
    }
    case RoutingMode::LoadAware:
      if (options.load_window < 1 || options.load_window > 1 << 20)
        return make_error("routing load_window must be in [1, 1048576] tokens, got {}", options.load_window);
      if (!(options.load_threshold > 0.0 && options.load_threshold <= 1.0))
        return make_error("routing load_threshold must be in (0, 1] (a share of the window's tokens), got {}",
                          options.load_threshold);
      break;
    default:
      break;
  }
  return Status::Ok();
}

Result<ModeRouter> ModeRouter::create(const RoutingOptions& options, const RouterSpec& spec,
                                      std::span<const Matrix* const> routers) {
  COLIBRI_TRY(validate(options, spec));
  ModeRouter r;
  r.options_ = options;
  r.spec_ = spec;
  const std::size_t n = static_cast<std::size_t>(spec.n_experts);
  r.mask_.resize(n);
  if (options.mode == RoutingMode::Int8) {
    r.int8_.resize(routers.size());
    std::int32_t max_cols = 0;
    for (std::size_t l = 0; l < routers.size(); ++l) {
      const Matrix* m = routers[l];
      if (m == nullptr || m->empty()) continue;
      if (m->rows != spec.n_experts)
        return make_error("int8 routing: layer {} router has {} rows, expected {} experts", l, m->rows,
                          spec.n_experts);
      Int8Layer& layer = r.int8_[l];
      layer.cols = m->cols;
      max_cols = std::max(max_cols, m->cols);
      std::vector<float> rows(n * static_cast<std::size_t>(m->cols));
      float max_abs = 0.0f;
      for (std::int32_t e = 0; e < m->rows; ++e) {
        float* row = rows.data() + static_cast<std::size_t>(e) * m->cols;
        dequantize_row(*m, e, row);
        for (std::int32_t c = 0; c < m->cols; ++c) max_abs = std::max(max_abs, std::fabs(row[c]));
      }
      layer.scale = max_abs > 0.0f ? max_abs / 127.0f : 1.0f;
      layer.q.resize(rows.size());
      for (std::size_t i = 0; i < rows.size(); ++i)
        layer.q[i] = static_cast<std::int8_t>(std::lrint(std::clamp(rows[i] / layer.scale, -127.0f, 127.0f)));
      const std::int32_t chunks = (m->cols + kInt8Chunk - 1) / kInt8Chunk;
      layer.suffix.assign(n * static_cast<std::size_t>(chunks + 1), 0);
      for (std::size_t e = 0; e < n; ++e) {
        std::int64_t* suffix = layer.suffix.data() + e * static_cast<std::size_t>(chunks + 1);
        for (std::int32_t c = chunks - 1; c >= 0; --c) {
          std::int64_t s = 0;
          for (std::int32_t j = c * kInt8Chunk; j < std::min(m->cols, (c + 1) * kInt8Chunk); ++j)
            s += std::abs(static_cast<std::int32_t>(layer.q[e * static_cast<std::size_t>(m->cols) + j]));
          suffix[c] = suffix[c + 1] + s;
        }
      }
    }
    r.xq_.resize(static_cast<std::size_t>(max_cols));
  }
  if (options.mode == RoutingMode::LoadAware) {
    r.windows_.resize(routers.size());
    for (LoadWindow& w : r.windows_) {
      w.history.assign(static_cast<std::size_t>(options.load_window) * spec.top_k, -1);
      w.counts.assign(n, 0);
    }
  }
  return r;
}

Status ModeRouter::route(std::int32_t layer, std::int32_t token, std::span<const float> x,
                         std::span<const float> logits, std::span<float> probabilities,
                         std::span<std::int32_t> experts, std::span<float> weights) {
  switch (options_.mode) {
    case RoutingMode::Standard:
      return route_top_k(spec_, logits, probabilities, experts, weights);
    case RoutingMode::Int8:
      return route_int8(layer, x, probabilities, experts, weights);
    case RoutingMode::GroupLimited:
      return route_group_limited(logits, probabilities, experts, weights);
    case RoutingMode::Hash:
      if (experts.size() != static_cast<std::size_t>(spec_.top_k) ||
          probabilities.size() != static_cast<std::size_t>(spec_.n_experts))
        return make_error("router: expected room for {} experts", spec_.top_k);
      route_hash(layer, token, probabilities, experts, weights);
      return Status::Ok();
    case RoutingMode::LoadAware:
      return route_load_aware(layer, logits, probabilities, experts, weights);
  }
  return make_error("unknown routing mode");
}

Status ModeRouter::route_int8(std::int32_t layer, std::span<const float> x, std::span<float> probabilities,
                              std::span<std::int32_t> experts, std::span<float> weights) {
  if (layer < 0 || static_cast<std::size_t>(layer) >= int8_.size() || int8_[layer].q.empty())
    return make_error("int8 routing: layer {} has no router", layer);
  const Int8Layer& L = int8_[static_cast<std::size_t>(layer)];
  if (x.size() != static_cast<std::size_t>(L.cols))
    return make_error("int8 routing: expected a hidden state of {} values, got {}", L.cols, x.size());
  const auto n = static_cast<std::size_t>(spec_.n_experts);
  const auto k = static_cast<std::size_t>(spec_.top_k);
  if (experts.size() != k || weights.size() != k || probabilities.size() != n)
    return make_error("router: expected room for {} experts", k);

  float max_abs = 0.0f;
  for (float v : x) {
    if (!std::isfinite(v)) return make_error("int8 routing: the hidden state is not finite");
    max_abs = std::max(max_abs, std::fabs(v));
  }
  const float x_scale = max_abs > 0.0f ? max_abs / 127.0f : 1.0f;
  std::int32_t x_max = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    xq_[i] = static_cast<std::int8_t>(std::lrint(std::clamp(x[i] / x_scale, -127.0f, 127.0f)));
    x_max = std::max(x_max, std::abs(static_cast<std::int32_t>(xq_[i])));
  }

  // Without renormalisation over the chosen k the weights need every logit
  // (the softmax denominator), so every row is scored in full.
  const bool may_skip = spec_.normalize_top_k;
  const std::int32_t chunks = (L.cols + kInt8Chunk - 1) / kInt8Chunk;
  std::int64_t scores[kMaxTopK];
  std::int32_t* chosen = experts.data();
  std::size_t filled = 0;
  for (std::size_t e = 0; e < n; ++e) {
    const std::int8_t* row = L.q.data() + e * static_cast<std::size_t>(L.cols);
    const std::int64_t* suffix = L.suffix.data() + e * static_cast<std::size_t>(chunks + 1);
    std::int64_t acc = 0;
    bool skipped = false;
    for (std::int32_t c = 0; c < chunks; ++c) {
      const std::int32_t end = std::min(L.cols, (c + 1) * kInt8Chunk);
      std::int32_t part = 0;
      for (std::int32_t j = c * kInt8Chunk; j < end; ++j)
        part += static_cast<std::int32_t>(row[j]) * static_cast<std::int32_t>(xq_[static_cast<std::size_t>(j)]);
      acc += part;
      // The rest of the row adds at most x_max * sum|q| of what is left.
      if (may_skip && filled == k && acc + x_max * suffix[c + 1] <= scores[k - 1]) {
        skipped = true;
        break;
      }
    }
    if (skipped) {
      ++rows_skipped_;
      probabilities[e] = -INFINITY;  // marks "not scored" below
      continue;
    }
    ++rows_scored_;
    probabilities[e] = static_cast<float>(acc) * L.scale * x_scale;  // the logit, for now
    insert_top(acc, static_cast<std::int32_t>(e), k, filled, scores, chosen);
  }
  // Softmax over the scored logits; an expert skipped by the early exit
  // reports probability 0.
  float max_logit = -INFINITY;
  for (std::size_t e = 0; e < n; ++e) max_logit = std::fmax(max_logit, probabilities[e]);
  float sum = 0.0f;
  for (std::size_t e = 0; e < n; ++e) {
    probabilities[e] = std::isinf(probabilities[e]) ? 0.0f : std::exp(probabilities[e] - max_logit);
    sum += probabilities[e];
  }
  for (std::size_t e = 0; e < n; ++e) probabilities[e] /= sum;
  for (std::size_t i = 0; i < k; ++i) weights[i] = probabilities[static_cast<std::size_t>(chosen[i])];
  if (spec_.normalize_top_k) normalize(weights);
  return Status::Ok();
}

Status ModeRouter::route_group_limited(std::span<const float> logits, std::span<float> probabilities,
                                       std::span<std::int32_t> experts, std::span<float> weights) {
  // Softmax first (route_top_k_masked recomputes it identically), then the
  // best expert probability of each group ranks the groups.
  COLIBRI_TRY(route_top_k_masked(spec_, logits, {}, probabilities, experts, weights));
  const std::int32_t per_group = spec_.n_experts / options_.n_group;
  float group_best[256];
  std::int32_t group_order[256];
  if (options_.n_group > 256) return make_error("group-limited routing supports at most 256 groups");
  std::size_t filled = 0;
  for (std::int32_t g = 0; g < options_.n_group; ++g) {
    float best = 0.0f;
    for (std::int32_t e = g * per_group; e < (g + 1) * per_group; ++e) best = std::max(best, probabilities[e]);
    insert_top(best, g, static_cast<std::size_t>(options_.topk_group), filled, group_best, group_order);
  }
  std::fill(mask_.begin(), mask_.end(), 0);
  for (std::size_t i = 0; i < filled; ++i)
    for (std::int32_t e = group_order[i] * per_group; e < (group_order[i] + 1) * per_group; ++e) mask_[e] = 1;
  return route_top_k_masked(spec_, logits, mask_, probabilities, experts, weights);
}

void ModeRouter::route_hash(std::int32_t layer, std::int32_t token, std::span<float> probabilities,
                            std::span<std::int32_t> experts, std::span<float> weights) const {
  std::fill(probabilities.begin(), probabilities.end(), 0.0f);
  const auto k = static_cast<std::size_t>(spec_.top_k);
  std::uint64_t state = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(token)) << 32) ^
                        static_cast<std::uint32_t>(layer);
  for (std::size_t i = 0; i < k; ++i) {
    std::int32_t e = 0;
    bool fresh = false;
    while (!fresh) {
      state = splitmix64(state);
      e = static_cast<std::int32_t>(state % static_cast<std::uint64_t>(spec_.n_experts));
      fresh = std::find(experts.begin(), experts.begin() + static_cast<std::ptrdiff_t>(i), e) ==
              experts.begin() + static_cast<std::ptrdiff_t>(i);
    }
    experts[i] = e;
    weights[i] = 1.0f / static_cast<float>(k);
    probabilities[static_cast<std::size_t>(e)] = weights[i];
  }
}

Status ModeRouter::route_load_aware(std::int32_t layer, std::span<const float> logits, std::span<float> probabilities,
                                    std::span<std::int32_t> experts, std::span<float> weights) {
  if (layer < 0 || static_cast<std::size_t>(layer) >= windows_.size())
    return make_error("load-aware routing: layer {} is outside the model", layer);
  LoadWindow& w = windows_[static_cast<std::size_t>(layer)];
  const auto n = static_cast<std::size_t>(spec_.n_experts);
  const auto k = static_cast<std::size_t>(spec_.top_k);
  // A share of the whole window, not of the tokens seen so far, so the first
  // tokens after a start do not count as overload.
  const double limit = options_.load_threshold * options_.load_window;
  std::size_t allowed = 0;
  for (std::size_t e = 0; e < n; ++e) {
    mask_[e] = w.counts[e] <= limit ? 1 : 0;
    allowed += mask_[e];
  }
  // Fewer candidates than k: every expert is busy, so nobody is skipped.
  std::span<const std::uint8_t> mask = allowed >= k ? std::span<const std::uint8_t>(mask_) : std::span<const std::uint8_t>();
  COLIBRI_TRY(route_top_k_masked(spec_, logits, mask, probabilities, experts, weights));
  std::int32_t* slot = w.history.data() + static_cast<std::size_t>(w.next) * k;
  for (std::size_t i = 0; i < k; ++i) {
    if (slot[i] >= 0) --w.counts[static_cast<std::size_t>(slot[i])];
    slot[i] = experts[i];
    ++w.counts[static_cast<std::size_t>(experts[i])];
  }
  w.next = (w.next + 1) % options_.load_window;
  return Status::Ok();
}

}  // namespace colibri
