#include "runtime/sampler.h"

#include "runtime/logprobs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

// Counts global allocations so a test can check that sample() makes none.
// noinline: once inlined, g++ flags the malloc/free pairing as a mismatch.
namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};
}  // namespace

[[gnu::noinline]] void* operator new(std::size_t size) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace colibri {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

SamplingParams greedy() { return SamplingParams{}; }

SamplingParams at_temperature(float t, std::uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = t;
  p.seed = seed;
  return p;
}

std::int32_t sample_once(const SamplingParams& params, std::vector<float> logits,
                         std::vector<std::int32_t> history = {}) {
  Sampler sampler(params, static_cast<std::int32_t>(logits.size()));
  return sampler.sample(logits, history);
}

// Draws `draws` tokens from the same logits and returns the count of each id.
std::vector<int> histogram(const SamplingParams& params, const std::vector<float>& logits,
                           int draws) {
  Sampler sampler(params, static_cast<std::int32_t>(logits.size()));
  std::vector<int> counts(logits.size(), 0);
  std::vector<float> work;
  for (int i = 0; i < draws; ++i) {
    work = logits;
    const std::int32_t id = sampler.sample(work, {});
    EXPECT_GE(id, 0);
    EXPECT_LT(id, static_cast<std::int32_t>(logits.size()));
    if (id >= 0 && id < static_cast<std::int32_t>(logits.size())) ++counts[id];
  }
  return counts;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  const double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - mx) / temperature);
  for (double& x : p) x /= sum;
  return p;
}

// Empirical frequencies must match `expected` within 5 standard errors of a
// binomial proportion with `draws` trials (the seed is fixed, so this is
// deterministic; the bound only has to be loose enough for a correct sampler).
void expect_frequencies(const std::vector<int>& counts, const std::vector<double>& expected,
                        int draws) {
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double p = expected[i];
    const double tolerance = 5.0 * std::sqrt(p * (1.0 - p) / draws) + 1.0 / draws;
    EXPECT_NEAR(static_cast<double>(counts[i]) / draws, p, tolerance) << "token " << i;
  }
}

std::vector<float> random_logits(std::size_t n, std::uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 rng(seed);
  std::vector<float> out(n);
  for (float& x : out) x = scale * static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-53 - 0.5) * 2.0f;
  return out;
}

// ---------------------------------------------------------------- greedy

TEST(Sampler, GreedyPicksArgmax) {
  EXPECT_EQ(sample_once(greedy(), {0.1f, 2.5f, -1.0f, 2.4f}), 1);
  EXPECT_EQ(sample_once(greedy(), {-5.0f, -3.0f, -4.0f}), 1);
  EXPECT_EQ(sample_once(greedy(), {1.0f, 0.0f, 0.0f, 3.0f}), 3);
}

// A subnormal temperature (valid: finite, >= 0) overflows 1/T; it samples as
// its limit, greedy, not as the lowest id.
TEST(Sampler, ATemperatureWhoseInverseOverflowsIsGreedy) {
  for (float t : {1e-39f, 1e-45f, 2e-39f}) {
    EXPECT_EQ(sample_once(at_temperature(t), {0.1f, 2.5f, -1.0f, 2.4f}), 1) << t;
    EXPECT_EQ(sample_once(at_temperature(t), {-5.0f, -3.0f, -4.0f, 7.0f}), 3) << t;
  }
}

TEST(Sampler, GreedyTiesGoToLowestId) {
  EXPECT_EQ(sample_once(greedy(), {1.0f, 3.0f, 3.0f, 3.0f}), 1);
  EXPECT_EQ(sample_once(greedy(), {0.0f, 0.0f, 0.0f}), 0);
  EXPECT_EQ(sample_once(greedy(), {-1.0f, 2.0f, 0.0f, 2.0f}), 1);
}

// ---------------------------------------------------------------- non-finite

TEST(Sampler, GreedySkipsNaN) {
  EXPECT_EQ(sample_once(greedy(), {kNaN, 1.0f, 2.0f, kNaN}), 2);
  EXPECT_EQ(sample_once(greedy(), {kNaN, -1.0f}), 1);
  EXPECT_EQ(sample_once(greedy(), {-kInf, kNaN, -7.0f}), 2);
}

