#include "runtime/json_prefix.h"

#include "tokenizer/tokenizer.h"
#include "core/utf8.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace colibri {

namespace {

constexpr std::string_view kLiterals[] = {"true", "false", "null"};

bool is_whitespace(unsigned char byte) { return byte == ' ' || byte == '\t' || byte == '\n' || byte == '\r'; }
bool is_digit(unsigned char byte) { return byte >= '0' && byte <= '9'; }
bool is_hex(unsigned char byte) {
  return is_digit(byte) || (byte >= 'a' && byte <= 'f') || (byte >= 'A' && byte <= 'F');
}

}  // namespace

bool JsonPrefix::push(unsigned char byte) {
  const JsonPrefix saved = *this;
  if (step(byte)) return true;
  *this = saved;
  return false;
}

bool JsonPrefix::push(std::string_view bytes) {
  const JsonPrefix saved = *this;
  for (char c : bytes) {
    if (!step(static_cast<unsigned char>(c))) {
      *this = saved;
      return false;
    }
  }
  return true;
}

bool JsonPrefix::push_on_copy(std::string_view bytes) {
  for (char c : bytes)
    if (!step(static_cast<unsigned char>(c))) return false;
  return true;
}

bool JsonPrefix::step(unsigned char byte) {
  // Whitespace between tokens, where the grammar allows it.
  switch (state_) {
    case State::ObjectFirst:
    case State::ObjectKey:
    case State::Colon:
    case State::Value:
    case State::ArrayFirst:
    case State::AfterValue:
    case State::Done:
      if (is_whitespace(byte)) {
        if (whitespace_ >= kMaxWhitespaceRun) return false;
        ++whitespace_;
        return true;
      }
      whitespace_ = 0;
      break;
    default:
      break;
  }
  switch (state_) {
    case State::Start:
      return byte == '{' && open(false);
    case State::ObjectFirst:
      if (byte == '}') return close();
      [[fallthrough]];
    case State::ObjectKey:
      if (byte != '"') return false;
      state_ = State::String;
      key_ = true;
      return true;
    case State::Colon:
      if (byte != ':') return false;
      state_ = State::Value;
      return true;
    case State::Value:
      return begin_value(byte);
    case State::ArrayFirst:
      if (byte == ']') return close();
      return begin_value(byte);
    case State::AfterValue:
      if (byte == ',') {
        state_ = in_array() ? State::Value : State::ObjectKey;
        return true;
      }
      if (byte == '}' && !in_array()) return close();
      if (byte == ']' && in_array()) return close();
      return false;
    case State::String:
      // After a high surrogate escape only its low half may come.
      if (low_due_) {
        if (byte != '\\') return false;
        state_ = State::Escape;
        return true;
      }
      if (utf8_pending_ > 0) {
        if (byte < utf8_low_ || byte > utf8_high_) return false;
        --utf8_pending_;
        utf8_low_ = 0x80;
        utf8_high_ = 0xBF;
        return true;
      }
      if (byte >= 0x80) return begin_utf8(byte);
      if (byte == '"') {
        if (key_) {
          key_ = false;
          state_ = State::Colon;
          return true;
        }
        return end_value();
      }
      if (byte == '\\') {
        state_ = State::Escape;
        return true;
      }
      return byte >= 0x20;  // control characters must be escaped
    case State::Escape:
      if (byte == 'u') {
        state_ = State::Unicode;
        count_ = 0;
        code_ = 0;
        return true;
      }
      if (low_due_) return false;
      if (byte == '"' || byte == '\\' || byte == '/' || byte == 'b' || byte == 'f' || byte == 'n' || byte == 'r' ||
          byte == 't') {
        state_ = State::String;
        return true;
      }
      return false;
    case State::Unicode: {
      if (!is_hex(byte)) return false;
      const unsigned digit = is_digit(byte) ? byte - '0' : (byte | 0x20) - 'a' + 10;
      // Surrogates come in pairs, high (D800-DBFF) then low (DC00-DFFF),
      // refused at the digit that breaks the rule, so every accepted
      // prefix can still be finished.
      if (low_due_ && ((count_ == 0 && digit != 0xD) || (count_ == 1 && digit < 0xC))) return false;
      if (!low_due_ && count_ == 1 && code_ == 0xD && digit >= 0xC) return false;  // a lone low half
      code_ = static_cast<std::uint16_t>(code_ * 16 + digit);
      if (++count_ == 4) {
        low_due_ = !low_due_ && code_ >= 0xD800 && code_ <= 0xDBFF;
        state_ = State::String;
      }
      return true;
    }
    case State::Minus:
      if (byte == '0') state_ = State::Zero;
      else if (is_digit(byte)) state_ = State::Integer;
      else return false;
      return true;
    case State::Zero:
    case State::Integer:
      if (state_ == State::Integer && is_digit(byte)) return true;
      if (byte == '.') {
        state_ = State::FractionStart;
        return true;
      }
      if (byte == 'e' || byte == 'E') {
        state_ = State::ExponentStart;
        return true;
      }
      // The number ended; the byte belongs to what follows it.
      return end_value() && step(byte);
    case State::FractionStart:
      if (!is_digit(byte)) return false;
      state_ = State::Fraction;
      return true;
    case State::Fraction:
      if (is_digit(byte)) return true;
      if (byte == 'e' || byte == 'E') {
        state_ = State::ExponentStart;
        return true;
      }
      return end_value() && step(byte);
    case State::ExponentStart:
      if (byte == '+' || byte == '-') {
        state_ = State::ExponentSign;
        return true;
      }
      [[fallthrough]];
    case State::ExponentSign:
      if (!is_digit(byte)) return false;
      state_ = State::Exponent;
      count_ = 1;
      return true;
    case State::Exponent:
      if (is_digit(byte)) return ++count_ <= kMaxExponentDigits;
      return end_value() && step(byte);
    case State::Literal: {
      const std::string_view literal = kLiterals[literal_];
      if (byte != static_cast<unsigned char>(literal[count_])) return false;
      if (++count_ == literal.size()) return end_value();
      return true;
    }
    case State::Done:
      return false;  // only whitespace, handled above
  }
  return false;
}

