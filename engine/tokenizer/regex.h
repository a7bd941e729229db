// Patterns of tokenizer.json ("Regex" or "String") and the split behaviours of Hugging
// Face's NormalizedString::split. Regexes are written for Oniguruma (what the Rust
// `tokenizers` crate uses); they are translated where PCRE2's meaning differs and run
// through PCRE2 with UTF + UCP (+ JIT). Internal to engine/tokenizer.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

struct pcre2_real_code_8;  // pcre2.h stays in regex.cpp

namespace colibri::tokenizer_detail {

struct Span {
  std::size_t start;
  std::size_t end;
};

class Regex {
 public:
  // `pattern` in Oniguruma syntax; `where` names it in error messages.
  static Result<std::shared_ptr<const Regex>> compile(std::string_view pattern, std::string_view where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends all non-overlapping matches, left to right (an empty match never
  // directly follows the previous match).
  Status find_all(std::string_view text, std::vector<Span>& out) const;
  // Whether the regex matches starting exactly at `pos`.
  Result<bool> matches_at(std::string_view text, std::size_t pos) const;
  const std::string& source() const { return source_; }

 private:
  Regex() = default;
  pcre2_real_code_8* code_ = nullptr;
  std::string source_;
};

// Rewrites an Oniguruma pattern into PCRE2 syntax with the same meaning for the
// constructs tokenizers use (\s, \S, \w, \W, \h, \H).
std::string translate_oniguruma(std::string_view pattern);

// A "pattern" of tokenizer.json: a literal string or a regex.
class Pattern {
 public:
  static Pattern literal(std::string text);
  static Pattern regex(std::shared_ptr<const Regex> regex);
  // One code point from a fixed class: every match is a single character.
  static Pattern code_points(bool (*predicate)(char32_t));

  // HF Pattern::find_matches: consecutive spans covering `text`, each flagged as a
  // match or not. Empty text gives one empty non-match.
  struct Piece {
    Span span;
    bool is_match;
  };
  Status find_matches(std::string_view text, std::vector<Piece>& out) const;
  Status find_all(std::string_view text, std::vector<Span>& out) const;

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;
  bool (*predicate_)(char32_t) = nullptr;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// HF NormalizedString::split: splits `text` on `pattern`, returning the kept pieces
// (possibly empty ones; callers drop those).
Status split_text(std::string_view text, const Pattern& pattern, SplitBehavior behavior, bool invert,
                  std::vector<Span>& out);

}  // namespace colibri::tokenizer_detail