TEST(Sampler, SampledNeverPicksNaNOrMaskedTokens) {
  const std::vector<float> logits{kNaN, 0.0f, kNaN, 0.5f, -kInf, 0.2f, kNaN};
  for (float t : {0.5f, 1.0f, 5.0f}) {
    SamplingParams p = at_temperature(t, 42);
    for (int variant = 0; variant < 4; ++variant) {
      p.top_k = variant == 1 ? 3 : 0;
      p.top_p = variant == 2 ? 0.9f : 1.0f;
      p.min_p = variant == 3 ? 0.05f : 0.0f;
      const auto counts = histogram(p, logits, 2000);
      EXPECT_EQ(counts[0] + counts[2] + counts[4] + counts[6], 0) << "t=" << t << " variant " << variant;
      EXPECT_EQ(counts[1] + counts[3] + counts[5], 2000);
    }
  }
}

TEST(Sampler, NaNWithPenaltiesDoesNotSpread) {
  SamplingParams p = at_temperature(1.0f);
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.5f;
  Sampler sampler(p, 4);
  for (int i = 0; i < 200; ++i) {
    std::vector<float> logits{kNaN, 1.0f, kNaN, 0.0f};
    const std::vector<std::int32_t> history{0, 0, 1, 2, 3};
    const std::int32_t id = sampler.sample(logits, history);
    EXPECT_TRUE(id == 1 || id == 3) << id;
  }
}

TEST(Sampler, AllUnselectableReturnsNoToken) {
  EXPECT_EQ(sample_once(greedy(), {kNaN, kNaN}), Sampler::kNoToken);
  EXPECT_EQ(sample_once(at_temperature(1.0f), {kNaN, -kInf, kNaN}), Sampler::kNoToken);
  SamplingParams p = at_temperature(0.7f);
  p.top_k = 2;
  p.top_p = 0.5f;
  p.min_p = 0.1f;
  EXPECT_EQ(sample_once(p, {-kInf, -kInf, kNaN}), Sampler::kNoToken);
}

TEST(Sampler, PositiveInfinityWins) {
  EXPECT_EQ(sample_once(greedy(), {1.0f, kInf, kNaN, kInf}), 1);
  const auto counts = histogram(at_temperature(1.0f, 3), {1e30f, kInf, kNaN, kInf, 5.0f}, 4000);
  EXPECT_EQ(counts[0] + counts[2] + counts[4], 0);
  // Uniform over the two +inf tokens.
  expect_frequencies({counts[1], counts[3]}, {0.5, 0.5}, 4000);
}

// ---------------------------------------------------------------- truncation

TEST(Sampler, TopK1EqualsGreedyAtAnyTemperature) {
  for (std::uint64_t trial = 0; trial < 20; ++trial) {
    std::vector<float> logits = random_logits(257, trial);
    if (trial % 4 == 0) logits[200] = logits[17] = 100.0f;  // a tie at the top
    const std::int32_t expected = sample_once(greedy(), logits);
    for (float t : {0.01f, 0.7f, 1.0f, 2.0f, 50.0f}) {
      SamplingParams p = at_temperature(t, trial);
      p.top_k = 1;
      Sampler sampler(p, static_cast<std::int32_t>(logits.size()));
      for (int i = 0; i < 20; ++i) {
        auto work = logits;
        ASSERT_EQ(sampler.sample(work, {}), expected) << "trial " << trial << " t=" << t;
      }
    }
  }
}

TEST(Sampler, TopKKeepsOnlyTheKBest) {
  const std::vector<float> logits{0.0f, 3.0f, 1.0f, 2.9f, 2.8f, -1.0f, 0.5f};
  SamplingParams p = at_temperature(5.0f, 9);  // flat: every kept token shows up
  p.top_k = 3;
  const auto counts = histogram(p, logits, 3000);
  for (int id : {0, 2, 5, 6}) EXPECT_EQ(counts[id], 0) << id;
  for (int id : {1, 3, 4}) EXPECT_GT(counts[id], 0) << id;
  // Renormalised over the survivors at temperature 5.
  const auto expected = softmax({3.0f, 2.9f, 2.8f}, 5.0);
  expect_frequencies({counts[1], counts[3], counts[4]}, expected, 3000);
}

TEST(Sampler, TopKLargerThanVocabIsOff) {
  const std::vector<float> logits{0.0f, 0.3f, 0.1f};
  SamplingParams p = at_temperature(1.0f, 11);
  p.top_k = 1000;
  expect_frequencies(histogram(p, logits, 6000), softmax(logits, 1.0), 6000);
}

