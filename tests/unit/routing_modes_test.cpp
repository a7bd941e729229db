#include "moe/routing_modes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>

namespace colibri {
namespace {

struct RandomRouter {
  std::vector<float> w;
  Matrix m;
  RandomRouter(std::int32_t experts, std::int32_t cols, std::uint32_t seed) : w(static_cast<std::size_t>(experts) * cols) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 0.05f);
    for (float& v : w) v = dist(rng);
    m.data = w.data();
    m.rows = experts;
    m.cols = cols;
  }
  std::vector<float> logits(const std::vector<float>& x) const {
    std::vector<float> out(static_cast<std::size_t>(m.rows));
    for (std::int32_t e = 0; e < m.rows; ++e) {
      double s = 0;
      for (std::int32_t c = 0; c < m.cols; ++c) s += static_cast<double>(w[static_cast<std::size_t>(e) * m.cols + c]) * x[c];
      out[static_cast<std::size_t>(e)] = static_cast<float>(s);
    }
    return out;
  }
};

std::vector<float> random_vector(std::int32_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x) v = dist(rng);
  return x;
}

struct Choice {
  std::vector<float> probabilities;
  std::vector<std::int32_t> experts;
  std::vector<float> weights;
  explicit Choice(const RouterSpec& spec)
      : probabilities(static_cast<std::size_t>(spec.n_experts)),
        experts(static_cast<std::size_t>(spec.top_k)),
        weights(static_cast<std::size_t>(spec.top_k)) {}
};

TEST(RoutingModes, NamesRoundTrip) {
  for (RoutingMode mode : {RoutingMode::Standard, RoutingMode::Int8, RoutingMode::GroupLimited, RoutingMode::Hash,
                           RoutingMode::LoadAware})
    EXPECT_EQ(routing_mode_from_name(routing_mode_name(mode)), mode);
  EXPECT_FALSE(routing_mode_from_name("fastest").has_value());
}

TEST(RoutingModes, ValidateNamesTheProblem) {
  const RouterSpec spec{64, 8, true};
  RoutingOptions group{RoutingMode::GroupLimited, 7, 2};
  EXPECT_NE(validate(group, spec).error().message.find("n_group"), std::string::npos);
  group.n_group = 8;
  group.topk_group = 9;
  EXPECT_NE(validate(group, spec).error().message.find("topk_group"), std::string::npos);
  group.n_group = 32;
  group.topk_group = 1;  // 2 experts reachable < top_k 8
  EXPECT_NE(validate(group, spec).error().message.find("fewer than top_k"), std::string::npos);
  RoutingOptions load{RoutingMode::LoadAware};
  load.load_threshold = 0.0;
  EXPECT_NE(validate(load, spec).error().message.find("load_threshold"), std::string::npos);
  EXPECT_TRUE(validate(RoutingOptions{}, spec).ok());
}

TEST(RoutingModes, StandardIsRouteTopK) {
  const RouterSpec spec{16, 4, false};
  RandomRouter router(16, 64, 1);
  const Matrix* routers[] = {&router.m};
  auto r = ModeRouter::create({}, spec, routers);
  ASSERT_TRUE(r.ok());
  std::mt19937 rng(2);
  const auto x = random_vector(64, rng);
  const auto logits = router.logits(x);
  Choice a(spec), b(spec);
  ASSERT_TRUE(r->route(0, 5, x, logits, a.probabilities, a.experts, a.weights).ok());
  ASSERT_TRUE(route_top_k(spec, logits, b.probabilities, b.experts, b.weights).ok());
  EXPECT_EQ(a.experts, b.experts);
  EXPECT_EQ(a.weights, b.weights);
}

