// What each opt-in routing mode costs on the bundled trained model
// (models/default: 8 experts, top-2), over the first 1024 tokens of the
// held-out excerpt. The bounds are loose versions of the figures measured on
// the whole excerpt (docs/ROUTING.md); a regression in a mode, or a mode that
// silently falls back to standard routing, fails here.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "runtime/routing_fidelity.h"

namespace colibri {
namespace {

const std::filesystem::path kData = COLIBRI_TEST_DATA_DIR;
const std::filesystem::path kModel = kData / ".." / ".." / "models" / "default";

class RoutingFidelityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto loaded = Model::load(kModel);
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    model_ = *loaded;
    std::ifstream in(kData / "default-model" / "heldout-excerpt.txt", std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    EncodeOptions encode;
    encode.add_special_tokens = false;
    encode.parse_special = true;
    auto tokens = model_->tokenizer().encode(text.str(), encode);
    ASSERT_TRUE(tokens.ok());
    tokens_ = *tokens;
  }
  static RoutingFidelity measure(RoutingOptions options) {
    PerplexityOptions p;
    p.max_tokens = 1024;
    auto rows = measure_routing_fidelity(model_, tokens_, std::span<const RoutingOptions>(&options, 1), p);
    EXPECT_TRUE(rows.ok()) << rows.error().message;
    return rows->front();
  }
  static inline std::shared_ptr<const Model> model_;
  static inline std::vector<std::int32_t> tokens_;
};

TEST_F(RoutingFidelityTest, Int8RouterCostsAlmostNothing) {
  const auto row = measure({RoutingMode::Int8});
  EXPECT_GE(row.result.compared, 1000);  // 1024 targets less each window's first
  EXPECT_GE(row.result.top1_agreement(), 0.99);
  EXPECT_LT(row.result.mean_kl(), 1e-3);
  EXPECT_GT(row.result.mean_kl(), 0.0) << "int8 scores are coarser than f32: some difference is expected";
  EXPECT_GT(row.int8_rows_skipped, 0u);
}

TEST_F(RoutingFidelityTest, GroupLimitedIsExactWhenTheKeptGroupsHoldTheTopK) {
  // 4 groups of 2, best 2 kept: the top-2 experts' groups are always the two
  // best groups, so nothing changes.
  const auto kept = measure({RoutingMode::GroupLimited, 4, 2});
  EXPECT_EQ(kept.result.kl_sum, 0.0);
  EXPECT_EQ(kept.result.top1_agree, kept.result.compared);
  // One group of 2 kept: the second expert must come from the best one's group.
  const auto narrow = measure({RoutingMode::GroupLimited, 4, 1});
  EXPECT_LT(narrow.result.top1_agreement(), 0.95);
  EXPECT_GT(narrow.result.top1_agreement(), 0.6);
}

TEST_F(RoutingFidelityTest, HashRoutingIgnoresTheRouter) {
  const auto row = measure({RoutingMode::Hash});
  EXPECT_LT(row.result.top1_agreement(), 0.7);
  EXPECT_GT(row.result.perplexity(), row.result.base_perplexity() * 1.1);
}

TEST_F(RoutingFidelityTest, LoadAwareCostGrowsAsTheThresholdFalls) {
  RoutingOptions loose{RoutingMode::LoadAware};
  loose.load_threshold = 0.5;
  RoutingOptions tight = loose;
  tight.load_threshold = 0.35;
  const auto a = measure(loose), b = measure(tight);
  EXPECT_GE(a.result.top1_agreement(), 0.98);
  EXPECT_LT(b.result.top1_agreement(), a.result.top1_agreement());
  EXPECT_GT(b.result.mean_kl(), a.result.mean_kl());
}

}  // namespace
}  // namespace colibri
