// Every fixture model must reproduce the reference engine's outputs: prompt
// token ids, top-1 and the top-64 logits at every position, and the 32-token
// greedy continuation.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "runtime/session.h"

namespace colibri {
namespace {

constexpr double kLogitTolerance = 1e-3;

std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "fixtures" / name;
}

nlohmann::json load_reference(const std::string& name) {
  std::ifstream in(fixture_dir(name) / "reference.json");
  return nlohmann::json::parse(in);
}

std::int32_t argmax_lowest(std::span<const float> logits) {
  std::int32_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<std::size_t>(best)]) best = static_cast<std::int32_t>(i);
  return best;
}

class FixtureGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureGolden, MatchesReferenceEngine) {
  auto model = Model::load(fixture_dir(GetParam()));
  ASSERT_TRUE(model.ok()) << model.error().message;
  nlohmann::json reference = load_reference(GetParam());

  for (const auto& prompt : reference["prompts"]) {
    SCOPED_TRACE(prompt["prompt_id"].get<std::string>());
    auto expected_tokens = prompt["tokens"].get<std::vector<std::int32_t>>();
    EncodeOptions options;
    options.add_special_tokens = false;
    auto tokens = (*model)->tokenizer().encode(prompt["prompt"].get<std::string>(), options);
    ASSERT_TRUE(tokens.ok()) << tokens.error().message;
    ASSERT_EQ(*tokens, expected_tokens);

    Session session(*model);
    double max_diff = 0.0;
    std::span<const float> logits;
    for (std::size_t pos = 0; pos < expected_tokens.size(); ++pos) {
      auto step = session.decode(expected_tokens[pos]);
      ASSERT_TRUE(step.ok()) << step.error().message;
      logits = *step;
      const auto& ref_pos = prompt["positions"][pos];
      ASSERT_EQ(argmax_lowest(logits), ref_pos["argmax"].get<std::int32_t>()) << "position " << pos;
      for (const auto& pair : ref_pos["top"]) {
        auto id = pair[0].get<std::size_t>();
        double diff = std::fabs(static_cast<double>(logits[id]) - pair[1].get<double>());
        max_diff = std::max(max_diff, diff);
        ASSERT_LE(diff, kLogitTolerance) << "position " << pos << " token " << id;
      }
    }
    std::printf("[golden] %s %s: %zu positions, max |dlogit| over top-64 = %.3g\n",
                GetParam().c_str(), prompt["prompt_id"].get<std::string>().c_str(),
                expected_tokens.size(), max_diff);

    auto expected_generated = prompt["generated"]["tokens"].get<std::vector<std::int32_t>>();
    std::vector<std::int32_t> generated;
    for (std::size_t i = 0; i < expected_generated.size(); ++i) {
      std::int32_t next = argmax_lowest(logits);
      generated.push_back(next);
      if (i + 1 == expected_generated.size()) break;
      auto step = session.decode(next);
      ASSERT_TRUE(step.ok()) << step.error().message;
      logits = *step;
    }
    EXPECT_EQ(generated, expected_generated);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureGolden,
                         ::testing::Values("mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny",
                                           "olmoe-tiny"),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

TEST(SessionErrors, TokenOutsideVocabularyIsAnError) {
  auto model = Model::load(fixture_dir("mixtral-tiny"));
  ASSERT_TRUE(model.ok()) << model.error().message;
  Session session(*model);
  for (std::int32_t bad : {-1, 512, 1 << 30}) {
    auto step = session.decode(bad);
    ASSERT_FALSE(step.ok());
    EXPECT_NE(step.error().message.find(std::to_string(bad)), std::string::npos)
        << step.error().message;
  }
  EXPECT_EQ(session.position(), 0);
  EXPECT_TRUE(session.decode(5).ok());
}

TEST(SessionErrors, FullContextIsAnError) {
  auto model = Model::load(fixture_dir("olmoe-tiny"));
  ASSERT_TRUE(model.ok()) << model.error().message;
  Session session(*model, 3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(session.decode(1).ok());
  auto step = session.decode(1);
  ASSERT_FALSE(step.ok());
  EXPECT_NE(step.error().message.find("context is full"), std::string::npos) << step.error().message;
}

}  // namespace
}  // namespace colibri
