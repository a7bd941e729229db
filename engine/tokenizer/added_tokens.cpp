#include "tokenizer/added_tokens.h"

#include <algorithm>
#include <utility>

#include "tokenizer/unicode.h"

namespace colibri::tokenizer_detail {

namespace {

// Start of the run of whitespace that ends `text` (text.size() when there is none).
std::size_t trailing_space_start(std::string_view text) {
  std::size_t start = text.size();
  while (start > 0) {
    std::size_t lead = start - 1;
    while (lead > 0 && (static_cast<unsigned char>(text[lead]) & 0xC0) == 0x80) --lead;
    std::size_t pos = lead;
    if (!is_white_space(next_code_point(text, pos))) break;
    start = lead;
  }
  return start;
}

// Length of the run of whitespace that starts `text`.
std::size_t leading_space_length(std::string_view text) {
  std::size_t end = 0;
  while (end < text.size()) {
    std::size_t pos = end;
    if (!is_white_space(next_code_point(text, pos))) break;
    end = pos;
  }
  return end;
}

}  // namespace

Result<AddedTokenMatcher> AddedTokenMatcher::build(std::vector<AddedToken> tokens,
                                                   std::vector<std::string> patterns) {
  AddedTokenMatcher m;
  m.by_first_byte_.assign(256, {});
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (patterns[i].empty()) continue;
    m.by_first_byte_[static_cast<unsigned char>(patterns[i][0])].push_back(static_cast<int>(m.tokens_.size()));
    m.tokens_.push_back(std::move(tokens[i]));
    m.patterns_.push_back(std::move(patterns[i]));
  }
  for (auto& bucket : m.by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](int a, int b) { return m.patterns_[a].size() > m.patterns_[b].size(); });
  }
  const bool any_single_word =
      std::any_of(m.tokens_.begin(), m.tokens_.end(), [](const AddedToken& t) { return t.single_word; });
  if (any_single_word) {
    // The `regex` crate's Unicode \w: Alphabetic, Mark, Decimal_Number,
    // Connector_Punctuation, Join_Control.
    auto word = Regex::compile("[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]", "single_word regex");
    if (!word.ok()) return word.error();
    m.word_char_ = std::move(*word);
  }
  return m;
}

int AddedTokenMatcher::longest_at(std::string_view text, std::size_t pos) const {
  for (int index : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
    const std::string& p = patterns_[static_cast<std::size_t>(index)];
    if (text.size() - pos >= p.size() && text.compare(pos, p.size(), p) == 0) return index;
  }
  return -1;
}

Status AddedTokenMatcher::split(std::string_view text, bool split_special, std::vector<AddedSplit>& out) const {
  if (tokens_.empty() || text.empty()) {
    out.push_back({{0, text.size()}, -1});
    return Status::Ok();
  }
  std::size_t start_offset = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const int index = longest_at(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[static_cast<std::size_t>(index)];
    std::size_t start = pos;
    std::size_t stop = pos + patterns_[static_cast<std::size_t>(index)].size();
    pos = stop;  // matching resumes after the match even when the match is discarded
    if (token.special && split_special) continue;
    if (token.single_word) {
      bool word_before = false;
      bool word_after = false;
      if (start > 0) {
        std::size_t lead = start - 1;
        while (lead > 0 && (static_cast<unsigned char>(text[lead]) & 0xC0) == 0x80) --lead;
        auto m = word_char_->matches_at(text.substr(0, start), lead);
        if (!m.ok()) return m.error();
        word_before = *m;
      }
      if (stop < text.size()) {
        auto m = word_char_->matches_at(text, stop);
        if (!m.ok()) return m.error();
        word_after = *m;
      }
      if (word_before || word_after) continue;
    }
    if (token.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
    if (token.rstrip) stop += leading_space_length(text.substr(stop));
    if (start_offset < start) out.push_back({{start_offset, start}, -1});
    out.push_back({{start, stop}, token.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({{start_offset, text.size()}, -1});
  return Status::Ok();
}

}  // namespace colibri::tokenizer_detail
