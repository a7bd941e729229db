#include "core/utf8.h"

namespace colibri {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

enum class Step { kValid, kInvalid, kIncomplete };

// Examines the sequence at bytes[pos]; sets `length` to the bytes it covers (the
// maximal subpart when invalid).
Step examine(std::string_view bytes, std::size_t pos, std::size_t& length) {
  const Utf8Lead lead = utf8_lead(static_cast<unsigned char>(bytes[pos]));
  if (lead.continuation <= 0) {
    length = 1;
    return lead.continuation == 0 ? Step::kValid : Step::kInvalid;
  }
  std::size_t j = pos + 1;
  for (int k = 0; k < lead.continuation; ++k, ++j) {
    if (j >= bytes.size()) {
      length = j - pos;
      return Step::kIncomplete;
    }
    const auto c = static_cast<unsigned char>(bytes[j]);
    const unsigned char lo = k == 0 ? lead.second_low : 0x80;
    const unsigned char hi = k == 0 ? lead.second_high : 0xBF;
    if (c < lo || c > hi) {
      length = j - pos;
      return Step::kInvalid;
    }
  }
  length = j - pos;
  return Step::kValid;
}

}  // namespace

std::size_t find_invalid_utf8(std::string_view bytes) {
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    std::size_t length = 0;
    if (examine(bytes, pos, length) != Step::kValid) return pos;
    pos += length;
  }
  return std::string_view::npos;
}

Utf8Scan decode_utf8_lossy(std::string_view bytes, bool final) {
  Utf8Scan scan{{}, 0};
  scan.text.reserve(bytes.size());
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    std::size_t length = 0;
    const Step step = examine(bytes, pos, length);
    if (step == Step::kValid) {
      scan.text.append(bytes.substr(pos, length));
    } else if (step == Step::kInvalid) {
      scan.text.append(kReplacement);
    } else {  // incomplete at the end of the input
      if (!final) break;
      scan.text.append(kReplacement);
    }
    pos += length;
  }
  scan.consumed = pos;
  return scan;
}

}  // namespace colibri
