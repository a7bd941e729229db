// Real vocabularies (Qwen3 byte-level BPE, Llama 2 SentencePiece-style BPE) against
// expectations produced by Hugging Face's JS tokenizers port
// (tests/tokenizer/gen/generate_expectations.mjs): ids for each string with and without
// BOS and special-token parsing, and the decoded text.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "tokenizer_test_util.h"

namespace colibri {
namespace {

const Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    const auto start = std::chrono::steady_clock::now();
    it = cache.emplace(name, test::load_or_die(test::data_dir() / "tokenizers" / name)).first;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("[ load     ] %s tokenizer in %.0f ms\n", name.c_str(), ms);
  }
  return it->second;
}

std::string show(const std::vector<std::int32_t>& ids) {
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ids[i]);
  }
  out += ']';
  return out;
}

class RealVocab : public ::testing::TestWithParam<std::string> {};

TEST_P(RealVocab, EncodeAndDecodeMatchHuggingFace) {
  const Tokenizer& tok = tokenizer(GetParam());
  const auto doc = test::read_json(test::data_dir() / "tokenizers" / GetParam() / "expectations.json");
  const auto& cases = doc["cases"];
  ASSERT_GE(cases.size(), 300u);
  int failures = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const std::string text = test::from_hex(c["hex"].get<std::string>());
    ASSERT_EQ(text, c["text"].get<std::string>()) << "case " << i << ": text and hex disagree";
    const std::string label = "case " + std::to_string(i) + " " + c["text"].dump();
    const struct {
      const char* field;
      EncodeOptions options;
    } variants[] = {
        {"ids", {.add_special_tokens = true, .parse_special = false}},
        {"ids_no_bos", {.add_special_tokens = false, .parse_special = false}},
        {"ids_special", {.add_special_tokens = true, .parse_special = true}},
        {"ids_special_no_bos", {.add_special_tokens = false, .parse_special = true}},
    };
    for (const auto& v : variants) {
      const auto expected = test::ids_of(c[v.field]);
      auto ids = tok.encode(text, v.options);
      ASSERT_TRUE(ids.ok()) << label << ": " << ids.error().message;
      if (*ids != expected) {
        ++failures;
        ADD_FAILURE() << label << " " << v.field << "\n  expected " << show(expected) << "\n  got      "
                      << show(*ids);
      }
    }
    const struct {
      const char* ids_field;
      const char* text_field;
      bool skip;
    } decodes[] = {
        {"ids_special", "decoded_hex", false},
        {"ids_special", "decoded_skip_special_hex", true},
        {"ids_no_bos", "decoded_plain_hex", false},
    };
    for (const auto& d : decodes) {
      const auto ids = test::ids_of(c[d.ids_field]);
      auto decoded = tok.decode(ids, d.skip);
      ASSERT_TRUE(decoded.ok()) << label << ": " << decoded.error().message;
      const std::string expected = test::from_hex(c[d.text_field].get<std::string>());
      if (*decoded != expected) {
        ++failures;
        ADD_FAILURE() << label << " " << d.text_field << "\n  expected hex " << test::to_hex(expected)
                      << "\n  got hex      " << test::to_hex(*decoded);
      }
    }
    // Streaming the plain ids gives the same text as decode().
    StreamingDecoder stream(tok);
    std::string streamed;
    for (std::int32_t id : test::ids_of(c["ids_no_bos"])) streamed += stream.push(id);
    streamed += stream.flush();
    EXPECT_EQ(test::to_hex(streamed), c["decoded_plain_hex"].get<std::string>()) << label << " (streamed)";
  }
  std::printf("[ strings  ] %s: %zu strings x 4 encodings + 3 decodings, %d mismatches\n", GetParam().c_str(),
              cases.size(), failures);
}

TEST_P(RealVocab, Metadata) {
  const Tokenizer& tok = tokenizer(GetParam());
  if (GetParam() == "qwen3") {
    EXPECT_EQ(tok.vocab_size(), 151669);
    EXPECT_FALSE(tok.add_bos());
    EXPECT_FALSE(tok.bos_id().has_value());
    EXPECT_EQ(tok.eos_id(), 151645);  // <|im_end|>
    EXPECT_TRUE(tok.is_special(151644));
    EXPECT_FALSE(tok.is_special(151667));  // <think> is added but not special
    EXPECT_NE(tok.chat_template().find("<|im_start|>"), std::string::npos);
    EXPECT_EQ(tok.token_to_id("<|im_start|>"), 151644);
    EXPECT_EQ(tok.token_bytes(*tok.token_to_id("\xC4\xA0the")), " the");  // "Ġthe"
  } else {
    EXPECT_EQ(tok.vocab_size(), 32000);
    EXPECT_TRUE(tok.add_bos());
    EXPECT_FALSE(tok.add_eos());
    EXPECT_EQ(tok.bos_id(), 1);
    EXPECT_EQ(tok.eos_id(), 2);
    EXPECT_TRUE(tok.is_special(0));
    EXPECT_FALSE(tok.is_special(13));
    EXPECT_TRUE(tok.chat_template().empty());
    EXPECT_EQ(tok.token_bytes(*tok.token_to_id("\xE2\x96\x81the")), " the");  // "▁the"
    EXPECT_EQ(tok.token_bytes(*tok.token_to_id("<0xE2>")), "\xE2");
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, RealVocab, ::testing::Values("qwen3", "llama2"),
                         [](const ::testing::TestParamInfo<std::string>& param) { return param.param; });

}  // namespace
}  // namespace colibri
