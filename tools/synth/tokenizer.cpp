#include "synth/tokenizer.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <vector>

namespace colibri::synth {
namespace {

constexpr const char* kEndOfText = "<|endoftext|>";

void append_utf8(std::string& out, std::uint32_t code) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others
// for the code points from 256 up, in byte order.
std::array<std::string, 256> byte_symbols() {
  std::array<std::string, 256> symbols;
  std::uint32_t next = 256;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    append_utf8(symbols[b], printable ? b : next++);
  }
  return symbols;
}

// Bytes in the order their pairs are merged: space, lower case, upper case,
// digits, punctuation, then everything else, so the first merges are the
// letter pairs of ordinary text.
std::vector<int> merge_order() {
  std::vector<int> order;
  auto add = [&order](int lo, int hi) {
    for (int b = lo; b <= hi; ++b)
      if (std::find(order.begin(), order.end(), b) == order.end()) order.push_back(b);
  };
  add(' ', ' ');
  add('a', 'z');
  add('A', 'Z');
  add('0', '9');
  add('!', '~');
  add('\n', '\n');
  add(0, 255);
  return order;
}

}  // namespace

Result<TokenizerFiles> synthetic_tokenizer(std::int32_t vocab) {
  constexpr std::int64_t kMax = 256 + 256 * 256 + 256LL * 256 * 256 + 1;
  if (vocab < 257 || vocab > kMax)
    return make_error("a synthetic tokenizer needs a vocabulary of 257 to {} ids, not {}", kMax, vocab);
  const auto symbols = byte_symbols();
  const std::vector<int> order = merge_order();
  const std::int32_t merges_wanted = vocab - 257;

  nlohmann::json vocab_json = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab_json[symbols[b]] = b;
  nlohmann::json merges = nlohmann::json::array();
  std::int32_t next_id = 256;
  // Two-byte tokens from every ordered pair, then three-byte tokens from each
  // two-byte token and one more byte.
  std::vector<std::string> pairs;
  for (int a : order) {
    for (int b : order) {
      if (next_id - 256 >= merges_wanted) break;
      std::string token = symbols[a] + symbols[b];
      merges.push_back({symbols[a], symbols[b]});
      vocab_json[token] = next_id++;
      pairs.push_back(std::move(token));
    }
  }
  for (const std::string& pair : pairs) {
    for (int b : order) {
      if (next_id - 256 >= merges_wanted) break;
      merges.push_back({pair, symbols[b]});
      vocab_json[pair + symbols[b]] = next_id++;
    }
  }
  const std::int32_t eos = next_id;  // == vocab - 1
  vocab_json[kEndOfText] = eos;

  const nlohmann::json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  nlohmann::json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       {{{"id", eos},
         {"content", kEndOfText},
         {"single_word", false},
         {"lstrip", false},
         {"rstrip", false},
         {"normalized", false},
         {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex",
              "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
              "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          byte_level}}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", std::move(vocab_json)},
        {"merges", std::move(merges)}}}};
  nlohmann::json config = {
      {"add_bos_token", false},
      {"add_eos_token", false},
      {"add_prefix_space", false},
      {"added_tokens_decoder",
       {{std::to_string(eos),
         {{"content", kEndOfText},
          {"lstrip", false},
          {"normalized", false},
          {"rstrip", false},
          {"single_word", false},
          {"special", true}}}}},
      {"bos_token", nullptr},
      {"eos_token", kEndOfText},
      {"clean_up_tokenization_spaces", false},
      {"model_max_length", 4096},
      {"tokenizer_class", "GPT2TokenizerFast"}};
  return TokenizerFiles{tokenizer.dump(), config.dump(2)};
}

}  // namespace colibri::synth