// A multi-byte character's lead byte: how many continuation bytes follow and
// the range of the first (Unicode's table of well-formed UTF-8 sequences).
bool JsonPrefix::begin_utf8(unsigned char byte) {
  const auto lead = utf8_lead(byte);
  // Not a lead: a continuation byte, an overlong lead or one past U+10FFFF.
  if (lead.continuation <= 0) return false;
  utf8_pending_ = static_cast<std::uint8_t>(lead.continuation);
  utf8_low_ = lead.second_low;
  utf8_high_ = lead.second_high;
  return true;
}

bool JsonPrefix::begin_value(unsigned char byte) {
  switch (byte) {
    case '{': return open(false);
    case '[': return open(true);
    case '"':
      state_ = State::String;
      key_ = false;
      return true;
    case '-': state_ = State::Minus; return true;
    case '0': state_ = State::Zero; return true;
    case 't': literal_ = 0; break;
    case 'f': literal_ = 1; break;
    case 'n': literal_ = 2; break;
    default:
      if (!is_digit(byte)) return false;
      state_ = State::Integer;
      return true;
  }
  state_ = State::Literal;
  count_ = 1;
  return true;
}

bool JsonPrefix::end_value() {
  state_ = depth_ == 0 ? State::Done : State::AfterValue;
  return true;
}

bool JsonPrefix::open(bool array) {
  if (depth_ >= kMaxDepth) return false;
  if (array) stack_ |= std::uint64_t{1} << depth_;
  else stack_ &= ~(std::uint64_t{1} << depth_);
  ++depth_;
  state_ = array ? State::ArrayFirst : State::ObjectFirst;
  return true;
}

// The callers checked that the closer matches the open container.
bool JsonPrefix::close() {
  --depth_;
  return end_value();
}

JsonVocabulary::JsonVocabulary(std::vector<std::string> token_bytes, std::vector<bool> banned_ids)
    : bytes(std::move(token_bytes)), banned(std::move(banned_ids)), plain(bytes.size()) {
  banned.resize(bytes.size());
  for (std::size_t id = 0; id < bytes.size(); ++id)
    plain[id] = !bytes[id].empty() && std::all_of(bytes[id].begin(), bytes[id].end(), [](char c) {
      return c >= 0x20 && c < 0x7F && c != '"' && c != '\\';
    });
  // Counting sort by first byte; tokens without bytes are in no group (never selectable).
  first_byte_start.assign(257, 0);
  for (const std::string& token : bytes)
    if (!token.empty()) ++first_byte_start[static_cast<unsigned char>(token[0]) + 1];
  for (std::size_t b = 0; b < 256; ++b) first_byte_start[b + 1] += first_byte_start[b];
  by_first_byte.resize(first_byte_start[256]);
  std::vector<std::uint32_t> fill(first_byte_start.begin(), first_byte_start.end() - 1);
  for (std::size_t id = 0; id < bytes.size(); ++id)
    if (!bytes[id].empty()) by_first_byte[fill[static_cast<unsigned char>(bytes[id][0])]++] = static_cast<std::int32_t>(id);
}

