// Unit cases: streaming, errors, special-token parsing, pipeline pieces on small
// hand-made tokenizers, Unicode normalization, and encode time on 100k-character inputs.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <thread>

#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace colibri {
namespace {

using nlohmann::json;

const Tokenizer& real(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, test::load_or_die(test::data_dir() / "tokenizers" / name)).first;
  return it->second;
}

std::vector<std::int32_t> encode_ok(const Tokenizer& tok, std::string_view text, EncodeOptions options = {}) {
  auto ids = tok.encode(text, options);
  EXPECT_TRUE(ids.ok()) << ids.error().message;
  return ids.ok() ? *ids : std::vector<std::int32_t>{};
}

// A small tokenizer.json: characters a b c d - ▁ plus a few merges.
json tiny_tokenizer() {
  return json::parse(R"({
    "version": "1.0",
    "added_tokens": [],
    "normalizer": null,
    "pre_tokenizer": null,
    "post_processor": null,
    "decoder": null,
    "model": {
      "type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
      "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "-": 5, " ": 6, "ab": 7, "abc": 8, "cd": 9,
                "\u2581": 10, "\u2581a": 11, "\u2581b": 12, "bc": 13, "<m>": 14, "hi": 15, "h": 16, "i": 17},
      "merges": ["a b", "ab c", "c d", "\u2581 a", "\u2581 b", "h i"]
    }
  })");
}

Tokenizer from(const json& tokenizer_json, const json& config = json()) {
  auto tok = Tokenizer::from_json(tokenizer_json.dump(), config.is_null() ? "" : config.dump(), "tiny");
  if (!tok.ok()) {
    ADD_FAILURE() << tok.error().message;
    std::abort();
  }
  return std::move(*tok);
}

// ---- Streaming ------------------------------------------------------------------------

TEST(StreamingDecoder, EmojiByteFallbackIsHeldUntilComplete) {
  const Tokenizer& tok = real("llama2");
  const std::string llama = "\xF0\x9F\xA6\x99";  // U+1F999, not in the Llama 2 vocabulary
  const auto ids = encode_ok(tok, llama + "x", {.add_special_tokens = false});
  // "▁" then four <0xNN> byte tokens, then "x".
  ASSERT_EQ(ids.size(), 6u);
  EXPECT_EQ(*tok.id_to_token(ids[1]), "<0xF0>");
  StreamingDecoder stream(tok);
  EXPECT_EQ(stream.push(ids[0]), "");  // the leading space of the text is stripped, as decode() does
  EXPECT_EQ(stream.push(ids[1]), "");
  EXPECT_EQ(stream.push(ids[2]), "");
  EXPECT_EQ(stream.push(ids[3]), "");
  EXPECT_EQ(stream.push(ids[4]), llama);
  EXPECT_EQ(stream.push(ids[5]), "x");
  EXPECT_EQ(stream.flush(), "");
  EXPECT_EQ(*tok.decode(ids), llama + "x");
}

TEST(StreamingDecoder, CjkSplitAcrossByteLevelTokens) {
  const Tokenizer& tok = real("qwen3");
  const std::string text = "\xE9\xBE\x98\xF0\xA0\x80\x80!";  // 龘 (2 tokens) then U+20000 (3 tokens)
  const auto ids = encode_ok(tok, text);
  ASSERT_EQ(ids.size(), 6u);
  EXPECT_EQ(tok.token_bytes(ids[0]), "\xE9\xBE");
  StreamingDecoder stream(tok);
  std::vector<std::string> out;
  for (std::int32_t id : ids) out.push_back(stream.push(id));
  EXPECT_EQ(out, (std::vector<std::string>{"", "\xE9\xBE\x98", "", "", "\xF0\xA0\x80\x80", "!"}));
  EXPECT_EQ(stream.flush(), "");
}

