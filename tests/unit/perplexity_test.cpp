#include "runtime/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>

#include "runtime/session.h"

namespace colibri {
namespace {

std::shared_ptr<const Model> fixture(const char* name) {
  auto model = Model::load(std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "fixtures" / name);
  EXPECT_TRUE(model.ok()) << model.error().message;
  return *model;
}

std::vector<std::int32_t> sample_tokens() {
  std::vector<std::int32_t> tokens;
  for (int i = 0; i < 50; ++i) tokens.push_back((i * 37 + 11) % 500);
  return tokens;
}

// -log p(tokens[t+1] | tokens[from..t]) summed over the given targets, computed
// directly with a Session.
double direct_nll(const std::shared_ptr<const Model>& model, const std::vector<std::int32_t>& tokens,
                  std::size_t from, std::size_t to, std::size_t first_target) {
  Session session(model);
  double nll = 0.0;
  for (std::size_t pos = from; pos + 1 < to; ++pos) {
    auto logits = session.decode(tokens[pos]);
    EXPECT_TRUE(logits.ok());
    if (pos + 1 < first_target) continue;
    double max = -INFINITY, sum = 0.0;
    for (float v : *logits) max = std::max(max, static_cast<double>(v));
    for (float v : *logits) sum += std::exp(v - max);
    nll -= (*logits)[static_cast<std::size_t>(tokens[pos + 1])] - max - std::log(sum);
  }
  return nll;
}

TEST(Perplexity, NonOverlappingWindowsScoreAllButEachWindowsFirstToken) {
  auto model = fixture("mixtral-tiny");
  auto tokens = sample_tokens();
  auto result = measure_perplexity(model, nullptr, tokens, {.context = 20, .stride = 20});
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result->scored, 19 + 19 + 9);
  double expected = direct_nll(model, tokens, 0, 20, 1) + direct_nll(model, tokens, 20, 40, 21) +
                    direct_nll(model, tokens, 40, 50, 41);
  EXPECT_NEAR(result->nll_sum, expected, 1e-6 * std::fabs(expected));
}

TEST(Perplexity, SlidingWindowsScoreEachTargetOnceWithTheMostContext) {
  auto model = fixture("olmoe-tiny");
  auto tokens = sample_tokens();
  auto result = measure_perplexity(model, nullptr, tokens, {.context = 20, .stride = 10});
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result->scored, 49);
  // Windows start at 0, 10, 20, 30; the first scores targets 1..19, each later
  // one its targets past those already scored.
  double expected = direct_nll(model, tokens, 0, 20, 1) + direct_nll(model, tokens, 10, 30, 20) +
                    direct_nll(model, tokens, 20, 40, 30) + direct_nll(model, tokens, 30, 50, 40);
  EXPECT_NEAR(result->nll_sum, expected, 1e-6 * std::fabs(expected));
  EXPECT_NEAR(result->perplexity(), std::exp(expected / 49), 1e-6 * result->perplexity());
}

// max_tokens on a window boundary (20 with windows of 20): target 20 is a
// window's first token, never scored, so the run must stop after the first
// window instead of running the two left for nothing (one progress call per
// window run).
TEST(Perplexity, MaxTokensOnAWindowBoundaryStopsThere) {
  auto model = fixture("mixtral-tiny");
  auto tokens = sample_tokens();
  int windows = 0;
  PerplexityOptions options{.context = 20, .stride = 20, .max_tokens = 20};
  options.progress = [&](std::int64_t, std::int64_t) { ++windows; };
  auto result = measure_perplexity(model, nullptr, tokens, options);
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result->scored, 19);
  EXPECT_EQ(windows, 1);
}

TEST(Perplexity, AModelAgainstItselfHasZeroDivergence) {
  auto model = fixture("qwen2moe-tiny");
  auto tokens = sample_tokens();
  auto result = measure_perplexity(model, model, tokens, {.context = 25, .stride = 25});
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result->compared, result->scored);
  EXPECT_NEAR(result->mean_kl(), 0.0, 1e-9);
  EXPECT_EQ(result->top1_agreement(), 1.0);
  EXPECT_DOUBLE_EQ(result->perplexity(), result->base_perplexity());
}

TEST(Perplexity, DifferentModelsDiverge) {
  auto result = measure_perplexity(fixture("qwen3moe-tiny"), fixture("olmoe-tiny"), sample_tokens(),
                                   {.context = 25, .stride = 25});
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_GT(result->mean_kl(), 0.1);
}

TEST(Perplexity, BadOptionsAreErrors) {
  auto model = fixture("mixtral-tiny");
  auto tokens = sample_tokens();
  EXPECT_FALSE(measure_perplexity(model, nullptr, tokens, {.context = 1, .stride = 1}).ok());
  EXPECT_FALSE(measure_perplexity(model, nullptr, tokens, {.context = 10, .stride = 11}).ok());
  EXPECT_FALSE(measure_perplexity(model, nullptr, std::vector<std::int32_t>{1}, {}).ok());
}

}  // namespace
}  // namespace colibri