JsonVocabulary json_vocabulary(const Tokenizer& tokenizer) {
  const std::int32_t vocab = tokenizer.vocab_size();
  std::vector<std::string> bytes(static_cast<std::size_t>(vocab));
  std::vector<bool> special(static_cast<std::size_t>(vocab));
  std::vector<std::string> first(static_cast<std::size_t>(vocab));
  bool any_differs = false;
  for (std::int32_t id = 0; id < vocab; ++id) {
    const auto at = static_cast<std::size_t>(id);
    bytes[at] = tokenizer.token_bytes(id);
    first[at] = tokenizer.first_token_bytes(id);
    any_differs |= first[at] != bytes[at];
    special[at] = tokenizer.is_special(id);
  }
  JsonVocabulary vocabulary(std::move(bytes), std::move(special));
  if (any_differs) vocabulary.first_bytes = std::move(first);
  return vocabulary;
}

namespace {

std::size_t mask_continuations(const JsonPrefix& state, const JsonVocabulary& vocabulary, std::span<float> logits) {
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  std::size_t selectable = 0;
  const std::size_t n = std::min(logits.size(), vocabulary.bytes.size());
  for (std::size_t id = n; id < logits.size(); ++id) logits[id] = kBanned;
  if (state.at_start() && !vocabulary.first_bytes.empty()) {
    // The first token's bytes as it starts the text: a walk each, once.
    for (std::size_t id = 0; id < n; ++id) {
      const std::string& bytes = vocabulary.first_bytes[id];
      JsonPrefix next = state;
      const bool ok = !vocabulary.banned[id] && !bytes.empty() && next.push_on_copy(bytes);
      if (ok) ++selectable;
      else logits[id] = kBanned;
    }
    return selectable;
  }
  if (state.in_plain_string()) {
    // Most tokens continue a string: a lookup each, a walk for the rest.
    for (std::size_t id = 0; id < n; ++id) {
      const std::string& bytes = vocabulary.bytes[id];
      // A token without bytes makes no progress: a model could emit it forever.
      bool ok = !vocabulary.banned[id] && !bytes.empty();
      if (ok && !vocabulary.plain[id]) {
        JsonPrefix next = state;
        ok = next.push_on_copy(bytes);
      }
      if (ok) ++selectable;
      else logits[id] = kBanned;
    }
    return selectable;
  }
  for (std::size_t id = 0; id < n; ++id)
    if (vocabulary.bytes[id].empty()) logits[id] = kBanned;
  for (std::size_t b = 0; b < 256; ++b) {
    JsonPrefix after_first = state;
    const char first = static_cast<char>(b);
    const bool first_ok = after_first.push_on_copy(std::string_view(&first, 1));
    for (std::uint32_t k = vocabulary.first_byte_start[b]; k < vocabulary.first_byte_start[b + 1]; ++k) {
      const auto id = static_cast<std::size_t>(vocabulary.by_first_byte[k]);
      if (id >= n) continue;
      bool ok = first_ok && !vocabulary.banned[id];
      if (ok) {
        JsonPrefix next = after_first;
        ok = next.push_on_copy(std::string_view(vocabulary.bytes[id]).substr(1));
      }
      if (ok) ++selectable;
      else logits[id] = kBanned;
    }
  }
  return selectable;
}

}  // namespace

std::size_t mask_json_logits(const JsonPrefix& state, const JsonVocabulary& vocabulary, std::span<float> logits,
                             std::span<const std::int32_t> end_ids) {
  std::size_t selectable = mask_continuations(state, vocabulary, logits);
  for (std::size_t i = 0; i < end_ids.size(); ++i) {
    const std::int32_t id = end_ids[i];
    // An id listed twice (the tokenizer's and the config's EOS) counts once.
    if (id < 0 || static_cast<std::size_t>(id) >= logits.size() ||
        std::find(end_ids.begin(), end_ids.begin() + static_cast<std::ptrdiff_t>(i), id) != end_ids.begin() + static_cast<std::ptrdiff_t>(i))
      continue;
    const auto at = static_cast<std::size_t>(id);
    // Counted above when its bytes continue the text; banned now either way.
    JsonPrefix next = state;
    if (at < vocabulary.bytes.size() && !vocabulary.banned[at]) {
      const std::string& bytes = vocabulary.token(at, state.at_start());
      if (!bytes.empty() && next.push_on_copy(bytes)) --selectable;
    }
    logits[at] = -std::numeric_limits<float>::infinity();
  }
  return selectable;
}

}  // namespace colibri
