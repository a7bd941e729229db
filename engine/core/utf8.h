// UTF-8 well-formedness (Unicode Table 3-7: no overlong forms, surrogates or
// code points past U+10FFFF) and the one lossy conversion, U+FFFD for each
// maximal ill-formed subpart (Unicode §3.9, as Rust's String::from_utf8_lossy
// and Python's errors="replace"). The tokenizer's decoder, the JSON-output
// automaton and the server's request checks and every text it sends all use
// these, so the same bytes are judged and replaced the same way everywhere.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace colibri {

// What a byte starts in well-formed UTF-8 (Table 3-7 of the Unicode standard):
// `continuation` bytes follow (0 for ASCII, -1: not a lead byte at all), and
// the first of them lies in [second_low, second_high], narrower after E0, ED,
// F0 and F4 so that no overlong form, surrogate or code point past U+10FFFF
// passes. Every UTF-8 check reads its table from this one.
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

// How far a prefix of `bytes` is decodable: up to the last character boundary,
// maximal ill-formed subparts counted as (replaced) units; what is left is an
// incomplete but so far valid sequence.
struct Utf8Scan {
  std::string text;       // decoded prefix with U+FFFD for each maximal invalid subpart
  std::size_t consumed;   // bytes of input that `text` covers
};
// Decodes as much as is final: an incomplete sequence at the end is left unconsumed
// unless `final` is true, in which case it becomes one U+FFFD.
Utf8Scan decode_utf8_lossy(std::string_view bytes, bool final);
inline std::string utf8_lossy(std::string_view bytes) { return decode_utf8_lossy(bytes, true).text; }

}  // namespace colibri
