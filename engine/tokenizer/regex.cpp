#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <utility>

#include "tokenizer/unicode.h"

namespace colibri::tokenizer_detail {

namespace {

// Oniguruma's \w for Unicode text: Letter, Mark, Decimal_Number, Connector_Punctuation.
constexpr std::string_view kWordClassBody = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
constexpr std::string_view kHexClassBody = "0-9A-Fa-f";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) return fmt::format("PCRE2 error {}", code);
  return std::string(reinterpret_cast<const char*>(buffer));
}

struct MatchData {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  explicit MatchData(const pcre2_code* code) : data(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchData() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
  }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;

  // Runs one match; on a JIT stack overflow retries once with a large JIT stack.
  int match(const pcre2_code* code, std::string_view text, std::size_t start, std::uint32_t options) {
    for (;;) {
      const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                                 options | PCRE2_NO_UTF_CHECK, data, context);
      if (rc != PCRE2_ERROR_JIT_STACKLIMIT || jit_stack != nullptr) return rc;
      jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
      context = pcre2_match_context_create(nullptr);
      if (jit_stack == nullptr || context == nullptr) return PCRE2_ERROR_NOMEMORY;
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
  }
};

}  // namespace

std::string translate_oniguruma(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  int class_depth = 0;
  std::size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char d = pattern[i + 1];
      const bool in_class = class_depth > 0;
      switch (d) {
        case 's': out += "\\p{White_Space}"; break;
        case 'S': out += "\\P{White_Space}"; break;
        case 'w':
          out += in_class ? std::string(kWordClassBody) : fmt::format("[{}]", kWordClassBody);
          break;
        case 'W':
          // A negated set cannot be spelled inside a class; PCRE2's \W is the closest.
          out += in_class ? std::string("\\W") : fmt::format("[^{}]", kWordClassBody);
          break;
        case 'h':  // Oniguruma: hexadecimal digit (PCRE2: horizontal space)
          out += in_class ? std::string(kHexClassBody) : fmt::format("[{}]", kHexClassBody);
          break;
        case 'H': out += in_class ? std::string("\\H") : fmt::format("[^{}]", kHexClassBody); break;
        default: {
          out += c;
          out += d;
          // Keep braced arguments (\p{..}, \x{..}) verbatim.
          if ((d == 'p' || d == 'P' || d == 'x' || d == 'u') && i + 2 < pattern.size() &&
              pattern[i + 2] == '{') {
            const std::size_t close = pattern.find('}', i + 2);
            if (close != std::string_view::npos) {
              out.append(pattern.substr(i + 2, close - i - 1));
              i = close + 1;
              continue;
            }
          }
          break;
        }
      }
      i += 2;
      continue;
    }
    if (c == '[') {
      if (class_depth > 0 && i + 1 < pattern.size() && pattern[i + 1] == ':') {
        const std::size_t close = pattern.find(":]", i + 2);
        if (close != std::string_view::npos) {  // POSIX bracket, e.g. [:alpha:]
          out.append(pattern.substr(i, close + 2 - i));
          i = close + 2;
          continue;
        }
      }
      out += c;
      ++i;
      if (class_depth == 0) {
        ++class_depth;
        if (i < pattern.size() && pattern[i] == '^') out += pattern[i++];
        if (i < pattern.size() && pattern[i] == ']') out += pattern[i++];  // literal ']' first
      }
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
    ++i;
  }
  return out;
}

