#include "utf8.h"

#include "tokenizer/unicode.h"

namespace colibri::server {

namespace {

// Length of the well-formed prefix of the sequence starting at bytes[pos]
// (1..4 when it is complete and valid), or the negated length of its maximal
// ill-formed subpart (at least 1) otherwise. Table 3-7 of the Unicode standard.
int sequence_at(std::string_view bytes, std::size_t pos) {
  const auto lead = tokenizer_detail::utf8_lead(static_cast<unsigned char>(bytes[pos]));
  if (lead.continuation < 0) return -1;
  const int length = lead.continuation + 1;
  for (int i = 1; i < length; ++i) {
    const std::size_t at = pos + static_cast<std::size_t>(i);
    if (at >= bytes.size()) return -i;
    const auto b = static_cast<unsigned char>(bytes[at]);
    const unsigned char min = i == 1 ? lead.second_low : 0x80;
    const unsigned char max = i == 1 ? lead.second_high : 0xBF;
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
