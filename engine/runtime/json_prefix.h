// Constrained decoding to JSON (OpenAI's response_format {"type": "json_object"}).
//
// JsonPrefix reads a text byte by byte and refuses the first byte after which
// it could no longer be the start of a JSON text (RFC 8259) whose top-level
// value is an object, written from its opening brace (no whitespace before
// it: a model would only spend tokens on it). It is a pushdown automaton in a
// few dozen bytes: the container stack is a bit per level, so a copy is cheap
// and masking a vocabulary is one copy and a few byte steps per token.
//
// Strings must be well-formed UTF-8 (no overlongs, surrogates or bytes past
// U+10FFFF, and no character cut by the closing quote), so the text needs no
// U+FFFD substitution on its way out; \u escapes of surrogates must come in
// pairs (a lone one is valid JSON that strict parsers refuse). Limits keep a
// model from wandering: nesting deeper than kMaxDepth is refused, and so is
// whitespace beyond kMaxWhitespaceRun bytes in a row (enough for
// pretty-printed output, not for a page of blanks). Exponents have at most
// kMaxExponentDigits digits, so no number is out of a double's range (1e400
// is valid JSON that common parsers refuse). Every prefix it accepts can
// still be finished: a rule is enforced at the byte that breaks it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace colibri {

class JsonPrefix {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxWhitespaceRun = 32;
  static constexpr int kMaxExponentDigits = 2;

  // False when `byte` cannot continue a valid text; the state is then left as
  // it was.
  bool push(unsigned char byte);
  bool push(std::string_view bytes);  // all or nothing: on false the state is unchanged
  // push() without the undo: on false the state is left part-way, so call it
  // on a copy (what masking a vocabulary does, once per token).
  bool push_on_copy(std::string_view bytes);

  // The top-level object is closed: nothing but whitespace may follow.
  bool complete() const { return state_ == State::Done; }
  // Nothing taken yet: the next token is the text's first.
  bool at_start() const { return state_ == State::Start; }
  // Inside a string, between characters: any printable ASCII but '"' and '\\'
  // keeps it so.
  bool in_plain_string() const { return state_ == State::String && utf8_pending_ == 0 && !low_due_; }

 private:
  enum class State : std::uint8_t {
    Start,          // before the top-level object
    ObjectFirst,    // after '{': a key or '}'
    ObjectKey,      // after ',' in an object: a key
    Colon,          // after a key
    Value,          // after ':' or ',' in an array: a value
    ArrayFirst,     // after '[': a value or ']'
    AfterValue,     // after a value inside a container: ',' or the closer
    String,         // inside a string (key_ says which kind)
    Escape,         // after a backslash in a string
    Unicode,        // \u and count_ hex digits read
    Minus,          // after a leading '-'
    Zero,           // integer part "0"
    Integer,        // integer part with more digits
    FractionStart,  // after '.'
    Fraction,
    ExponentStart,  // after 'e' / 'E'
    ExponentSign,   // after the exponent's sign
    Exponent,
    Literal,        // inside true / false / null (literal_, count_)
    Done,
  };

  bool step(unsigned char byte);
  bool begin_value(unsigned char byte);
  bool begin_utf8(unsigned char byte);
  bool end_value();  // a value inside a container or the top one ended
  bool open(bool array);
  bool close();
  bool in_array() const { return depth_ > 0 && (stack_ >> (depth_ - 1) & 1) != 0; }

  State state_ = State::Start;
  bool key_ = false;        // the string being read is an object key
  std::uint8_t literal_ = 0;  // index into the literals: true, false, null
  std::uint8_t count_ = 0;    // bytes of the literal, \u digits or exponent digits read
  std::uint8_t whitespace_ = 0;
  std::uint16_t code_ = 0;    // the \u escape's value so far
  bool low_due_ = false;      // a high surrogate escape was read: its low half must follow
  std::uint8_t utf8_pending_ = 0;              // continuation bytes still due in a string
  std::uint8_t utf8_low_ = 0x80, utf8_high_ = 0xBF;  // the next continuation byte's range
  std::uint8_t depth_ = 0;
  std::uint64_t stack_ = 0;  // bit d: level d is an array (1) or an object (0)
};

// The bytes of every token of a vocabulary, and which ids may never appear
// in JSON output (special tokens, end-of-sequence ids). Built once per model.
struct JsonVocabulary {
  JsonVocabulary(std::vector<std::string> token_bytes, std::vector<bool> banned_ids);
  std::vector<std::string> bytes;  // by token id
  std::vector<bool> banned;        // by token id
  // By token id: only printable ASCII other than '"' and '\\', so inside a
  // string it is taken as it is (most of a vocabulary: a mask there costs a
  // lookup per token instead of a walk through its bytes).
  std::vector<bool> plain;
  // Token ids grouped by first byte (ids of first byte b at
  // by_first_byte[first_byte_start[b] .. first_byte_start[b + 1])): outside
  // strings a state takes few first bytes, and a group it refuses is passed
  // over without a step per token.
  std::vector<std::int32_t> by_first_byte;
  std::vector<std::uint32_t> first_byte_start;  // 257 offsets
  // By token id, the bytes of a token that starts the text, where any differ
  // from `bytes` (a SentencePiece decoder strips the first token's leading
  // space: "▁{" is " {" mid-text, "{" first); empty when none does.
  std::vector<std::string> first_bytes;
  // The bytes a token adds to a text: its first one's when `first`.
  const std::string& token(std::size_t id, bool first) const {
    return first && !first_bytes.empty() ? first_bytes[id] : bytes[id];
  }
};

class Tokenizer;
// Every token's bytes as they read mid-text, and as they start a text where
// that differs; special tokens banned.
JsonVocabulary json_vocabulary(const Tokenizer& tokenizer);

// Sets to -inf the logits of every token whose bytes cannot continue `state`
// (banned ones always, and the `end_ids` of the request: the generation ends
// when the object closes, never by an end token). Returns how many stay
// selectable. Never allocates.
std::size_t mask_json_logits(const JsonPrefix& state, const JsonVocabulary& vocabulary, std::span<float> logits,
                             std::span<const std::int32_t> end_ids = {});

}  // namespace colibri
