// Unicode helpers for the tokenizer: code point iteration, White_Space,
// canonical normalization (NFC/NFD) and the GPT-2 byte-level alphabet.
// Internal to engine/tokenizer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/utf8.h"

namespace colibri::tokenizer_detail {

// Well-formedness and lossy conversion live in core/utf8.h, shared with the
// server's request checks.
using colibri::decode_utf8_lossy;
using colibri::find_invalid_utf8;
using colibri::utf8_lead;
using colibri::utf8_lossy;
using colibri::Utf8Lead;
using colibri::Utf8Scan;

// Decodes the code point at text[pos] (text must be valid UTF-8) and advances pos.
char32_t next_code_point(std::string_view text, std::size_t& pos);
// Length in bytes of the UTF-8 sequence that starts with this lead byte (1 for bytes
// that cannot start a sequence).
std::size_t utf8_sequence_length(unsigned char lead);
void append_utf8(std::string& out, char32_t cp);

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