TEST(Sampler, TinyTopPKeepsOnlyTheBest) {
  const std::vector<float> logits{0.5f, 0.9f, 0.89f, 0.0f, 0.7f};
  SamplingParams p = at_temperature(3.0f, 5);
  p.top_p = 1e-6f;
  const auto counts = histogram(p, logits, 1000);
  EXPECT_EQ(counts[1], 1000);
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingP) {
  // p = {0.5, 0.3, 0.2}: top_p 0.6 needs the first two tokens.
  const std::vector<float> logits{std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SamplingParams p = at_temperature(1.0f, 8);
  p.top_p = 0.6f;
  const auto counts = histogram(p, logits, 4000);
  EXPECT_EQ(counts[2], 0);
  expect_frequencies({counts[0], counts[1]}, {0.5 / 0.8, 0.3 / 0.8}, 4000);
}

TEST(Sampler, TopPOverLargeVocabMatchesFullSortReference) {
  // Exercises the incremental ranking (the nucleus is far wider than one chunk).
  const std::size_t vocab = 5000;
  const std::vector<float> logits = random_logits(vocab, 77, 2.0f);
  const float top_p = 0.9f;
  std::vector<std::int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  const auto probs = softmax(logits, 1.0);
  std::vector<bool> in_nucleus(vocab, false);
  double mass = 0;
  std::size_t nucleus = 0;
  for (std::int32_t id : order) {
    in_nucleus[id] = true;
    ++nucleus;
    mass += probs[id];
    if (mass >= top_p) break;
  }
  ASSERT_GT(nucleus, 500u);
  ASSERT_LT(nucleus, vocab);

  SamplingParams p = at_temperature(1.0f, 21);
  p.top_p = top_p;
  Sampler sampler(p, static_cast<std::int32_t>(vocab));
  std::vector<float> work;
  std::size_t distinct = 0;
  std::vector<bool> seen(vocab, false);
  for (int i = 0; i < 3000; ++i) {
    work = logits;
    const std::int32_t id = sampler.sample(work, {});
    ASSERT_TRUE(id >= 0 && static_cast<std::size_t>(id) < vocab);
    ASSERT_TRUE(in_nucleus[id]) << "token " << id << " is outside the nucleus";
    if (!seen[id]) ++distinct, seen[id] = true;
  }
  EXPECT_GT(distinct, 300u);  // the draw really spans the nucleus
}

TEST(Sampler, MinPFilters) {
  // p = {0.5, 0.3, 0.15, 0.05}; min_p 0.25 -> threshold 0.125 keeps ids 0..2.
  const std::vector<float> logits{std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SamplingParams p = at_temperature(1.0f, 4);
  p.min_p = 0.25f;
  const auto counts = histogram(p, logits, 4000);
  EXPECT_EQ(counts[3], 0);
  expect_frequencies({counts[0], counts[1], counts[2]}, {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95}, 4000);

  p.min_p = 1.0f;  // only the top survives
  EXPECT_EQ(histogram(p, logits, 500)[0], 500);
}

TEST(Sampler, FiltersRunBeforeTemperature) {
  // min_p is judged at temperature 1: p1/p0 = 0.4 >= 0.3, so id 1 survives
  // even though at T = 0.25 its ratio would be 0.4^4 = 0.0256.
  const std::vector<float> logits{std::log(0.5f), std::log(0.2f), std::log(0.3f) - 10.0f};
  SamplingParams p = at_temperature(0.25f, 6);
  p.min_p = 0.3f;
  const auto counts = histogram(p, logits, 8000);
  EXPECT_EQ(counts[2], 0);
  const double r = std::pow(0.4, 4.0);
  expect_frequencies({counts[0], counts[1]}, {1.0 / (1.0 + r), r / (1.0 + r)}, 8000);
}

TEST(Sampler, TopPRunsOnTheTopKSurvivors) {
  // p = {0.4, 0.35, 0.25}. After top_k = 2 the survivors are {0.533, 0.467},
  // so top_p 0.5 keeps only id 0. (Top-p over the full set would keep 0 and 1.)
  const std::vector<float> logits{std::log(0.4f), std::log(0.35f), std::log(0.25f)};
  SamplingParams p = at_temperature(1.0f, 12);
  p.top_k = 2;
  p.top_p = 0.5f;
  EXPECT_EQ(histogram(p, logits, 1000)[0], 1000);
  p.top_k = 0;
  const auto counts = histogram(p, logits, 1000);
  EXPECT_EQ(counts[2], 0);
  EXPECT_GT(counts[1], 0);
}

// ---------------------------------------------------------------- temperature

TEST(Sampler, TemperatureShapesTheDistribution) {
  const std::vector<float> logits{1.0f, 0.5f, 0.0f, -1.0f};
  const int draws = 20000;
  const auto at_one = histogram(at_temperature(1.0f, 100), logits, draws);
  const auto sharp = histogram(at_temperature(0.5f, 100), logits, draws);
  const auto flat = histogram(at_temperature(2.0f, 100), logits, draws);
  expect_frequencies(at_one, softmax(logits, 1.0), draws);
  expect_frequencies(sharp, softmax(logits, 0.5), draws);
  expect_frequencies(flat, softmax(logits, 2.0), draws);

  // Sharpening measurably moves mass to the top token, flattening away from it.
  const double se = std::sqrt(0.25 / draws);
  EXPECT_GT(static_cast<double>(sharp[0] - at_one[0]) / draws, 10 * se);
  EXPECT_GT(static_cast<double>(at_one[0] - flat[0]) / draws, 10 * se);
}

// ---------------------------------------------------------------- seeds

std::vector<std::int32_t> sequence(Sampler& sampler, const std::vector<float>& logits, int n) {
  std::vector<std::int32_t> out;
  std::vector<float> work;
  for (int i = 0; i < n; ++i) {
    work = logits;
    out.push_back(sampler.sample(work, {}));
  }
  return out;
}

TEST(Sampler, SameSeedSameSequence) {
  const std::vector<float> logits = random_logits(100, 5, 1.0f);
  SamplingParams p = at_temperature(1.0f, 1234);
  p.top_k = 50;
  p.top_p = 0.95f;
  Sampler a(p, 100), b(p, 100);
  const auto first = sequence(a, logits, 1000);
  EXPECT_EQ(first, sequence(b, logits, 1000));

  p.seed = 1235;
  Sampler c(p, 100);
  const auto other = sequence(c, logits, 1000);
  EXPECT_NE(first, other);
  int same = 0;
  for (int i = 0; i < 1000; ++i) same += first[i] == other[i];
  EXPECT_LT(same, 200);  // different seeds are not just shifted copies

  c.reseed(1234);
  EXPECT_EQ(first, sequence(c, logits, 1000));
}

TEST(Sampler, DrawIsInverseCdfOfTop53BitsOfMt19937_64) {
  // Independent reference for the portable draw: u = (mt() >> 11) * 2^-53,
  // pick the first id (in id order when nothing is truncated) whose
  // cumulative weight exceeds u * total.
  const std::vector<float> logits{0.3f, -0.2f, 1.1f, 0.0f, 0.7f, -2.0f};
  const float t = 0.8f;
  const std::uint64_t seed = 20240607;
  Sampler sampler(at_temperature(t, seed), static_cast<std::int32_t>(logits.size()));
  std::mt19937_64 rng(seed);
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<float> w(logits.size());
  double total = 0;
  for (std::size_t i = 0; i < w.size(); ++i) total += w[i] = std::exp((logits[i] - mx) * (1.0f / t));
  for (int draw = 0; draw < 1000; ++draw) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    double cumulative = 0;
    std::int32_t expected = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      cumulative += w[i];
      if (cumulative > u * total) {
        expected = static_cast<std::int32_t>(i);
        break;
      }
    }
    auto work = logits;
    ASSERT_EQ(sampler.sample(work, {}), expected) << "draw " << draw;
  }
}

