#include "model/model_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

namespace colibri {
namespace {

nlohmann::json fixture_config(const std::string& name) {
  std::ifstream in(std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "fixtures" / name / "config.json");
  return nlohmann::json::parse(in);
}

std::string error_of(const nlohmann::json& config) {
  auto parsed = parse_hf_config(config.dump(), "config.json");
  return parsed.ok() ? "" : parsed.error().message;
}

TEST(ModelConfig, ReadsEveryFixture) {
  for (const char* name : {"mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny", "olmoe-tiny"}) {
    auto parsed = parse_hf_config(fixture_config(name).dump(), name);
    ASSERT_TRUE(parsed.ok()) << parsed.error().message;
    EXPECT_EQ(parsed->hidden, 64);
    EXPECT_EQ(parsed->n_layers, 2);
  }
  auto qwen3 = parse_hf_config(fixture_config("qwen3moe-tiny").dump(), "q3");
  ASSERT_TRUE(qwen3.ok());
  EXPECT_EQ(qwen3->head_dim, 32);
  EXPECT_TRUE(qwen3->norm_topk);
  EXPECT_EQ(qwen3->n_experts, 16);
  auto mixtral = parse_hf_config(fixture_config("mixtral-tiny").dump(), "mx");
  ASSERT_TRUE(mixtral.ok());
  EXPECT_TRUE(mixtral->norm_topk);
  EXPECT_EQ(mixtral->expert_ff, 128);
  auto qwen2 = parse_hf_config(fixture_config("qwen2moe-tiny").dump(), "q2");
  ASSERT_TRUE(qwen2.ok());
  EXPECT_EQ(qwen2->shared_ff, 128);
  EXPECT_TRUE(qwen2->qkv_bias);
  EXPECT_FALSE(qwen2->norm_topk);
}

TEST(ModelConfig, MissingRequiredFieldIsNamed) {
  for (const char* field : {"hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                            "num_local_experts", "num_experts_per_tok", "intermediate_size"}) {
    auto config = fixture_config("mixtral-tiny");
    config.erase(field);
    std::string message = error_of(config);
    EXPECT_NE(message.find(std::string("missing required field '") + field + "'"), std::string::npos)
        << field << ": " << message;
    EXPECT_NE(message.find("config.json"), std::string::npos) << message;
  }
  auto config = fixture_config("olmoe-tiny");
  config.erase("model_type");
  EXPECT_NE(error_of(config).find("'model_type'"), std::string::npos);
}

TEST(ModelConfig, UnknownModelTypeListsSupportedOnes) {
  auto config = fixture_config("mixtral-tiny");
  config["model_type"] = "gpt_bigcode";
  std::string message = error_of(config);
  EXPECT_NE(message.find("unknown model_type 'gpt_bigcode'"), std::string::npos) << message;
  EXPECT_NE(message.find("qwen3_moe"), std::string::npos) << message;
}

TEST(ModelConfig, WrongTypesAndRangesAreErrors) {
  auto config = fixture_config("mixtral-tiny");
  config["hidden_size"] = "64";
  EXPECT_NE(error_of(config).find("'hidden_size' must be an integer"), std::string::npos);
  config = fixture_config("mixtral-tiny");
  config["num_hidden_layers"] = -2;
  EXPECT_NE(error_of(config).find("outside"), std::string::npos);
  config = fixture_config("mixtral-tiny");
  config["num_experts_per_tok"] = 9;
  EXPECT_NE(error_of(config).find("exceeds the 8 experts"), std::string::npos);
  // Products of capped fields are capped too: 65537 heads of 65536 would wrap
  // the 32-bit q width to 65536.
  config = fixture_config("mixtral-tiny");
  config["num_attention_heads"] = 65537;
  config["num_key_value_heads"] = 1;
  config["head_dim"] = 65536;
  EXPECT_NE(error_of(config).find("num_attention_heads x head_dim = 65537 x 65536"), std::string::npos)
      << error_of(config);
  // More heads than hidden units and no head_dim: the default would be 0.
  config = fixture_config("olmoe-tiny");
  config["num_attention_heads"] = 80;
  config["num_key_value_heads"] = 4;
  config.erase("head_dim");
  EXPECT_NE(error_of(config).find("head_dim is 0 (hidden_size 64 / num_attention_heads 80)"), std::string::npos)
      << error_of(config);
  config = fixture_config("mixtral-tiny");
  config["num_hidden_layers"] = 1024;
  config["num_local_experts"] = 4096;
  EXPECT_NE(error_of(config).find("num_hidden_layers x experts = 1024 x 4096"), std::string::npos) << error_of(config);
  config["num_local_experts"] = 128;  // 131 072 in all: still allowed
  EXPECT_TRUE(parse_hf_config(config.dump(), "config.json").ok()) << error_of(config);
  config = fixture_config("mixtral-tiny");
  config["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(config).find("not a multiple"), std::string::npos);
  config = fixture_config("mixtral-tiny");
  config["rope_scaling"] = {{"type", "yarn"}, {"factor", 4}};
  EXPECT_NE(error_of(config).find("rope_scaling"), std::string::npos);
  EXPECT_NE(error_of(nlohmann::json::array()).find("not a JSON object"), std::string::npos);
  auto not_json = parse_hf_config("{", "config.json");
  ASSERT_FALSE(not_json.ok());
  EXPECT_NE(not_json.error().message.find("not valid JSON"), std::string::npos);
  // BOS and EOS ids must name rows of the model's vocabulary (the chat
  // templates put BOS into prompts).
  config = fixture_config("mixtral-tiny");
  const int vocab = config["vocab_size"].get<int>();
  config["eos_token_id"] = vocab;
  EXPECT_NE(error_of(config).find("'eos_token_id' is " + std::to_string(vocab) + ", not a token"), std::string::npos)
      << error_of(config);
  config = fixture_config("mixtral-tiny");
  config["bos_token_id"] = nlohmann::json::array({vocab + 7});
  EXPECT_NE(error_of(config).find("'bos_token_id'"), std::string::npos) << error_of(config);
  config = fixture_config("mixtral-tiny");
  config["eos_token_id"] = vocab - 1;
  EXPECT_TRUE(parse_hf_config(config.dump(), "config.json").ok());
  config["eos_token_id"] = nlohmann::json::array({3, vocab});
  EXPECT_NE(error_of(config).find("'eos_token_id' lists " + std::to_string(vocab) + ", not a token"),
            std::string::npos)
      << error_of(config);
}

// Every id of a list ends generation (Qwen's and Phi-3.5-MoE's configs list
// several); eos_token_id is the first.
TEST(ModelConfig, EveryIdOfAnEosListIsAnEndToken) {
  auto config = fixture_config("olmoe-tiny");
  auto single = parse_hf_config(config.dump(), "config.json");
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->end_token_ids, std::vector<std::int32_t>{506});
  config["eos_token_id"] = nlohmann::json::array({7, 506, 7, 12});
  auto listed = parse_hf_config(config.dump(), "config.json");
  ASSERT_TRUE(listed.ok()) << listed.error().message;
  EXPECT_EQ(listed->end_token_ids, (std::vector<std::int32_t>{7, 506, 12}));
  EXPECT_EQ(listed->eos_token_id(), 7);
  config["eos_token_id"] = nullptr;
  auto none = parse_hf_config(config.dump(), "config.json");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->end_token_ids.empty());
  EXPECT_FALSE(none->eos_token_id().has_value());
  config["eos_token_id"] = nlohmann::json::array({7, "x"});
  EXPECT_NE(error_of(config).find("must be an integer"), std::string::npos) << error_of(config);
}

TEST(ModelConfig, SparseStepAndMlpOnlyLayersChooseDenseLayers) {
  auto config = fixture_config("qwen2moe-tiny");
  config["num_hidden_layers"] = 6;
  config["decoder_sparse_step"] = 2;
  config["mlp_only_layers"] = {3};
  auto parsed = parse_hf_config(config.dump(), "q2");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  std::vector<bool> expected = {false, true, false, false, false, true};
  EXPECT_EQ(parsed->layer_is_moe, expected);
  EXPECT_EQ(parsed->dense_ff, 176);

  config["mlp_only_layers"] = {7};
  EXPECT_NE(error_of(config).find("not a layer index"), std::string::npos);
}

TEST(ModelConfig, MissingConfigFileIsNamed) {
  auto parsed = load_hf_config("/nonexistent/config.json");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.error().message.find("/nonexistent/config.json"), std::string::npos);
}

}  // namespace
}  // namespace colibri
