#include "utf8.h"

namespace colibri::server {

namespace {

// Length of the well-formed prefix of the sequence starting at bytes[pos]
// (1..4 when it is complete and valid), or the negated length of its maximal
// ill-formed subpart (at least 1) otherwise. Table 3-7 of the Unicode standard.
int sequence_at(std::string_view bytes, std::size_t pos) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const unsigned char lead = byte(pos);
  if (lead < 0x80) return 1;
  int length = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) lo = 0xA0;  // no overlongs
    if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) lo = 0x90;  // no overlongs
    if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return -1;
  }
  for (int i = 1; i < length; ++i) {
    const std::size_t at = pos + static_cast<std::size_t>(i);
    if (at >= bytes.size()) return -i;
    const unsigned char b = byte(at);
    const unsigned char min = i == 1 ? lo : 0x80;
    const unsigned char max = i == 1 ? hi : 0xBF;
    if (b < min || b > max) return -i;
  }
  return length;
}

}  // namespace

std::size_t find_invalid_utf8(std::string_view bytes) {
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    const int n = sequence_at(bytes, pos);
    if (n < 0) return pos;
    pos += static_cast<std::size_t>(n);
  }
  return std::string_view::npos;
}

std::string utf8_replace_invalid(std::string_view bytes) {
  if (find_invalid_utf8(bytes) == std::string_view::npos) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    const int n = sequence_at(bytes, pos);
    if (n > 0) {
      out.append(bytes.substr(pos, static_cast<std::size_t>(n)));
      pos += static_cast<std::size_t>(n);
    } else {
      out += "\xEF\xBF\xBD";
      pos += static_cast<std::size_t>(-n);
    }
  }
  return out;
}

}  // namespace colibri::server