// ---------------------------------------------------------------- penalties

SamplingParams penalties(float repetition, float presence, float frequency, std::int32_t last_n = 64) {
  SamplingParams p;  // greedy: the interesting part is the modified logits
  p.repetition_penalty = repetition;
  p.presence_penalty = presence;
  p.frequency_penalty = frequency;
  p.penalty_last_n = last_n;
  return p;
}

std::vector<float> penalised(const SamplingParams& p, std::vector<float> logits,
                             const std::vector<std::int32_t>& history) {
  Sampler sampler(p, static_cast<std::int32_t>(logits.size()));
  (void)sampler.sample(logits, history);
  return logits;
}

TEST(Sampler, RepetitionPenaltyArithmetic) {
  // Positive logits are divided, negative (and zero) multiplied; once per id
  // however often it occurs.
  const auto out = penalised(penalties(2.0f, 0, 0), {2.0f, -2.0f, 1.0f, 0.5f, 0.0f}, {0, 1, 1, 4});
  EXPECT_FLOAT_EQ(out[0], 1.0f);
  EXPECT_FLOAT_EQ(out[1], -4.0f);
  EXPECT_FLOAT_EQ(out[2], 1.0f);
  EXPECT_FLOAT_EQ(out[3], 0.5f);
  EXPECT_FLOAT_EQ(out[4], 0.0f);

  // r < 1 rewards repetition instead.
  const auto reward = penalised(penalties(0.5f, 0, 0), {2.0f, -2.0f}, {0, 1});
  EXPECT_FLOAT_EQ(reward[0], 4.0f);
  EXPECT_FLOAT_EQ(reward[1], -1.0f);
}

