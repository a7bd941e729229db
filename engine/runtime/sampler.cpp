#include "runtime/sampler.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

namespace colibri {

namespace {

// Strict total order: higher logit first, then lower id. Because ids are
// unique, any correct sort yields the same sequence.
struct Ranks {
  template <typename C>
  bool operator()(const C& a, const C& b) const {
    if (a.logit != b.logit) return a.logit > b.logit;
    return a.id < b.id;
  }
};

// Chunk by which the ranked prefix grows while top_p looks for its cut.
constexpr std::size_t kTopPChunk = 64;

}  // namespace

Status validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return make_error("sampling: temperature must be finite and >= 0 (0 = greedy), got {}",
                      p.temperature);
  }
  if (p.top_k < 0) {
    return make_error("sampling: top_k must be >= 0 (0 = off), got {}", p.top_k);
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return make_error("sampling: top_p must be in (0, 1] (1 = off), got {}", p.top_p);
  }
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return make_error("sampling: min_p must be in [0, 1] (0 = off), got {}", p.min_p);
  }
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return make_error("sampling: repetition_penalty must be finite and > 0 (1 = off), got {}",
                      p.repetition_penalty);
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return make_error("sampling: presence_penalty must be in [-2, 2] (0 = off), got {}",
                      p.presence_penalty);
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return make_error("sampling: frequency_penalty must be in [-2, 2] (0 = off), got {}",
                      p.frequency_penalty);
  }
  if (p.logit_bias.size() > kMaxLogitBias) {
    return make_error("sampling: logit_bias has {} entries; at most {} are allowed", p.logit_bias.size(),
                      kMaxLogitBias);
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0) return make_error("sampling: logit_bias token id must be >= 0, got {}", id);
    if (!(bias >= -100.0f && bias <= 100.0f))
      return make_error("sampling: logit_bias for token {} must be in [-100, 100], got {}", id, bias);
  }
  if (p.penalty_last_n < -1) {
    return make_error("sampling: penalty_last_n must be >= -1 (-1 = whole history, 0 = off), got {}",
                      p.penalty_last_n);
  }
  return Status::Ok();
}

Sampler::Sampler(const SamplingParams& params, std::int32_t vocab_size)
    : params_(params), vocab_size_(std::max<std::int32_t>(vocab_size, 0)), rng_(params.seed) {
  assert(validate(params).ok());
  assert(vocab_size > 0);
  const auto n = static_cast<std::size_t>(vocab_size_);
  candidates_.resize(n);
  weights_.resize(n);
  counts_.assign(n, 0);
  touched_.resize(n);
}

void Sampler::reseed(std::uint64_t seed) {
  params_.seed = seed;
  rng_.seed(seed);
}

void Sampler::apply_penalties(std::span<float> logits, std::span<const std::int32_t> history) {
  const bool active = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                      params_.frequency_penalty != 0.0f;
  if (!active || params_.penalty_last_n == 0 || history.empty()) return;
  if (params_.penalty_last_n > 0 &&
      history.size() > static_cast<std::size_t>(params_.penalty_last_n)) {
    history = history.last(static_cast<std::size_t>(params_.penalty_last_n));
  }

  const std::size_t vocab = logits.size();
  std::size_t touched = 0;
  for (std::int32_t id : history) {
    if (id < 0 || static_cast<std::size_t>(id) >= vocab) continue;
    if (counts_[id]++ == 0) touched_[touched++] = id;
  }

  const float r = params_.repetition_penalty;
  for (std::size_t i = 0; i < touched; ++i) {
    const std::int32_t id = touched_[i];
    const std::int32_t count = counts_[id];
    counts_[id] = 0;  // leave the count array all-zero for the next call
    float& logit = logits[id];
    if (r != 1.0f) logit = logit > 0.0f ? logit / r : logit * r;
    logit -= static_cast<float>(count) * params_.frequency_penalty + params_.presence_penalty;
  }
}

// Fills candidates_ (in id order) with the selectable tokens; returns how many.
std::size_t Sampler::gather(std::span<const float> logits) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  bool any_pos_inf = false;
  for (float l : logits) any_pos_inf |= (l == kInf);

  std::size_t n = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float l = logits[i];
    if (any_pos_inf) {
      // +inf dominates everything: uniform over the +inf tokens.
      if (l == kInf) candidates_[n++] = {0.0f, static_cast<std::int32_t>(i)};
    } else if (std::isfinite(l)) {  // drops NaN and -inf
      candidates_[n++] = {l, static_cast<std::int32_t>(i)};
    }
  }
  sorted_ = 0;
  return n;
}