TEST(StreamingDecoder, FlushReplacesIncompleteBytes) {
  const Tokenizer& tok = real("qwen3");
  const auto ids = encode_ok(tok, "\xE9\xBE\x98");
  StreamingDecoder stream(tok);
  EXPECT_EQ(stream.push(ids[0]), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");  // one U+FFFD for the truncated sequence
  // decode() of the same partial id: Rust's from_utf8_lossy gives the same.
  EXPECT_EQ(*tok.decode(std::vector<std::int32_t>{ids[0]}), "\xEF\xBF\xBD");
}

TEST(StreamingDecoder, SkipSpecialAndInvalidBytesInTheMiddle) {
  const Tokenizer& tok = real("llama2");
  StreamingDecoder stream(tok, /*skip_special=*/true);
  EXPECT_EQ(stream.push(1), "");                             // <s> skipped
  EXPECT_EQ(stream.push(*tok.token_to_id("<0xFF>")), "\xEF\xBF\xBD");  // never valid: replaced at once
  EXPECT_EQ(stream.push(*tok.token_to_id("\xE2\x96\x81hi")), " hi");
  EXPECT_EQ(stream.push(999999), "");  // out of range: ignored
  StreamingDecoder with_special(tok);
  EXPECT_EQ(with_special.push(1), "<s>");
  EXPECT_EQ(with_special.push(*tok.token_to_id("\xE2\x96\x81hi")), " hi");
}

// ---- Decode ---------------------------------------------------------------------------

TEST(Decode, OutOfRangeIdIsAnErrorNamingTheId) {
  const Tokenizer& tok = real("qwen3");
  auto r = tok.decode(std::vector<std::int32_t>{9707, 151669});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("151669"), std::string::npos) << r.error().message;
  auto negative = tok.decode(std::vector<std::int32_t>{-5});
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.error().message.find("-5"), std::string::npos) << negative.error().message;
  EXPECT_EQ(tok.token_bytes(151669), "");
  EXPECT_EQ(tok.token_bytes(-1), "");
  EXPECT_EQ(*tok.decode(std::vector<std::int32_t>{}), "");
}

TEST(Decode, ByteFallbackInvalidRunIsOneReplacementPerByte) {
  // tokenizers' ByteFallback decoder: an invalid run of byte tokens becomes one U+FFFD per byte.
  const Tokenizer& tok = real("llama2");
  const std::vector<std::int32_t> ids{*tok.token_to_id("<0xE9>"), *tok.token_to_id("<0xBE>")};
  EXPECT_EQ(*tok.decode(ids), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

// ---- Special tokens -------------------------------------------------------------------

TEST(SpecialTokens, ParseSpecialOnlyWhenAsked) {
  const Tokenizer& tok = real("qwen3");
  const std::string text = "<|im_start|>user";
  const auto parsed = encode_ok(tok, text, {.parse_special = true});
  EXPECT_EQ(parsed, (std::vector<std::int32_t>{151644, 872}));
  const auto literal = encode_ok(tok, text);
  EXPECT_EQ(std::count(literal.begin(), literal.end(), 151644), 0);
  EXPECT_GT(literal.size(), 3u);
  EXPECT_EQ(*tok.decode(literal), text);  // same text, as ordinary tokens
  // Non-special added tokens are always recognised.
  EXPECT_EQ(encode_ok(tok, "<think>"), (std::vector<std::int32_t>{151667}));

  const Tokenizer& llama = real("llama2");
  EXPECT_EQ(encode_ok(llama, "</s>", {.parse_special = true}), (std::vector<std::int32_t>{1, 2}));
  const auto plain = encode_ok(llama, "</s>");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0);
}

TEST(SpecialTokens, AddedTokenFlags) {
  json t = tiny_tokenizer();
  t["added_tokens"] = json::parse(R"([
    {"id": 14, "content": "<m>", "single_word": false, "lstrip": true, "rstrip": true, "normalized": false, "special": false},
    {"id": 15, "content": "hi", "single_word": true, "lstrip": false, "rstrip": false, "normalized": false, "special": false}
  ])");
  const Tokenizer tok = from(t);
  // lstrip/rstrip swallow the spaces around <m>.
  EXPECT_EQ(encode_ok(tok, "a <m> b"), (std::vector<std::int32_t>{1, 14, 2}));
  EXPECT_EQ(encode_ok(tok, "a<m>b"), (std::vector<std::int32_t>{1, 14, 2}));
  // single_word: "hi" alone is the added token; inside a word it is ordinary text (h i -> "hi" by merge,
  // which here happens to be the same id, so look at the split around it instead).
  EXPECT_EQ(encode_ok(tok, "hi a"), (std::vector<std::int32_t>{15, 6, 1}));
  EXPECT_EQ(encode_ok(tok, "ahi"), (std::vector<std::int32_t>{1, 15}));  // via the BPE merge "h i"
  EXPECT_EQ(encode_ok(tok, "chid"), (std::vector<std::int32_t>{3, 15, 4}));
}