TEST(Sampler, PresenceAndFrequencyPenaltyArithmetic) {
  // counts: id0 x3, id2 x1, id3 x0
  const std::vector<std::int32_t> history{0, 2, 0, 0};
  const auto out = penalised(penalties(1.0f, 0.5f, 0.25f), {1.0f, 1.0f, 1.0f, 1.0f}, history);
  EXPECT_FLOAT_EQ(out[0], 1.0f - 0.5f - 3 * 0.25f);
  EXPECT_FLOAT_EQ(out[1], 1.0f);
  EXPECT_FLOAT_EQ(out[2], 1.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(out[3], 1.0f);

  // Negative values encourage repetition.
  const auto neg = penalised(penalties(1.0f, -1.0f, -0.5f), {0.0f, 0.0f}, {1, 1});
  EXPECT_FLOAT_EQ(neg[0], 0.0f);
  EXPECT_FLOAT_EQ(neg[1], 2.0f);
}

TEST(Sampler, LogitBiasIsAddedBeforeThePenalties) {
  // Bias first, then the repetition penalty divides the biased positive logit
  // (llama.cpp's order); ids past the vocabulary are ignored.
  SamplingParams p = penalties(2.0f, 0, 0);
  p.logit_bias = {{0, 1.0f}, {2, -3.0f}, {7, 50.0f}};
  const auto out = penalised(p, {3.0f, 1.0f, 1.0f}, {0});
  EXPECT_FLOAT_EQ(out[0], (3.0f + 1.0f) / 2.0f);
  EXPECT_FLOAT_EQ(out[1], 1.0f);
  EXPECT_FLOAT_EQ(out[2], -2.0f);
}

TEST(Sampler, LogitBiasChangesTheGreedyAndTheSampledChoice) {
  SamplingParams p = greedy();
  p.logit_bias = {{3, 100.0f}};
  std::vector<float> logits{5.0f, 1.0f, 2.0f, -1.0f};
  EXPECT_EQ(Sampler(p, 4).sample(logits, {}), 3);
  SamplingParams banned = at_temperature(1.0f);
  banned.logit_bias = {{0, -100.0f}};
  Sampler sampler(banned, 4);
  for (int i = 0; i < 200; ++i) {
    std::vector<float> fresh{5.0f, 1.0f, 2.0f, -1.0f};
    EXPECT_NE(sampler.sample(fresh, {}), 0);
  }
}

TEST(Sampler, RepetitionThenPresenceAndFrequency) {
  // Order as llama.cpp: scale first, then subtract.
  const auto out = penalised(penalties(2.0f, 1.0f, 0.5f), {3.0f, -1.0f}, {0, 0, 1});
  EXPECT_FLOAT_EQ(out[0], 3.0f / 2.0f - 1.0f - 2 * 0.5f);
  EXPECT_FLOAT_EQ(out[1], -1.0f * 2.0f - 1.0f - 0.5f);
}

TEST(Sampler, PenaltyWindow) {
  const std::vector<float> logits{1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<std::int32_t> history{0, 1, 2, 3, 3};
  auto out = penalised(penalties(1.0f, 1.0f, 0.0f, 2), logits, history);  // sees {3, 3}
  EXPECT_EQ(out, (std::vector<float>{1.0f, 1.0f, 1.0f, 0.0f, 1.0f}));
  out = penalised(penalties(1.0f, 1.0f, 0.0f, 3), logits, history);  // sees {2, 3, 3}
  EXPECT_EQ(out, (std::vector<float>{1.0f, 1.0f, 0.0f, 0.0f, 1.0f}));
  out = penalised(penalties(1.0f, 1.0f, 0.0f, -1), logits, history);  // everything
  EXPECT_EQ(out, (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f, 1.0f}));
  out = penalised(penalties(1.0f, 1.0f, 0.0f, 0), logits, history);  // off
  EXPECT_EQ(out, logits);
  out = penalised(penalties(1.0f, 0.0f, 1.0f, 100), logits, history);  // window > history
  EXPECT_EQ(out, (std::vector<float>{0.0f, 0.0f, 0.0f, -1.0f, 1.0f}));
}

TEST(Sampler, PenaltiesChangeTheGreedyChoice) {
  EXPECT_EQ(sample_once(penalties(1.0f, 0.0f, 0.0f), {2.0f, 1.9f}, {0}), 0);
  EXPECT_EQ(sample_once(penalties(1.2f, 0.0f, 0.0f), {2.0f, 1.9f}, {0}), 1);
  EXPECT_EQ(sample_once(penalties(1.0f, 0.2f, 0.0f), {2.0f, 1.9f}, {0}), 1);
}

TEST(Sampler, PenaltyCountsDoNotLeakBetweenCalls) {
  Sampler sampler(penalties(1.0f, 0.0f, 1.0f), 3);
  std::vector<float> logits{5.0f, 5.0f, 5.0f};
  const std::vector<std::int32_t> history{0, 0, 1};
  (void)sampler.sample(logits, history);
  EXPECT_EQ(logits, (std::vector<float>{3.0f, 4.0f, 5.0f}));
  logits = {5.0f, 5.0f, 5.0f};
  (void)sampler.sample(logits, history);
  EXPECT_EQ(logits, (std::vector<float>{3.0f, 4.0f, 5.0f}));
  logits = {5.0f, 5.0f, 5.0f};
  (void)sampler.sample(logits, {});
  EXPECT_EQ(logits, (std::vector<float>{5.0f, 5.0f, 5.0f}));
}

TEST(Sampler, OutOfRangeHistoryIdsAreIgnored) {
  const auto out = penalised(penalties(2.0f, 1.0f, 1.0f), {2.0f, 2.0f}, {-1, 7, 1, 1 << 30});
  EXPECT_FLOAT_EQ(out[0], 2.0f);
  EXPECT_FLOAT_EQ(out[1], 1.0f - 1.0f - 1.0f);
}

// ---------------------------------------------------------------- allocation

TEST(Sampler, SampleDoesNotAllocate) {
  const std::size_t vocab = 4096;
  const std::vector<float> logits = random_logits(vocab, 3);
  std::vector<std::int32_t> history(300);
  for (std::size_t i = 0; i < history.size(); ++i) history[i] = static_cast<std::int32_t>((i * 37) % vocab);

  std::vector<SamplingParams> configs;
  configs.push_back(greedy());
  configs.push_back(at_temperature(0.8f));
  SamplingParams all = at_temperature(0.8f);
  all.top_k = 100;
  all.top_p = 0.9f;
  all.min_p = 0.05f;
  all.repetition_penalty = 1.1f;
  all.presence_penalty = 0.3f;
  all.frequency_penalty = 0.2f;
  all.penalty_last_n = -1;
  all.logit_bias = {{1, 2.0f}, {7, -100.0f}};
  configs.push_back(all);
  all.top_k = 0;  // top_p alone: incremental ranking of the vocabulary
  configs.push_back(all);

  for (const auto& params : configs) {
    Sampler sampler(params, static_cast<std::int32_t>(vocab));
    std::vector<float> work(vocab);
    long allocations = 0;
    for (int i = 0; i < 20; ++i) {
      std::copy(logits.begin(), logits.end(), work.begin());
      g_allocations = 0;
      g_counting = true;
      const std::int32_t id = sampler.sample(work, history);
      g_counting = false;
      allocations += g_allocations.load();
      ASSERT_GE(id, 0);
    }
    EXPECT_EQ(allocations, 0) << "temperature " << params.temperature << " top_k " << params.top_k;
  }
}

// ---------------------------------------------------------------- validate

void expect_invalid(const SamplingParams& p, const std::string& field) {
  const Status status = validate(p);
  ASSERT_FALSE(status.ok()) << field;
  EXPECT_NE(status.error().message.find(field), std::string::npos) << status.error().message;
}

TEST(SamplerValidate, DefaultsAndTypicalSettingsAreValid) {
  EXPECT_TRUE(validate(SamplingParams{}).ok());
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 40;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.penalty_last_n = -1;
  EXPECT_TRUE(validate(p).ok());
}

TEST(SamplerValidate, ErrorsNameTheField) {
  auto with = [](auto edit) {
    SamplingParams p;
    edit(p);
    return p;
  };
  expect_invalid(with([](auto& p) { p.temperature = -0.1f; }), "temperature");
  expect_invalid(with([](auto& p) { p.temperature = kNaN; }), "temperature");
  expect_invalid(with([](auto& p) { p.temperature = kInf; }), "temperature");
  expect_invalid(with([](auto& p) { p.top_k = -1; }), "top_k");
  expect_invalid(with([](auto& p) { p.top_p = 0.0f; }), "top_p");
  expect_invalid(with([](auto& p) { p.top_p = 1.01f; }), "top_p");
  expect_invalid(with([](auto& p) { p.top_p = kNaN; }), "top_p");
  expect_invalid(with([](auto& p) { p.min_p = -0.01f; }), "min_p");
  expect_invalid(with([](auto& p) { p.min_p = 1.5f; }), "min_p");
  expect_invalid(with([](auto& p) { p.repetition_penalty = 0.0f; }), "repetition_penalty");
  expect_invalid(with([](auto& p) { p.repetition_penalty = kInf; }), "repetition_penalty");
  expect_invalid(with([](auto& p) { p.presence_penalty = 2.5f; }), "presence_penalty");
  expect_invalid(with([](auto& p) { p.presence_penalty = kNaN; }), "presence_penalty");
  expect_invalid(with([](auto& p) { p.frequency_penalty = -2.01f; }), "frequency_penalty");
  expect_invalid(with([](auto& p) { p.penalty_last_n = -2; }), "penalty_last_n");
  expect_invalid(with([](auto& p) { p.logit_bias = {{5, 100.5f}}; }), "logit_bias");
  expect_invalid(with([](auto& p) { p.logit_bias = {{5, kNaN}}; }), "logit_bias");
  expect_invalid(with([](auto& p) { p.logit_bias = {{-1, 1.0f}}; }), "logit_bias");
  expect_invalid(with([](auto& p) { p.logit_bias.assign(kMaxLogitBias + 1, {1, 1.0f}); }), "logit_bias");
}

TEST(SamplerValidate, ErrorStatesRangeAndValue) {
  SamplingParams p;
  p.top_p = 1.5f;
  const Status status = validate(p);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("(0, 1]"), std::string::npos) << status.error().message;
  EXPECT_NE(status.error().message.find("1.5"), std::string::npos) << status.error().message;
}