// Extends the ranked prefix of candidates_[0, n) to at least m entries.
// Invariant: every entry in [0, sorted_) outranks every entry in [sorted_, n).
void Sampler::sort_prefix(std::size_t n, std::size_t m) {
  m = std::min(m, n);
  if (m <= sorted_) return;
  auto first = candidates_.begin() + static_cast<std::ptrdiff_t>(sorted_);
  auto middle = candidates_.begin() + static_cast<std::ptrdiff_t>(m);
  auto last = candidates_.begin() + static_cast<std::ptrdiff_t>(n);
  if (middle != last) std::nth_element(first, middle, last, Ranks{});
  std::sort(first, middle, Ranks{});
  sorted_ = m;
}

float Sampler::max_logit(std::size_t n) const {
  if (sorted_ > 0) return candidates_[0].logit;
  float best = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < n; ++i) best = std::max(best, candidates_[i].logit);
  return best;
}

std::size_t Sampler::top_k(std::size_t n) {
  const auto k = static_cast<std::size_t>(params_.top_k);
  if (params_.top_k <= 0 || k >= n) return n;
  // O(V) selection, then rank just the k survivors (canonical order for the draw).
  sort_prefix(n, k);
  return k;
}

std::size_t Sampler::top_p(std::size_t n) {
  if (params_.top_p >= 1.0f || n <= 1) return n;
  const float lmax = max_logit(n);
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) total += std::exp(candidates_[i].logit - lmax);
  const double target = static_cast<double>(params_.top_p) * total;

  // Walk the ranked prefix, ranking more of the vocabulary only as needed,
  // until the kept mass reaches top_p (the crossing token is kept).
  double mass = 0.0;
  std::size_t keep = 0;
  while (keep < n) {
    if (keep == sorted_) sort_prefix(n, std::max(2 * sorted_, kTopPChunk));
    mass += std::exp(candidates_[keep].logit - lmax);
    ++keep;
    if (mass >= target) break;
  }
  return keep;
}

std::size_t Sampler::min_p(std::size_t n) {
  if (params_.min_p <= 0.0f || n <= 1) return n;
  // p_i >= min_p * p_max  <=>  logit_i - logit_max >= log(min_p)
  const float lmax = max_logit(n);
  const float log_min_p = std::log(params_.min_p);
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i) {  // stable: keeps the canonical order
    if (candidates_[i].logit - lmax >= log_min_p) candidates_[kept++] = candidates_[i];
  }
  // A ranked prefix stays ranked (the kept entries of a ranked range are its head).
  sorted_ = std::min(sorted_, kept);
  return kept;
}

std::int32_t Sampler::draw(std::size_t n) {
  const float lmax = max_logit(n);
  const float inv_t = 1.0f / params_.temperature;
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const float w = std::exp((candidates_[i].logit - lmax) * inv_t);
    weights_[i] = w;
    total += w;
  }
  // Top 53 bits of one mt19937_64 output -> double in [0, 1); portable.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  const double target = u * total;
  double cumulative = 0.0;
  std::size_t last_positive = n;
  for (std::size_t i = 0; i < n; ++i) {
    if (!(weights_[i] > 0.0f)) continue;
    cumulative += weights_[i];
    last_positive = i;
    if (cumulative > target) return candidates_[i].id;
  }
  // Only reached through rounding (u * total rounded up to total).
  return last_positive < n ? candidates_[last_positive].id : candidates_[0].id;
}

std::int32_t Sampler::sample(std::span<float> logits, std::span<const std::int32_t> history) {
  assert(logits.size() == static_cast<std::size_t>(vocab_size_));
  if (logits.size() > static_cast<std::size_t>(vocab_size_)) {
    logits = logits.first(static_cast<std::size_t>(vocab_size_));
  }
  for (const auto& [id, bias] : params_.logit_bias)
    if (id < vocab_size_) logits[static_cast<std::size_t>(id)] += bias;
  apply_penalties(logits, history);

  // A temperature so small that 1/T overflows (below about 2.9e-39) is the
  // limit T -> 0: greedy. Sampled, the best candidate's weight was
  // exp(0 * inf) = NaN and the draw fell through to the lowest id.
  if (params_.temperature == 0.0f || !std::isfinite(1.0f / params_.temperature)) {
    // Strict '>' keeps the lowest id on ties and never selects NaN or -inf.
    std::int32_t best_id = kNoToken;
    float best = -std::numeric_limits<float>::infinity();
    for (std::size_t i = 0; i < logits.size(); ++i) {
      if (logits[i] > best) {
        best = logits[i];
        best_id = static_cast<std::int32_t>(i);
      }
    }
    return best_id;
  }

  std::size_t n = gather(logits);
  if (n == 0) return kNoToken;
  n = top_k(n);
  n = top_p(n);
  n = min_p(n);
  return draw(n);
}

}  // namespace colibri