TEST(SpecialTokens, NormalizedAddedTokenMatchesItsNormalizedForm) {
  json t = tiny_tokenizer();
  t["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "\u2581"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})");
  t["added_tokens"] = json::parse(
      R"([{"id": 9, "content": "cd", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}])");
  const Tokenizer tok = from(t);
  // The token's pattern is normalize("cd") = "▁cd", looked for in the normalized text "▁ab▁cd".
  EXPECT_EQ(encode_ok(tok, "ab cd"), (std::vector<std::int32_t>{10, 7, 9}));
  EXPECT_EQ(encode_ok(tok, "abcd"), (std::vector<std::int32_t>{10, 8, 4}));  // no "▁cd" in "▁abcd"
}

// ---- Model options --------------------------------------------------------------------

TEST(Bpe, MergeFormatsAndOptions) {
  json strings = tiny_tokenizer();
  json pairs = tiny_tokenizer();
  pairs["model"]["merges"] = json::parse(R"([["a","b"],["ab","c"],["c","d"],["\u2581","a"],["\u2581","b"],["h","i"]])");
  EXPECT_EQ(encode_ok(from(strings), "abcd"), (std::vector<std::int32_t>{8, 4}));
  EXPECT_EQ(encode_ok(from(pairs), "abcd"), (std::vector<std::int32_t>{8, 4}));
  EXPECT_EQ(encode_ok(from(strings), "bcd"), (std::vector<std::int32_t>{2, 9}));  // "bc" has no merge

  // Unknown characters: one <unk> each, or fused.
  EXPECT_EQ(encode_ok(from(strings), "axyb"), (std::vector<std::int32_t>{1, 0, 0, 2}));
  json fuse = tiny_tokenizer();
  fuse["model"]["fuse_unk"] = true;
  EXPECT_EQ(encode_ok(from(fuse), "axyb"), (std::vector<std::int32_t>{1, 0, 2}));

  // ignore_merges: a word that is in the vocabulary is taken whole.
  json ignore = tiny_tokenizer();
  EXPECT_EQ(encode_ok(from(ignore), "bc"), (std::vector<std::int32_t>{2, 3}));
  ignore["model"]["ignore_merges"] = true;
  EXPECT_EQ(encode_ok(from(ignore), "bc"), (std::vector<std::int32_t>{13}));
}

TEST(PreTokenizers, MetaspaceFirstAndDecoder) {
  json t = tiny_tokenizer();
  t["pre_tokenizer"] = json::parse(R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true})");
  t["decoder"] = json::parse(R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true})");
  t["added_tokens"] = json::parse(R"([{"id": 14, "content": "<m>", "special": true, "normalized": false}])");
  const Tokenizer tok = from(t);
  const auto ids = encode_ok(tok, "a b");
  EXPECT_EQ(ids, (std::vector<std::int32_t>{11, 12}));
  EXPECT_EQ(*tok.decode(ids), "a b");
  // "first": only the piece at the start of the input gets the prefix.
  EXPECT_EQ(encode_ok(tok, "<m>a", {.parse_special = true}), (std::vector<std::int32_t>{14, 1}));
  EXPECT_EQ(encode_ok(tok, "a<m>a", {.parse_special = true}), (std::vector<std::int32_t>{11, 14, 1}));
}