// The early exit must never change the choice: compare with a full integer
// scan done here, and with f32 routing (agreement, since quantization may
// swap near-ties).
TEST(RoutingModes, Int8EarlyExitIsExactAndAgreesWithFloat) {
  const std::int32_t experts = 64, cols = 1024;
  const RouterSpec spec{experts, 8, true};
  RandomRouter router(experts, cols, 3);
  const Matrix* routers[] = {&router.m, nullptr};
  auto r = ModeRouter::create({RoutingMode::Int8}, spec, routers);
  ASSERT_TRUE(r.ok()) << r.error().message;

  float max_w = 0;
  for (float v : router.w) max_w = std::max(max_w, std::fabs(v));
  const float w_scale = max_w / 127.0f;
  std::mt19937 rng(4);
  std::size_t same_set = 0;
  const int trials = 200;
  for (int t = 0; t < trials; ++t) {
    const auto x = random_vector(cols, rng);
    Choice got(spec);
    ASSERT_TRUE(r->route(0, 0, x, {}, got.probabilities, got.experts, got.weights).ok());

    float max_x = 0;
    for (float v : x) max_x = std::max(max_x, std::fabs(v));
    const float x_scale = max_x / 127.0f;
    std::vector<std::pair<std::int64_t, std::int32_t>> full;
    for (std::int32_t e = 0; e < experts; ++e) {
      std::int64_t s = 0;
      for (std::int32_t c = 0; c < cols; ++c)
        s += std::lrint(std::clamp(router.w[static_cast<std::size_t>(e) * cols + c] / w_scale, -127.0f, 127.0f)) *
             std::lrint(std::clamp(x[c] / x_scale, -127.0f, 127.0f));
      full.emplace_back(-s, e);  // ascending: best first, ties to the lower index
    }
    std::sort(full.begin(), full.end());
    for (std::int32_t i = 0; i < spec.top_k; ++i) ASSERT_EQ(got.experts[i], full[i].second) << "trial " << t;
    float sum = 0;
    for (float w : got.weights) sum += w;
    EXPECT_NEAR(sum, 1.0f, 1e-5f);

    Choice exact(spec);
    ASSERT_TRUE(route_top_k(spec, router.logits(x), exact.probabilities, exact.experts, exact.weights).ok());
    std::set<std::int32_t> a(got.experts.begin(), got.experts.end()), b(exact.experts.begin(), exact.experts.end());
    same_set += a == b;
  }
  EXPECT_GE(same_set, trials * 8 / 10) << "int8 routing picked a different set too often";
  EXPECT_GT(r->int8_rows_skipped(), 0u) << "the early exit never fired";
  std::printf("int8 routing: %zu/%d same expert set as f32; early exit skipped %llu of %llu rows\n", same_set, trials,
              static_cast<unsigned long long>(r->int8_rows_skipped()),
              static_cast<unsigned long long>(r->int8_rows_skipped() + r->int8_rows_scored()));
  EXPECT_EQ(r->int8_rows_skipped() + r->int8_rows_scored(), static_cast<std::uint64_t>(trials) * experts);
}

TEST(RoutingModes, Int8WithoutRenormalisationScoresEveryRow) {
  const RouterSpec spec{32, 4, false};
  RandomRouter router(32, 300, 5);
  const Matrix* routers[] = {&router.m};
  auto r = ModeRouter::create({RoutingMode::Int8}, spec, routers);
  ASSERT_TRUE(r.ok());
  std::mt19937 rng(6);
  const auto x = random_vector(300, rng);
  Choice got(spec);
  ASSERT_TRUE(r->route(0, 0, x, {}, got.probabilities, got.experts, got.weights).ok());
  EXPECT_EQ(r->int8_rows_skipped(), 0u);
  float sum = 0;
  for (float p : got.probabilities) sum += p;
  EXPECT_NEAR(sum, 1.0f, 1e-5f);
  EXPECT_EQ(got.weights[0], got.probabilities[static_cast<std::size_t>(got.experts[0])]);
}

TEST(RoutingModes, GroupLimitedStaysInTheBestGroups) {
  const RouterSpec spec{64, 6, false};
  const RoutingOptions options{RoutingMode::GroupLimited, 8, 3};
  RandomRouter router(64, 128, 7);
  const Matrix* routers[] = {&router.m};
  auto r = ModeRouter::create(options, spec, routers);
  ASSERT_TRUE(r.ok());
  std::mt19937 rng(8);
  for (int t = 0; t < 50; ++t) {
    const auto logits = router.logits(random_vector(128, rng));
    Choice got(spec);
    ASSERT_TRUE(r->route(0, 0, {}, logits, got.probabilities, got.experts, got.weights).ok());
    // The groups ranked by their best expert; the choice must lie in the top 3.
    std::vector<std::pair<float, std::int32_t>> groups;
    for (std::int32_t g = 0; g < 8; ++g)
      groups.emplace_back(-*std::max_element(logits.begin() + g * 8, logits.begin() + (g + 1) * 8), g);
    std::sort(groups.begin(), groups.end());
    std::set<std::int32_t> best{groups[0].second, groups[1].second, groups[2].second};
    for (std::int32_t e : got.experts) EXPECT_TRUE(best.count(e / 8)) << "expert " << e << " outside the best groups";
    for (std::size_t i = 1; i < got.weights.size(); ++i) EXPECT_GE(got.weights[i - 1], got.weights[i]);
  }
  // All groups allowed: identical to standard routing.
  auto all = ModeRouter::create({RoutingMode::GroupLimited, 8, 8}, spec, routers);
  ASSERT_TRUE(all.ok());
  const auto logits = router.logits(random_vector(128, rng));
  Choice a(spec), b(spec);
  ASSERT_TRUE(all->route(0, 0, {}, logits, a.probabilities, a.experts, a.weights).ok());
  ASSERT_TRUE(route_top_k(spec, logits, b.probabilities, b.experts, b.weights).ok());
  EXPECT_EQ(a.experts, b.experts);
}

