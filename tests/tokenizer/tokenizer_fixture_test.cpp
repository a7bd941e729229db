// The four tiny-model fixtures share one byte-level BPE tokenizer (Qwen2 regex); their
// reference.json holds llama.cpp's ids for three prompts (no BOS, parse_special off).
#include <gtest/gtest.h>

#include <string>

#include "tokenizer_test_util.h"

namespace colibri {
namespace {

class FixtureTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTokenizer, PromptsMatchReferenceIdsAndBytes) {
  const auto dir = test::data_dir() / "fixtures" / GetParam();
  const Tokenizer tok = test::load_or_die(dir);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_FALSE(tok.bos_id().has_value());
  EXPECT_EQ(tok.eos_id(), tok.token_to_id("<|endoftext|>"));
  EXPECT_FALSE(tok.chat_template().empty());

  const auto reference = test::read_json(dir / "reference.json");
  ASSERT_GT(reference["prompts"].size(), 0u);
  for (const auto& prompt : reference["prompts"]) {
    SCOPED_TRACE(prompt["prompt_id"].get<std::string>());
    const std::string text = test::from_hex(prompt["prompt_hex"].get<std::string>());
    ASSERT_EQ(text, prompt["prompt"].get<std::string>());
    const auto expected = test::ids_of(prompt["tokens"]);

    auto ids = tok.encode(text);  // defaults: add_special_tokens (adds nothing here), no special parsing
    ASSERT_TRUE(ids.ok()) << ids.error().message;
    EXPECT_EQ(*ids, expected);
    auto plain = tok.encode(text, {.add_special_tokens = false});
    ASSERT_TRUE(plain.ok());
    EXPECT_EQ(*plain, expected);

    const auto& pieces = prompt["token_pieces_hex"];
    ASSERT_EQ(pieces.size(), expected.size());
    std::string concatenated;
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const std::string bytes = tok.token_bytes(expected[i]);
      EXPECT_EQ(test::to_hex(bytes), pieces[i].get<std::string>()) << "token " << i << " id " << expected[i];
      concatenated += bytes;
    }
    EXPECT_EQ(concatenated, text);

    auto decoded = tok.decode(expected);
    ASSERT_TRUE(decoded.ok()) << decoded.error().message;
    EXPECT_EQ(*decoded, text);

    StreamingDecoder stream(tok);
    std::string streamed;
    for (std::int32_t id : expected) streamed += stream.push(id);
    streamed += stream.flush();
    EXPECT_EQ(streamed, text);
  }
}

INSTANTIATE_TEST_SUITE_P(AllFixtures, FixtureTokenizer,
                         ::testing::Values("mixtral-tiny", "olmoe-tiny", "qwen2moe-tiny", "qwen3moe-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace colibri