// ---- logprobs: the model's own distribution, the reference is the definition
// (softmax in long double, a full sort).

std::vector<std::pair<long double, std::int32_t>> reference_logprobs(const std::vector<float>& logits) {
  long double max = -INFINITY;
  for (float v : logits)
    if (!std::isnan(v)) max = std::max<long double>(max, v);
  long double sum = 0;
  for (float v : logits)
    if (!std::isnan(v)) sum += std::exp(static_cast<long double>(v) - max);
  std::vector<std::pair<long double, std::int32_t>> out;
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (!std::isnan(logits[i]))
      out.emplace_back(static_cast<long double>(logits[i]) - max - std::log(sum), static_cast<std::int32_t>(i));
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// read_logprobs on a copy (it overwrites its row).
TokenLogprobs read_copy(std::vector<float> logits, std::int32_t chosen, std::vector<TopLogprob>& top) {
  return read_logprobs(logits, chosen, top);
}

TEST(Logprobs, AgreeWithTheDefinitionOnRandomRows) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    // Lengths around the 16-logit blocks, and vocabulary-sized ones.
    const std::size_t vocab = trial < 20 ? 1 + static_cast<std::size_t>(trial) * 3 : 1 + rng() % 60000;
    std::normal_distribution<float> normal(0.0f, 1.0f + static_cast<float>(trial % 10));
    std::vector<float> logits(vocab);
    for (float& v : logits) v = normal(rng);
    // Ties on purpose: equal logits must come out in id order.
    if (vocab > 10) logits[vocab - 1] = logits[3];
    if (vocab > 40) logits[vocab / 2] = -std::numeric_limits<float>::infinity();  // a masked token
    const auto expected = reference_logprobs(logits);
    std::vector<TopLogprob> top(rng() % 26);
    const std::int32_t chosen = static_cast<std::int32_t>(rng() % vocab);
    const TokenLogprobs got = read_copy(logits, chosen, top);
    ASSERT_EQ(got.top_count, std::min(top.size(), vocab)) << "trial " << trial;
    for (std::size_t k = 0; k < got.top_count; ++k) {
      EXPECT_EQ(top[k].token, expected[k].second) << "trial " << trial << " rank " << k;
      EXPECT_NEAR(top[k].logprob, static_cast<double>(expected[k].first), 1e-5) << "trial " << trial << " rank " << k;
    }
    const auto it = std::find_if(expected.begin(), expected.end(), [&](const auto& e) { return e.second == chosen; });
    if (std::isinf(it->first)) {
      EXPECT_EQ(got.chosen, -std::numeric_limits<float>::infinity());
    } else {
      EXPECT_NEAR(got.chosen, static_cast<double>(it->first), 1e-5) << "trial " << trial;
    }
  }
}

