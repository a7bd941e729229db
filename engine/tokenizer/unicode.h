// UTF-8 and Unicode helpers for the tokenizer: code point iteration, validation,
// lossy conversion (as Rust's String::from_utf8_lossy / Python errors="replace"),
// White_Space, canonical normalization (NFC/NFD) and the GPT-2 byte-level alphabet.
// Internal to engine/tokenizer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace colibri::tokenizer_detail {

// Decodes the code point at text[pos] (text must be valid UTF-8) and advances pos.
char32_t next_code_point(std::string_view text, std::size_t& pos);
// Length in bytes of the UTF-8 sequence that starts with this lead byte (1 for bytes
// that cannot start a sequence).
std::size_t utf8_sequence_length(unsigned char lead);
void append_utf8(std::string& out, char32_t cp);

// What a byte starts in well-formed UTF-8 (Table 3-7 of the Unicode standard):
// `continuation` bytes follow (0 for ASCII, -1: not a lead byte at all), and
// the first of them lies in [second_low, second_high], narrower after E0, ED,
// F0 and F4 so that no overlong form, surrogate or code point past U+10FFFF
// passes. Every UTF-8 check here reads its table from this one.
struct Utf8Lead {
  int continuation;
  unsigned char second_low, second_high;
};
constexpr Utf8Lead utf8_lead(unsigned char byte) {
  if (byte < 0x80) return {0, 0, 0};
  if (byte >= 0xC2 && byte <= 0xDF) return {1, 0x80, 0xBF};
  if (byte == 0xE0) return {2, 0xA0, 0xBF};
  if (byte == 0xED) return {2, 0x80, 0x9F};
  if (byte >= 0xE1 && byte <= 0xEF) return {2, 0x80, 0xBF};
  if (byte == 0xF0) return {3, 0x90, 0xBF};
  if (byte == 0xF4) return {3, 0x80, 0x8F};
  if (byte >= 0xF1 && byte <= 0xF3) return {3, 0x80, 0xBF};
  return {-1, 0, 0};
}

// Offset of the first byte that is not part of valid UTF-8, or npos if all valid.
std::size_t find_invalid_utf8(std::string_view bytes);

// How far a prefix of `bytes` is decodable. `complete` is the length of the longest
// prefix that ends on a character boundary once maximal invalid subparts are counted
// as (replaceable) units; the rest is an incomplete but still valid-so-far sequence.
struct Utf8Scan {
  std::string text;       // decoded prefix with U+FFFD for each maximal invalid subpart
  std::size_t consumed;   // bytes of input that `text` covers
};
// Decodes as much as is final: an incomplete sequence at the end is left unconsumed
// unless `final` is true, in which case it becomes one U+FFFD.
Utf8Scan decode_utf8_lossy(std::string_view bytes, bool final);
inline std::string utf8_lossy(std::string_view bytes) { return decode_utf8_lossy(bytes, true).text; }

// Unicode White_Space (what Rust's char::is_whitespace and Oniguruma's \s accept).
bool is_white_space(char32_t cp);

// Canonical normalization forms.
std::string nfc(std::string_view text);
std::string nfd(std::string_view text);
const char* unicode_data_version();

// GPT-2 byte-level alphabet: every byte maps to one printable code point.
const std::array<char32_t, 256>& bytes_to_unicode();
// Inverse; returns -1 for code points that are not in the alphabet.
int unicode_to_byte(char32_t cp);

}  // namespace colibri::tokenizer_detail
