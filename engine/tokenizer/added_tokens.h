// Added tokens (special and not) and the splitting of input text on them, as
// tokenizers/src/tokenizer/added_vocabulary.rs does: leftmost-longest matching, then
// the special / single_word / lstrip / rstrip rules. Internal to engine/tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "tokenizer/regex.h"

namespace colibri::tokenizer_detail {

struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

struct AddedSplit {
  Span span;
  std::int32_t id;  // -1: ordinary text
};

// Matches one set of added tokens (the non-normalized or the normalized ones).
class AddedTokenMatcher {
 public:
  // `patterns[i]` is what to look for for `tokens[i]` (its content, or its content
  // normalized for tokens with normalized=true).
  static Result<AddedTokenMatcher> build(std::vector<AddedToken> tokens, std::vector<std::string> patterns);
  AddedTokenMatcher() = default;

  bool empty() const { return tokens_.empty(); }
  // HF AddedVocabulary::find_matches. `split_special` true means special tokens are
  // not recognised (they stay ordinary text).
  Status split(std::string_view text, bool split_special, std::vector<AddedSplit>& out) const;

 private:
  // Index of the longest pattern that occurs at text[pos], or -1.
  int longest_at(std::string_view text, std::size_t pos) const;

  std::vector<AddedToken> tokens_;
  std::vector<std::string> patterns_;
  std::vector<std::vector<int>> by_first_byte_;  // 256 buckets, longest pattern first
  std::shared_ptr<const Regex> word_char_;       // Rust regex \w (for single_word)
};

}  // namespace colibri::tokenizer_detail
