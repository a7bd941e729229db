// UTF-8 checks for request bodies and the one lossy conversion every text
// leaving the server goes through, so HTTP, SSE and gRPC show the same U+FFFD
// for the same bytes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace colibri::server {

// Offset of the first byte that is not part of well-formed UTF-8 (overlongs,
// surrogates and code points above U+10FFFF are ill-formed), or npos.
std::size_t find_invalid_utf8(std::string_view bytes);

// Replaces each maximal ill-formed subpart with U+FFFD, as Python's
// errors="replace" and the engine's StreamingDecoder do (Unicode 15 §3.9 U+FFFD
// substitution of maximal subparts). Valid input is returned unchanged.
std::string utf8_replace_invalid(std::string_view bytes);

}  // namespace colibri::server