TEST(Logprobs, LargeLogitsDoNotOverflowAndProbabilitiesSumToOne) {
  const std::vector<float> logits = {1000.0f, 999.0f, -1000.0f, 998.5f};
  double mass = 0;
  std::vector<TopLogprob> none;
  for (std::int32_t id = 0; id < 4; ++id) {
    const float lp = read_copy(logits, id, none).chosen;
    EXPECT_LE(lp, 0.0f);
    EXPECT_TRUE(std::isfinite(lp)) << id;
    mass += std::exp(static_cast<double>(lp));
  }
  EXPECT_NEAR(mass, 1.0, 1e-6);
  EXPECT_NEAR(read_copy(logits, 0, none).chosen, -std::log(1.0 + std::exp(-1.0) + std::exp(-1.5)), 1e-6);
  EXPECT_NEAR(read_copy(logits, 2, none).chosen, -2000.0 - std::log(1.0 + std::exp(-1.0) + std::exp(-1.5)), 1e-3);
}

TEST(Logprobs, NonFiniteLogitsFollowTheSamplersRules) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // NaN is no token and never ranks; -inf ranks last with log-probability -inf.
  std::vector<float> masked(40, -inf);
  masked[0] = nan;
  masked[1] = 2.0f;
  masked[3] = 2.0f;
  masked[37] = nan;
  std::vector<TopLogprob> top(4);
  TokenLogprobs got = read_copy(masked, 0, top);
  EXPECT_EQ(got.chosen, -inf);
  ASSERT_EQ(got.top_count, 4u);
  EXPECT_EQ(top[0].token, 1);
  EXPECT_NEAR(top[0].logprob, -std::log(2.0), 1e-6);
  EXPECT_EQ(top[1].token, 3);
  EXPECT_EQ(top[2].token, 2);
  EXPECT_EQ(top[2].logprob, -inf);
  EXPECT_EQ(top[3].token, 4);
  EXPECT_NEAR(read_copy(masked, 3, top).chosen, -std::log(2.0), 1e-6);
  // +inf tokens share the mass.
  const std::vector<float> forced = {0.0f, inf, 5.0f, inf, inf};
  EXPECT_NEAR(read_copy(forced, 1, top).chosen, -std::log(3.0), 1e-6);
  EXPECT_EQ(read_copy(forced, 2, top).chosen, -inf);
  // Nothing selectable, and ids outside the row.
  const std::vector<float> none = {nan, -inf};
  EXPECT_EQ(read_copy(none, 1, top).chosen, -inf);
  EXPECT_EQ(read_copy(none, 7, top).chosen, -inf);
  EXPECT_EQ(read_copy(none, -1, top).chosen, -inf);
  EXPECT_EQ(read_copy(none, 1, top).top_count, 1u);
}

TEST(Logprobs, ReadingDoesNotAllocate) {
  std::vector<float> logits(50000);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (float& v : logits) v = normal(rng);
  std::vector<TopLogprob> top(20);
  // The first call picks the kernels' implementation (once per process).
  std::vector<float> warm = logits;
  read_logprobs(warm, 5, top);
  g_allocations = 0;
  g_counting = true;
  const TokenLogprobs got = read_logprobs(logits, 5, top);
  g_counting = false;
  EXPECT_EQ(got.top_count, 20u);
  EXPECT_EQ(g_allocations.load(), 0);
}

}  // namespace
}  // namespace colibri
