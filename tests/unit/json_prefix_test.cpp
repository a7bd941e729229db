#include "runtime/json_prefix.h"
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace colibri {
namespace {

// How many bytes of `text` a fresh JsonPrefix accepts, one at a time.
std::size_t accepted(std::string_view text) {
  JsonPrefix json;
  for (std::size_t i = 0; i < text.size(); ++i)
    if (!json.push(static_cast<unsigned char>(text[i]))) return i;
  return text.size();
}

bool complete(std::string_view text) {
  JsonPrefix json;
  return json.push(text) && json.complete();
}

TEST(JsonPrefix, AcceptsObjectsOfEveryKindOfValue) {
  for (const char* text : {
           R"({})",
           R"({"a":1})",
           R"({ "a" : [ 1 , -2.5e+3 , 0 , 0.0 , 1E9 , -0 ] , "b" : { } , "c" : [ ] } )",
           R"({"t":true,"f":false,"n":null,"s":"x\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00\ud7ff é"})",
           "{\n  \"nested\": {\"deeper\": [[[{\"k\": \"v\"}]]]},\n  \"n\": 12345678901234567890\n}\n",
       }) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(complete(text));
    EXPECT_TRUE(nlohmann::json::accept(text));
  }
}

TEST(JsonPrefix, RefusesTheFirstByteThatCannotContinue) {
  struct Case {
    const char* text;
    std::size_t good;  // bytes accepted before the refusal
  };
  for (const Case& c : {
           Case{"[1]", 0},             // the top level must be an object
           Case{"\"x\"", 0},
           Case{"x", 0},
           Case{"{a:1}", 1},           // keys are strings
           Case{"{\"a\" 1}", 5},       // colon missing
           Case{"{\"a\":01}", 6},      // no leading zeros
           Case{"{\"a\":1.}", 7},      // a digit must follow the point
           Case{"{\"a\":-}", 6},
           Case{"{\"a\":1e}", 7},
           Case{"{\"a\":tru}", 8},
           Case{"{\"a\":nul1}", 8},
           Case{"{\"a\":1,}", 7},      // no trailing commas
           Case{"{\"a\":[1,]}", 8},
           Case{"{\"a\":[1}", 7},      // closers must match
           Case{"{\"a\":{]}", 6},
           Case{"{\"a\":\"\x01\"}", 6},  // raw control characters
           Case{"{\"a\":\"\\x\"}", 7},   // unknown escape
           Case{"{\"a\":\"\\u12G4\"}", 10},
           Case{"{\"a\":\"\xC3\"}", 7},          // a character cut by the quote
           Case{"{\"a\":\"\xC0\xAF\"}", 6},      // an overlong lead byte
           Case{"{\"a\":\"\xED\xA0\x80\"}", 7},  // a surrogate
           Case{"{\"a\":\"\xF4\x90\x80\x80\"}", 7},  // past U+10FFFF
           Case{"{\"a\":\"\x80\"}", 6},          // a lone continuation byte
           Case{"{\"a\":1e999}", 9},  // exponents of at most two digits
           Case{"{\"a\":\"\\uDC00\"}", 9},   // a lone low surrogate, refused at its second digit
           Case{"{\"a\":\"\\uD83Dx\"}", 12}, // a high one must be followed by its low half
           Case{"{\"a\":\"\\uD83D\\u0041\"}", 14},
           Case{"{\"a\":\"\\uD83D\"}", 12},
           Case{"{}x", 2},             // nothing but whitespace after the object
           Case{"{}{}", 2},
       }) {
    SCOPED_TRACE(c.text);
    EXPECT_EQ(accepted(c.text), c.good);
  }
}

TEST(JsonPrefix, ARefusedByteLeavesTheStateAsItWas) {
  JsonPrefix json;
  ASSERT_TRUE(json.push(std::string_view("{\"a\":12")));
  EXPECT_FALSE(json.push(std::string_view("3x")));  // all or nothing
  EXPECT_FALSE(json.push('x'));
  EXPECT_TRUE(json.push(std::string_view("3}")));
  EXPECT_TRUE(json.complete());
}

TEST(JsonPrefix, DepthAndWhitespaceAreBounded) {
  std::string deep = "{\"a\":";
  for (int i = 1; i < JsonPrefix::kMaxDepth; ++i) deep += "[";
  EXPECT_EQ(accepted(deep + "["), deep.size());
  EXPECT_EQ(accepted(deep), deep.size());
  const std::string blanks(JsonPrefix::kMaxWhitespaceRun, ' ');
  EXPECT_TRUE(complete("{" + blanks + "}"));
  EXPECT_EQ(accepted("{" + blanks + " }"), 1 + blanks.size());
  EXPECT_TRUE(complete("{\"a\":" + blanks + "1" + blanks + "}" + blanks));
  EXPECT_EQ(accepted(" {}"), 0u);  // the text starts at its brace
}

// Soundness: a random walk that only ever takes bytes push() accepts, and
// leans towards closing, ends in a complete text, and every complete text it
// reaches is JSON whose top level is an object.
TEST(JsonPrefix, RandomWalksEndInParsableObjects) {
  std::mt19937 rng(5);
  const std::string alphabet = "{}[]\",:0123456789-+.eE truefalsn\\/bfnrtu\n\tabcdAFD\x01\xC3\xA9";
  std::size_t completed = 0;
  for (int walk = 0; walk < 400; ++walk) {
    JsonPrefix json;
    std::string text;
    for (int step = 0; step < 400 && !json.complete(); ++step) {
      // Late in a walk, closers and quotes first, so most walks finish.
      const std::string preferred = step > 150 ? "\"}]0" : "";
      bool moved = false;
      for (char c : preferred)
        if (std::uniform_int_distribution<int>(0, 2)(rng) == 0 && json.push(static_cast<unsigned char>(c))) {
          text += c;
          moved = true;
          break;
        }
      for (int attempt = 0; !moved && attempt < 200; ++attempt) {
        const char c = alphabet[std::uniform_int_distribution<std::size_t>(0, alphabet.size() - 1)(rng)];
        if (json.push(static_cast<unsigned char>(c))) {
          text += c;
          moved = true;
        }
      }
      for (std::size_t i = 0; !moved && i < alphabet.size(); ++i)  // a state few bytes continue
        if (json.push(static_cast<unsigned char>(alphabet[i]))) {
          text += alphabet[i];
          moved = true;
        }
      ASSERT_TRUE(moved) << "stuck after: " << text;
    }
    if (!json.complete()) continue;
    ++completed;
    // accept(): the grammar alone (parse() also refuses numbers past a double's range).
    EXPECT_TRUE(nlohmann::json::accept(text)) << nlohmann::json(text).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
    EXPECT_EQ(text.front(), '{') << text;  // an object at the top
  }
  EXPECT_GT(completed, 300u);
}

TEST(JsonPrefix, MaskKeepsExactlyTheTokensThatContinue) {
  const JsonVocabulary vocabulary({"{", "}", "\"", "\"a\"", "a", ":", " ", "", "{\"", "<|end|>", "1,"},
                                  {false, false, false, false, false, false, false, false, false, true, false});
  std::vector<float> logits(vocabulary.bytes.size() + 2, 0.0f);  // two ids beyond the table
  const float banned = -std::numeric_limits<float>::infinity();
  JsonPrefix json;
  EXPECT_EQ(mask_json_logits(json, vocabulary, logits), 2u);  // "{" and "{\"" (no whitespace before it)
  EXPECT_EQ(logits, (std::vector<float>{0, banned, banned, banned, banned, banned, banned, banned, 0, banned, banned,
                                        banned, banned}));
  ASSERT_TRUE(json.push(std::string_view("{\"k\":")));
  std::fill(logits.begin(), logits.end(), 0.0f);
  // A value: "{", "\"", "\"a\"", " ", "{\"", "1," (the 1 ends at the comma).
  EXPECT_EQ(mask_json_logits(json, vocabulary, logits), 6u);
  EXPECT_EQ(logits[4], banned);   // a bare letter
  EXPECT_EQ(logits[9], banned);   // banned, though "<" could never start a value anyway
  EXPECT_EQ(logits[10], 0.0f);
  // End ids are masked too and no longer counted, once each however often listed.
  std::fill(logits.begin(), logits.end(), 0.0f);
  const std::vector<std::int32_t> end_ids = {10, 4, 10, 99};
  EXPECT_EQ(mask_json_logits(json, vocabulary, logits, end_ids), 5u);  // "1," gone; "a" was never selectable
  EXPECT_EQ(logits[10], banned);
  // Inside a string the plain tokens pass by lookup; the others still walk
  // their bytes: "\"" and "{\"" close the key (then a ':' must come), "\"a\"" cannot.
  ASSERT_TRUE(json.push(std::string_view("{\"")));
  ASSERT_TRUE(json.in_plain_string());
  std::fill(logits.begin(), logits.end(), 0.0f);
  EXPECT_EQ(mask_json_logits(json, vocabulary, logits), 8u);
  EXPECT_EQ(logits, (std::vector<float>{0, 0, 0, banned, 0, 0, 0, banned, 0, banned, 0, banned, banned}));
}

// A SentencePiece vocabulary's first token loses its leading space in the text
// ("▁{" is "{" there), so it may start the object; the mask read every token
// as mid-text (" {"), which no object starts with, and forced the rarer "{".
TEST(JsonPrefix, TheFirstTokenIsTakenAsItStartsTheText) {
  auto llama = Tokenizer::load(std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "tokenizers" / "llama2");
  ASSERT_TRUE(llama.ok()) << llama.error().message;
  const JsonVocabulary vocabulary = json_vocabulary(*llama);
  ASSERT_FALSE(vocabulary.first_bytes.empty());
  const auto spaced_brace = llama->token_to_id("\u2581{");
  ASSERT_TRUE(spaced_brace.has_value());
  const auto id = static_cast<std::size_t>(*spaced_brace);
  EXPECT_EQ(vocabulary.bytes[id], " {");
  EXPECT_EQ(vocabulary.token(id, true), "{");
  std::vector<float> logits(vocabulary.bytes.size(), 0.0f);
  JsonPrefix json;
  EXPECT_GT(mask_json_logits(json, vocabulary, logits), 1u);
  EXPECT_EQ(logits[id], 0.0f) << "\"\u2581{\" cannot start the object";
  ASSERT_TRUE(json.push(vocabulary.token(id, json.at_start())));
  // Mid-text the same token is " {": a value of a key, say.
  ASSERT_TRUE(json.push(std::string_view("\"k\":")));
  std::fill(logits.begin(), logits.end(), 0.0f);
  mask_json_logits(json, vocabulary, logits);
  EXPECT_EQ(logits[id], 0.0f);
  // A byte-level vocabulary reads the same first or not.
  auto qwen = Tokenizer::load(std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "fixtures" / "qwen3moe-tiny");
  ASSERT_TRUE(qwen.ok()) << qwen.error().message;
  EXPECT_TRUE(json_vocabulary(*qwen).first_bytes.empty());
}

// The mask's shortcuts (a lookup inside strings, groups by first byte
// elsewhere) give what walking every token's bytes gives, in every kind of state.
TEST(JsonPrefix, TheMaskIsWhatEachTokensBytesWouldGive) {
  std::mt19937 rng(9);
  std::vector<std::string> bytes;
  for (int i = 0; i < 3000; ++i) {
    std::string token;
    for (int j = 0, n = 1 + static_cast<int>(rng() % 5); j < n; ++j) token += static_cast<char>(rng() % 256);
    bytes.push_back(token);
  }
  for (const char* structural : {"{", "}", "[", "]", ",", ":", " ", "\n  ", "\"", "\":", "\",", "1", "0.", "-", "e+",
                                 "true", "fal", "null", "}]", "\"}", "", " {\""})
    bytes.push_back(structural);
  std::vector<bool> banned(bytes.size());
  banned[7] = true;
  const JsonVocabulary vocabulary(bytes, banned);
  for (const char* prefix : {"{\"k", "{\"k\": \"v", "{\"k\": [\"", "{\"k\": \"\\n", "{\"k\": \"\\uD83D", "{\"k\": \"\xC3",
                             "", "{", "{\"k\"", "{\"k\":", "{\"k\": [1", "{\"k\": [1, ", "{\"k\": tr", "{\"k\": 1.5e",
                             "{\"k\": {}", "{\"k\": -", "{}"}) {
    JsonPrefix json;
    ASSERT_TRUE(json.push(std::string_view(prefix)));
    std::vector<float> logits(bytes.size(), 1.0f);
    mask_json_logits(json, vocabulary, logits);
    for (std::size_t id = 0; id < bytes.size(); ++id) {
      JsonPrefix next = json;
      const bool expected = !banned[id] && !bytes[id].empty() && next.push(bytes[id]);
      EXPECT_EQ(logits[id] == 1.0f, expected) << "'" << prefix << "' token " << id;
    }
  }
}

}  // namespace
}  // namespace colibri