TEST(PreTokenizers, SplitBehaviorsAsDocumented) {
  using namespace tokenizer_detail;
  const std::string text = "the-final--countdown";
  auto run = [&](SplitBehavior behavior, bool invert = false) {
    std::vector<Span> spans;
    EXPECT_TRUE(split_text(text, Pattern::literal("-"), behavior, invert, spans).ok());
    std::vector<std::string> out;
    for (const Span& s : spans) out.push_back(text.substr(s.start, s.end - s.start));
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(run(SplitBehavior::kRemoved), (V{"the", "final", "countdown"}));
  EXPECT_EQ(run(SplitBehavior::kIsolated), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(run(SplitBehavior::kMergedWithPrevious), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(run(SplitBehavior::kMergedWithNext), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(run(SplitBehavior::kContiguous), (V{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(run(SplitBehavior::kRemoved, true), (V{"-", "-", "-"}));
}

TEST(Regex, OnigurumaSemantics) {
  using namespace tokenizer_detail;
  auto space = Regex::compile("\\s+", "test");
  ASSERT_TRUE(space.ok());
  std::vector<Span> found;
  ASSERT_TRUE((*space)->find_all("a\xE1\xA0\x8E" "b\xC2\x85" "c\xE3\x80\x80", found).ok());
  // U+180E is not White_Space (PCRE2's own \s would take it); U+0085 and U+3000 are.
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].start, 5u);
  auto hex = Regex::compile("\\h+", "test");
  ASSERT_TRUE(hex.ok());
  found.clear();
  ASSERT_TRUE((*hex)->find_all("zz 09aF zz", found).ok());
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].end - found[0].start, 4u);
  EXPECT_EQ(translate_oniguruma("[^\\s\\p{L}]"), "[^\\p{White_Space}\\p{L}]");
  auto bad = Regex::compile("(unclosed", "x/tokenizer.json: pre_tokenizer");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("x/tokenizer.json: pre_tokenizer"), std::string::npos);
}

TEST(Unicode, Normalization) {
  using tokenizer_detail::nfc;
  using tokenizer_detail::nfd;
  EXPECT_EQ(nfc("cafe\xCC\x81"), "caf\xC3\xA9");
  EXPECT_EQ(nfd("caf\xC3\xA9"), "cafe\xCC\x81");
  EXPECT_EQ(nfc("\xE2\x84\xAB"), "\xC3\x85");                          // Angstrom sign -> Å
  EXPECT_EQ(nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo -> 각
  EXPECT_EQ(nfc("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");             // reordered by combining class
  EXPECT_EQ(nfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");           // composition exclusion stays split
  EXPECT_EQ(nfc("plain ascii"), "plain ascii");
}

// ---- Errors ---------------------------------------------------------------------------

std::string load_error(const std::string& tokenizer_json, const std::string& config = "") {
  auto r = Tokenizer::from_json(tokenizer_json, config, "bad-model");
  EXPECT_FALSE(r.ok());
  return r.ok() ? std::string() : r.error().message;
}

TEST(Errors, MalformedTokenizerJson) {
  auto contains = [](const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos;
  };
  std::string e = load_error("{ this is not json");
  EXPECT_TRUE(contains(e, "bad-model: tokenizer.json") && contains(e, "not valid JSON")) << e;
  e = load_error("[1, 2]");
  EXPECT_TRUE(contains(e, "bad-model: tokenizer.json") && contains(e, "object")) << e;
  e = load_error(R"({"version": "1.0"})");
  EXPECT_TRUE(contains(e, "bad-model: tokenizer.json") && contains(e, "missing 'model'")) << e;
  e = load_error(R"({"model": {"type": "WordPiece", "vocab": {}}})");
  EXPECT_TRUE(contains(e, "bad-model: tokenizer.json") && contains(e, "WordPiece")) << e;

  json t = tiny_tokenizer();
  t["model"]["merges"].push_back("a zz");
  e = load_error(t.dump());
  EXPECT_TRUE(contains(e, "bad-model: tokenizer.json") && contains(e, "'zz'") && contains(e, "merges[6]")) << e;
  t = tiny_tokenizer();
  t["model"]["merges"].push_back("b d");  // both known, but "bd" is not in the vocabulary
  e = load_error(t.dump());
  EXPECT_TRUE(contains(e, "'bd'")) << e;
  t = tiny_tokenizer();
  t["model"]["merges"].push_back("abc");
  e = load_error(t.dump());
  EXPECT_TRUE(contains(e, "merges[6]")) << e;
  t = tiny_tokenizer();
  t["model"]["vocab"] = json::array({"a", "b"});
  e = load_error(t.dump());
  EXPECT_TRUE(contains(e, "vocab")) << e;
  t = tiny_tokenizer();
  t["model"]["vocab"]["x"] = "seven";
  e = load_error(t.dump());
  EXPECT_TRUE(contains(e, "vocab['x']")) << e;
  t = tiny_tokenizer();
  t["pre_tokenizer"] = json::parse(R"({"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated"})");
  e = load_error(t.dump());
  EXPECT_TRUE(contains(e, "pre_tokenizer") && contains(e, "regex")) << e;
  t = tiny_tokenizer();
  t["pre_tokenizer"] = json::parse(R"({"type": "NoSuchThing"})");
  e = load_error(t.dump());
  EXPECT_TRUE(contains(e, "NoSuchThing")) << e;
  t = tiny_tokenizer();
  t["decoder"] = json::parse(R"({"type": "Strip", "content": "ab", "start": 1, "stop": 0})");
  e = load_error(t.dump());
  EXPECT_TRUE(contains(e, "decoder") && contains(e, "content")) << e;
  t = tiny_tokenizer();
  t["added_tokens"] = json::parse(R"([{"id": "x", "content": "<m>"}])");
  e = load_error(t.dump());
  EXPECT_TRUE(contains(e, "added_tokens[0]")) << e;
  t = tiny_tokenizer();
  t["post_processor"] = json::parse(R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}], "special_tokens": {}})");
  e = load_error(t.dump());
  EXPECT_TRUE(contains(e, "post_processor") && contains(e, "<s>")) << e;

  e = load_error(tiny_tokenizer().dump(), "{not json");
  EXPECT_TRUE(contains(e, "bad-model: tokenizer_config.json") && contains(e, "not valid JSON")) << e;
  e = load_error(tiny_tokenizer().dump(), R"({"add_bos_token": true, "bos_token": "<nope>"})");
  EXPECT_TRUE(contains(e, "tokenizer_config.json") && contains(e, "<nope>")) << e;
  e = load_error(tiny_tokenizer().dump(), R"({"add_bos_token": "yes"})");
  EXPECT_TRUE(contains(e, "add_bos_token")) << e;
}

TEST(Errors, MissingDirectoryAndBadInput) {
  auto r = Tokenizer::load(test::data_dir() / "no-such-tokenizer");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no-such-tokenizer/tokenizer.json"), std::string::npos) << r.error().message;

  const Tokenizer tok = from(tiny_tokenizer());
  auto bad = tok.encode("ab\xFF");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("UTF-8"), std::string::npos);
}

TEST(Config, BosEosPolicy) {
  json t = tiny_tokenizer();
  t["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "a", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {"a": {"id": "a", "ids": [1], "tokens": ["a"]}}})");
  const Tokenizer from_template = from(t);
  EXPECT_EQ(encode_ok(from_template, "d"), (std::vector<std::int32_t>{1, 4}));
  EXPECT_EQ(from_template.bos_id(), 1);
  EXPECT_TRUE(from_template.add_bos());
  // tokenizer_config.json flags win over the template.
  const Tokenizer no_bos = from(t, json::parse(R"({"add_bos_token": false, "bos_token": "a"})"));
  EXPECT_EQ(encode_ok(no_bos, "d"), (std::vector<std::int32_t>{4}));
  EXPECT_FALSE(no_bos.add_bos());
  const Tokenizer with_eos =
      from(t, json::parse(R"({"add_eos_token": true, "eos_token": {"content": "c"}, "chat_template": [
             {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})"));
  EXPECT_EQ(encode_ok(with_eos, "d"), (std::vector<std::int32_t>{1, 4, 3}));
  EXPECT_EQ(encode_ok(with_eos, "d", {.add_special_tokens = false}), (std::vector<std::int32_t>{4}));
  EXPECT_TRUE(with_eos.add_eos());
  EXPECT_EQ(with_eos.eos_id(), 3);
  EXPECT_EQ(with_eos.chat_template(), "D");
}

TEST(Threads, ConcurrentEncodesAgree) {
  const Tokenizer& tok = real("qwen3");
  const std::string text = "Concurrent encoding of the same text from two threads, 1234 \xE4\xBD\xA0\xE5\xA5\xBD!";
  const auto expected = encode_ok(tok, text);
  std::vector<std::int32_t> results[2];
  std::thread workers[2];
  for (int w = 0; w < 2; ++w) {
    workers[w] = std::thread([&, w] {
      for (int i = 0; i < 200; ++i) {
        auto r = tok.encode(text + std::to_string(i % 7));
        if (r.ok() && i == 199) results[w] = *r;
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(std::vector<std::int32_t>(results[0].begin(), results[0].begin() + static_cast<long>(expected.size())),
            expected);
}

// ---- Long inputs ----------------------------------------------------------------------

std::string random_cjk(std::size_t chars) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> dist(0x4E00, 0x9FA5);
  std::string out;
  for (std::size_t i = 0; i < chars; ++i) tokenizer_detail::append_utf8(out, static_cast<char32_t>(dist(rng)));
  return out;
}

std::string long_english(std::size_t chars) {
  const std::string paragraph =
      "Mixture-of-experts language models route every token to a few of many expert networks; the router's "
      "choices, load balancing and capacity factors decide how well the experts specialise. In 2024, models "
      "with 8x7B or 64 experts showed that sparse activation can match dense quality at lower cost.\n\n";
  std::string out;
  while (out.size() < chars) out += paragraph;
  out.resize(chars);
  return out;
}

TEST(LongInputs, HundredThousandCharactersEncodeInBoundedTime) {
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {"100k 'a'", std::string(100000, 'a')},
      {"100k spaces", std::string(100000, ' ')},
      {"100k newlines", std::string(100000, '\n')},
      {"100k digits", [] {
         std::string s;
         for (int i = 0; s.size() < 100000; ++i) s += std::to_string(i * 7919 % 10);
         return s;
       }()},
      {"100k random CJK", random_cjk(100000)},
      {"100k English", long_english(100000)},
      {"100k 'ab '", [] {
         std::string s;
         while (s.size() < 100000) s += "ab ";
         return s;
       }()},
  };
  for (const char* name : {"qwen3", "llama2"}) {
    const Tokenizer& tok = real(name);
    for (const auto& [label, text] : inputs) {
      const auto start = std::chrono::steady_clock::now();
      auto ids = tok.encode(text);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      ASSERT_TRUE(ids.ok()) << ids.error().message;
      std::printf("[ timing   ] %-7s %-16s %7zu bytes -> %6zu tokens in %8.1f ms\n", name, label.c_str(),
                  text.size(), ids->size(), ms);
      EXPECT_LT(ms, 5000.0) << name << " " << label;
      auto decoded = tok.decode(*ids, /*skip_special=*/true);
      ASSERT_TRUE(decoded.ok());
      EXPECT_EQ(decoded->size(), text.size()) << name << " " << label;
    }
  }
}

}  // namespace
}  // namespace colibri

namespace colibri {
namespace {

// Random text from many Unicode blocks (assigned or not, never surrogates) must encode,
// decode back to itself (Qwen3: to its NFC form) and stream to the same bytes.
TEST(Properties, RandomTextRoundTrips) {
  std::mt19937 rng(12345);
  const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E},     {0x09, 0x0D},     {0xA0, 0x24F},    {0x300, 0x36F},   {0x370, 0x52F},
      {0x590, 0x6FF},   {0x900, 0x97F},   {0xE00, 0xE7F},   {0x1100, 0x11FF}, {0x2000, 0x206F},
      {0x2580, 0x25FF}, {0x3000, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0xE000, 0xE0FF},
      {0xFE00, 0xFFFD}, {0x1F300, 0x1FAFF}, {0x20000, 0x2A6DF}, {0xE0000, 0xE007F}, {0x10FFF0, 0x10FFFF}};
  const Tokenizer& qwen = real("qwen3");
  const Tokenizer& llama = real("llama2");
  for (int n = 0; n < 300; ++n) {
    std::string text;
    const int length = static_cast<int>(rng() % 40);
    for (int i = 0; i < length; ++i) {
      const auto& [lo, hi] = ranges[rng() % ranges.size()];
      char32_t cp = lo + static_cast<char32_t>(rng() % (hi - lo + 1));
      if (cp == 0x2581) cp = 'x';  // Llama maps a literal "▁" to a space
      tokenizer_detail::append_utf8(text, cp);
    }
    for (const Tokenizer* tok : {&qwen, &llama}) {
      const auto ids = encode_ok(*tok, text, {.add_special_tokens = false});
      auto decoded = tok->decode(ids);
      ASSERT_TRUE(decoded.ok());
      const std::string expected = tok == &qwen ? tokenizer_detail::nfc(text) : text;
      EXPECT_EQ(test::to_hex(*decoded), test::to_hex(expected)) << "case " << n;
      StreamingDecoder stream(*tok);
      std::string streamed;
      for (std::int32_t id : ids) streamed += stream.push(id);
      streamed += stream.flush();
      EXPECT_EQ(streamed, *decoded) << "case " << n;
    }
  }
}

TEST(Errors, OddJsonShapesNeverThrow) {
  const json base = tiny_tokenizer();
  const std::vector<std::pair<std::string, json>> edits = {
      {"/added_tokens", "not a list"},
      {"/added_tokens", json::array({1, 2})},
      {"/normalizer", json::array()},
      {"/normalizer", json::parse(R"({"type": "Sequence", "normalizers": {"x": 1}})")},
      {"/pre_tokenizer", json::parse(R"({"type": "Split", "pattern": {"Nope": "x"}, "behavior": "Isolated"})")},
      {"/pre_tokenizer", json::parse(R"({"type": "Split", "pattern": {"String": "x"}, "behavior": "Sideways"})")},
      {"/decoder", json::parse(R"({"type": 7})")},
      {"/post_processor", json::parse(R"({"type": "TemplateProcessing", "single": "$A"})")},
      {"/model/merges", json::parse(R"([["a"]])")},
      {"/model/merges", json::parse(R"([[1, 2]])")},
      {"/model/merges", "a b"},
      {"/model/dropout", 0.5},
      {"/model/unk_token", 3},
      {"/model/vocab/a", -1},
      {"/model/vocab/a", 1e20},
  };
  for (const auto& [pointer, value] : edits) {
    json t = base;
    t[json::json_pointer(pointer)] = value;
    auto r = Tokenizer::from_json(t.dump(), "", "odd");
    EXPECT_FALSE(r.ok()) << pointer << " = " << value.dump();
    if (!r.ok()) {
      EXPECT_EQ(r.error().message.rfind("odd: tokenizer.json", 0), 0u) << r.error().message;
    }
  }
  auto r = Tokenizer::from_json(base.dump(), R"({"added_tokens_decoder": {"5": "x"}})", "odd");
  ASSERT_FALSE(r.ok());
  // Two added tokens with one id and different texts are refused by name; the
  // same entry twice is harmless.
  {
    json t = base;
    t["added_tokens"] = json::array({{{"id", 0}, {"content", "<a>"}, {"special", true}},
                                     {{"id", 0}, {"content", "<b>"}, {"special", true}}});
    auto twice = Tokenizer::from_json(t.dump(), "", "odd");
    ASSERT_FALSE(twice.ok());
    EXPECT_NE(twice.error().message.find("added_tokens[1]: id 0 is already the added token '<a>'"), std::string::npos)
        << twice.error().message;
    t["added_tokens"][1]["content"] = "<a>";
    EXPECT_TRUE(Tokenizer::from_json(t.dump(), "", "odd").ok());
  }
  // One absurd id must not size the id table: refused by its value, before
  // any table is allocated (the id would otherwise cost ~50 GB of strings).
  for (const char* pointer : {"/model/vocab/a", "/added_tokens/0/id"}) {
    json t = base;
    if (std::string(pointer).rfind("/added", 0) == 0)
      t["added_tokens"] = json::array({{{"id", 0}, {"content", "<s>"}, {"special", true}}});
    t[json::json_pointer(pointer)] = 2147483646;
    auto huge = Tokenizer::from_json(t.dump(), "", "odd");
    ASSERT_FALSE(huge.ok()) << pointer;
    EXPECT_NE(huge.error().message.find("token id 2147483646 is out of range [0, 4194304)"), std::string::npos)
        << huge.error().message;
  }
  EXPECT_NE(r.error().message.find("odd: tokenizer_config.json"), std::string::npos) << r.error().message;
  // The unknown-character path needs the unk token to exist; without it encoding fails cleanly.
  json no_unk = base;
  no_unk["model"]["unk_token"] = "<missing>";
  const Tokenizer tok = from(no_unk);
  auto e = tok.encode("axb");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("<missing>"), std::string::npos);
}

}  // namespace
}  // namespace colibri