TEST(RoutingModes, HashIsDeterministicDistinctAndSpread) {
  const RouterSpec spec{16, 3, false};
  const Matrix* routers[] = {nullptr, nullptr};
  auto r = ModeRouter::create({RoutingMode::Hash}, spec, routers);
  ASSERT_TRUE(r.ok());
  std::vector<int> load(16, 0);
  for (std::int32_t token = 0; token < 2000; ++token) {
    Choice a(spec), b(spec);
    ASSERT_TRUE(r->route(1, token, {}, {}, a.probabilities, a.experts, a.weights).ok());
    ASSERT_TRUE(r->route(1, token, {}, {}, b.probabilities, b.experts, b.weights).ok());
    EXPECT_EQ(a.experts, b.experts);
    EXPECT_EQ(std::set<std::int32_t>(a.experts.begin(), a.experts.end()).size(), 3u);
    for (float w : a.weights) EXPECT_FLOAT_EQ(w, 1.0f / 3.0f);
    for (std::int32_t e : a.experts) ++load[static_cast<std::size_t>(e)];
  }
  // 6000 assignments over 16 experts: 375 each on average.
  for (int l : load) {
    EXPECT_GT(l, 300);
    EXPECT_LT(l, 450);
  }
  Choice l0(spec), l1(spec);
  int differ = 0;
  for (std::int32_t token = 0; token < 50; ++token) {
    ASSERT_TRUE(r->route(0, token, {}, {}, l0.probabilities, l0.experts, l0.weights).ok());
    ASSERT_TRUE(r->route(1, token, {}, {}, l1.probabilities, l1.experts, l1.weights).ok());
    differ += l0.experts != l1.experts;
  }
  EXPECT_GT(differ, 40) << "layers should hash differently";
}

TEST(RoutingModes, LoadAwarePassesAnOverloadedExpertOn) {
  const RouterSpec spec{8, 2, false};
  RoutingOptions options{RoutingMode::LoadAware};
  options.load_window = 10;
  options.load_threshold = 0.5;  // an expert in more than 5 of the last 10 tokens is skipped
  const Matrix* routers[] = {nullptr};
  auto r = ModeRouter::create(options, spec, routers);
  ASSERT_TRUE(r.ok());
  // The same logits every time: experts 0 then 1 are the favourites, 2 and 3 next.
  const std::vector<float> logits = {4.0f, 3.0f, 2.0f, 1.0f, 0.0f, -1.0f, -2.0f, -3.0f};
  std::vector<std::vector<std::int32_t>> seen;
  for (int t = 0; t < 30; ++t) {
    Choice got(spec);
    ASSERT_TRUE(r->route(0, t, {}, logits, got.probabilities, got.experts, got.weights).ok());
    seen.push_back(got.experts);
  }
  for (int t = 0; t < 6; ++t) EXPECT_EQ(seen[static_cast<std::size_t>(t)], (std::vector<std::int32_t>{0, 1}));
  // After 6 tokens on {0, 1} both exceed 5 of 10: the 7th goes to {2, 3}.
  EXPECT_EQ(seen[6], (std::vector<std::int32_t>{2, 3}));
  // Over any full window no expert exceeds the threshold by more than one token.
  for (std::size_t end = 10; end <= seen.size(); ++end) {
    std::vector<int> count(8, 0);
    for (std::size_t t = end - 10; t < end; ++t)
      for (std::int32_t e : seen[t]) ++count[static_cast<std::size_t>(e)];
    for (int c : count) EXPECT_LE(c, 6);
  }
  // A threshold of 1 never triggers: standard routing.
  options.load_threshold = 1.0;
  auto never = ModeRouter::create(options, spec, routers);
  for (int t = 0; t < 30; ++t) {
    Choice got(spec);
    ASSERT_TRUE(never->route(0, t, {}, logits, got.probabilities, got.experts, got.weights).ok());
    EXPECT_EQ(got.experts, (std::vector<std::int32_t>{0, 1}));
  }
}

}  // namespace
}  // namespace colibri