Result<std::shared_ptr<const Regex>> Regex::compile(std::string_view pattern, std::string_view where) {
  const std::string translated = translate_oniguruma(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error_code, &error_offset,
                                   nullptr);
  if (code == nullptr) {
    return make_error("{}: cannot compile regex '{}': {} (at offset {} of the translated pattern '{}')",
                      where, pattern, pcre2_message(error_code), error_offset, translated);
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
  std::shared_ptr<Regex> regex(new Regex());
  regex->code_ = code;
  regex->source_ = std::string(pattern);
  return std::shared_ptr<const Regex>(std::move(regex));
}

Regex::~Regex() { pcre2_code_free(code_); }

Status Regex::find_all(std::string_view text, std::vector<Span>& out) const {
  MatchData md(code_);
  if (md.data == nullptr) return make_error("regex '{}': out of memory", source_);
  std::size_t pos = 0;
  std::size_t last_match_end = std::string_view::npos;
  while (pos <= text.size()) {
    const int rc = md.match(code_, text, pos, 0);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return make_error("regex '{}': matching failed: {}", source_, pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(md.data);
    const std::size_t start = ovector[0];
    const std::size_t end = ovector[1];
    if (start == end) {
      if (end == last_match_end) {  // no empty match right after the previous match
        if (end >= text.size()) break;
        pos = end + utf8_sequence_length(static_cast<unsigned char>(text[end]));
        continue;
      }
      out.push_back({start, end});
      last_match_end = end;
      pos = end;
      continue;
    }
    out.push_back({start, end});
    last_match_end = end;
    pos = end;
  }
  return Status::Ok();
}

Result<bool> Regex::matches_at(std::string_view text, std::size_t pos) const {
  MatchData md(code_);
  if (md.data == nullptr) return make_error("regex '{}': out of memory", source_);
  const int rc = md.match(code_, text, pos, PCRE2_ANCHORED);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) return make_error("regex '{}': matching failed: {}", source_, pcre2_message(rc));
  return true;
}

// ---- Pattern ---------------------------------------------------------------------------

Pattern Pattern::literal(std::string text) {
  Pattern p;
  p.literal_ = std::move(text);
  return p;
}

Pattern Pattern::regex(std::shared_ptr<const Regex> regex) {
  Pattern p;
  p.regex_ = std::move(regex);
  return p;
}

Pattern Pattern::code_points(bool (*predicate)(char32_t)) {
  Pattern p;
  p.predicate_ = predicate;
  return p;
}

Status Pattern::find_all(std::string_view text, std::vector<Span>& out) const {
  if (regex_) return regex_->find_all(text, out);
  if (predicate_ != nullptr) {
    std::size_t pos = 0;
    while (pos < text.size()) {
      const std::size_t start = pos;
      const char32_t cp = next_code_point(text, pos);
      if (predicate_(cp)) out.push_back({start, pos});
    }
    return Status::Ok();
  }
  if (literal_.empty()) return Status::Ok();
  std::size_t pos = text.find(literal_);
  while (pos != std::string_view::npos) {
    out.push_back({pos, pos + literal_.size()});
    pos = text.find(literal_, pos + literal_.size());
  }
  return Status::Ok();
}

Status Pattern::find_matches(std::string_view text, std::vector<Piece>& out) const {
  if (text.empty()) {
    out.push_back({{0, 0}, false});
    return Status::Ok();
  }
  if (!regex_ && predicate_ == nullptr && literal_.empty()) {
    out.push_back({{0, text.size()}, false});
    return Status::Ok();
  }
  std::vector<Span> matches;
  COLIBRI_TRY(find_all(text, matches));
  std::size_t prev = 0;
  for (const Span& m : matches) {
    if (prev != m.start) out.push_back({{prev, m.start}, false});
    out.push_back({m, true});
    prev = m.end;
  }
  if (prev != text.size()) out.push_back({{prev, text.size()}, false});
  return Status::Ok();
}

Status split_text(std::string_view text, const Pattern& pattern, SplitBehavior behavior, bool invert,
                  std::vector<Span>& out) {
  std::vector<Pattern::Piece> matches;
  COLIBRI_TRY(pattern.find_matches(text, matches));
  if (invert) {
    for (auto& m : matches) m.is_match = !m.is_match;
  }
  struct Keep {
    Span span;
    bool remove;
  };
  std::vector<Keep> splits;
  splits.reserve(matches.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& m : matches) splits.push_back({m.span, false});
      break;
    case SplitBehavior::kRemoved:
      for (const auto& m : matches) splits.push_back({m.span, m.is_match});
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const auto& m : matches) {
        if (m.is_match == previous_match && !splits.empty()) {
          splits.back().span.end = m.span.end;
        } else {
          splits.push_back({m.span, false});
        }
        previous_match = m.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& m : matches) {
        if (m.is_match && !previous_match && !splits.empty()) {
          splits.back().span.end = m.span.end;
        } else {
          splits.push_back({m.span, false});
        }
        previous_match = m.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->is_match && !previous_match && !splits.empty()) {
          splits.back().span.start = it->span.start;
        } else {
          splits.push_back({it->span, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(splits.begin(), splits.end());
      break;
    }
  }
  for (const auto& s : splits) {
    if (!s.remove) out.push_back(s.span);
  }
  return Status::Ok();
}

}  // namespace colibri::tokenizer_detail
