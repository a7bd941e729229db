#include "runtime/logprobs.h"

#include <cmath>
#include <limits>

#include "kernels/kernels.h"

namespace colibri {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Plain int ORs over comparisons, which the compiler vectorises (a bool
// accumulator it does not).
bool has_nan(std::span<const float> logits) {
  int nan = 0;
  for (float v : logits) nan |= v != v;
  return nan != 0;
}

bool any_above_or_nan(const float* x, std::size_t n, float threshold) {
  int hit = 0;
  for (std::size_t i = 0; i < n; ++i) hit |= (x[i] > threshold) | (x[i] != x[i]);
  return hit != 0;
}

// Ranks the non-NaN logits into `out` by (logit descending, id ascending),
// holding each candidate's raw logit in .logprob meanwhile. Once `out` is
// full a logit enters only above the last one kept: one comparison with a
// register for nearly every logit. Returns how many were kept.
std::size_t rank_logits(std::span<const float> logits, std::span<TopLogprob> out) {
  std::size_t filled = 0;
  float threshold = std::numeric_limits<float>::quiet_NaN();  // unused until full
  constexpr std::size_t kBlock = 64;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    // Whole blocks below the threshold are passed over in one vector test.
    if (filled == out.size() && i % kBlock == 0 && i + kBlock <= logits.size() &&
        !any_above_or_nan(logits.data() + i, kBlock, threshold)) {
      i += kBlock - 1;
      continue;
    }
    const float v = logits[i];
    if (filled == out.size()) {
      if (!(v > threshold)) continue;  // also every NaN
    } else if (std::isnan(v)) {
      continue;
    }
    // Equal logits keep id order: a later id never passes an equal earlier one.
    std::size_t at = filled < out.size() ? filled++ : filled - 1;
    while (at > 0 && v > out[at - 1].logprob) {
      out[at] = out[at - 1];
      --at;
    }
    out[at] = TopLogprob{static_cast<std::int32_t>(i), v};
    if (filled == out.size()) threshold = out[filled - 1].logprob;
  }
  return filled;
}

// The exact rule for rows with NaN or infinities: log-sum-exp in double over
// the finite logits, or the +inf tokens sharing the mass.
struct Normaliser {
  double log_sum = 0.0;
  std::int32_t positive_infinities = 0;
};

Normaliser exact_normaliser(std::span<const float> logits) {
  Normaliser n;
  float max = -kInf;
  for (float v : logits) {
    if (v == kInf) ++n.positive_infinities;
    else if (v > max) max = v;  // false for NaN
  }
  if (n.positive_infinities > 0 || max == -kInf) {
    n.log_sum = n.positive_infinities > 0 ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
    return n;
  }
  double sum = 0.0;
  for (float v : logits)
    if (v >= -std::numeric_limits<float>::max()) sum += std::exp(static_cast<double>(v) - max);
  n.log_sum = max + std::log(sum);
  return n;
}

float exact_logprob(float logit, const Normaliser& n) {
  if (std::isnan(logit)) return -kInf;
  if (n.positive_infinities > 0)
    return logit == kInf ? static_cast<float>(-std::log(static_cast<double>(n.positive_infinities))) : -kInf;
  if (logit == -kInf) return -kInf;
  return static_cast<float>(static_cast<double>(logit) - n.log_sum);
}

}  // namespace

TokenLogprobs read_logprobs(std::span<float> logits, std::int32_t chosen, std::span<TopLogprob> top) {
  TokenLogprobs result;
  if (logits.empty()) {
    result.chosen = -kInf;
    return result;
  }
  // The most likely token is needed for the normaliser even when no
  // alternatives are asked for.
  TopLogprob best[1];
  const std::span<TopLogprob> ranked = top.empty() ? std::span<TopLogprob>(best) : top;
  const bool saw_nan = has_nan(logits);
  const std::size_t kept = rank_logits(logits, ranked);
  const bool in_row = chosen >= 0 && static_cast<std::size_t>(chosen) < logits.size();
  const float chosen_logit = in_row ? logits[static_cast<std::size_t>(chosen)] : std::numeric_limits<float>::quiet_NaN();
  const float max = kept > 0 ? ranked[0].logprob : -kInf;

  if (saw_nan || !std::isfinite(max)) {
    const Normaliser n = exact_normaliser(logits);
    result.chosen = exact_logprob(chosen_logit, n);
    for (std::size_t k = 0; k < kept; ++k) ranked[k].logprob = exact_logprob(ranked[k].logprob, n);
  } else {
    // softmax(max's position) = exp(0) / sum, so log(sum) = -log of it: one
    // vectorised pass of the kernels' softmax instead of a scalar exp per logit.
    const std::int32_t argmax = ranked[0].token;
    kernels::softmax(logits.data(), static_cast<std::int32_t>(logits.size()));
    const double log_sum = static_cast<double>(max) - std::log(static_cast<double>(logits[static_cast<std::size_t>(argmax)]));
    auto logprob = [&](float logit) {
      return logit == -kInf ? -kInf : static_cast<float>(static_cast<double>(logit) - log_sum);
    };
    result.chosen = in_row ? logprob(chosen_logit) : -kInf;
    for (std::size_t k = 0; k < kept; ++k) ranked[k].logprob = logprob(ranked[k].logprob);
  }
  result.top_count = top.empty() ? 0 : kept;
  return result;
}

TokenLogprob read_token_logprob(std::span<float> logits, std::int32_t token, std::int32_t top) {
  TokenLogprob entry;
  entry.token = token;
  entry.top.resize(static_cast<std::size_t>(top));
  const TokenLogprobs read = read_logprobs(logits, token, entry.top);
  entry.logprob = read.chosen;
  entry.top.resize(read.top_count);
  return entry;
}

}  // namespace colibri
