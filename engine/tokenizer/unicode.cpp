#include "tokenizer/unicode.h"

#include <algorithm>
#include <unordered_map>
#include <utility>
#include <vector>

namespace colibri::tokenizer_detail {

extern const char kUnicodeVersion[];
extern const std::uint32_t kDecompositions[];
extern const std::size_t kDecompositions_size;
extern const std::uint32_t kCombiningClasses[];
extern const std::size_t kCombiningClasses_size;

char32_t next_code_point(std::string_view text, std::size_t& pos) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  const std::size_t len = utf8_sequence_length(b0);
  if (len == 1 || pos + len > text.size()) {
    ++pos;
    return b0;
  }
  char32_t cp = b0 & (0x7F >> len);
  for (std::size_t k = 1; k < len; ++k) {
    cp = (cp << 6) | (static_cast<unsigned char>(text[pos + k]) & 0x3F);
  }
  pos += len;
  return cp;
}

std::size_t utf8_sequence_length(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF8) return 4;
  return 1;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_white_space(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// ---- Canonical normalization -------------------------------------------------------

namespace {

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

struct NormalizationData {
  std::unordered_map<char32_t, std::pair<char32_t, char32_t>> decompositions;
  std::unordered_map<std::uint64_t, char32_t> compositions;

  NormalizationData() {
    decompositions.reserve(kDecompositions_size / 3 * 2);
    for (std::size_t i = 0; i + 2 < kDecompositions_size; i += 3) {
      const char32_t cp = kDecompositions[i] & 0x7FFFFFFF;
      const char32_t first = kDecompositions[i + 1];
      const char32_t second = kDecompositions[i + 2];
      decompositions.emplace(cp, std::make_pair(first, second));
      if ((kDecompositions[i] & 0x80000000u) != 0) {
        compositions.emplace(key(first, second), cp);
      }
    }
  }
  static std::uint64_t key(char32_t a, char32_t b) {
    return (static_cast<std::uint64_t>(a) << 32) | static_cast<std::uint64_t>(b);
  }
};

const NormalizationData& normalization_data() {
  static const NormalizationData data;
  return data;
}

std::uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  // Ranges are sorted by first code point.
  std::size_t lo = 0, hi = kCombiningClasses_size / 2;
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    const char32_t first = kCombiningClasses[2 * mid];
    const char32_t last = first + (kCombiningClasses[2 * mid + 1] >> 8);
    if (cp < first) {
      hi = mid;
    } else if (cp > last) {
      lo = mid + 1;
    } else {
      return static_cast<std::uint8_t>(kCombiningClasses[2 * mid + 1] & 0xFF);
    }
  }
  return 0;
}

void decompose(const NormalizationData& data, char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp < 0xC0) {
    out.push_back(cp);
    return;
  }
  const auto it = data.decompositions.find(cp);
  if (it == data.decompositions.end()) {
    out.push_back(cp);
    return;
  }
  decompose(data, it->second.first, out);
  if (it->second.second != 0) decompose(data, it->second.second, out);
}

char32_t compose_pair(const NormalizationData& data, char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto it = data.compositions.find(NormalizationData::key(a, b));
  return it == data.compositions.end() ? 0 : it->second;
}

bool is_ascii(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

std::u32string decompose_all(std::string_view text) {
  const NormalizationData& data = normalization_data();
  std::u32string out;
  out.reserve(text.size());
  std::size_t pos = 0;
  while (pos < text.size()) decompose(data, next_code_point(text, pos), out);
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  std::size_t i = 0;
  while (i < out.size()) {
    if (combining_class(out[i]) == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < out.size() && combining_class(out[j]) != 0) ++j;
    if (j - i > 1) {
      std::stable_sort(out.begin() + static_cast<std::ptrdiff_t>(i),
                       out.begin() + static_cast<std::ptrdiff_t>(j),
                       [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    }
    i = j;
  }
  return out;
}

std::string to_utf8(const std::u32string& cps) {
  std::string out;
  out.reserve(cps.size() * 2);
  for (char32_t cp : cps) append_utf8(out, cp);
  return out;
}

}  // namespace

std::string nfd(std::string_view text) {
  if (is_ascii(text)) return std::string(text);
  return to_utf8(decompose_all(text));
}

std::string nfc(std::string_view text) {
  if (is_ascii(text)) return std::string(text);
  const NormalizationData& data = normalization_data();
  std::u32string buf = decompose_all(text);
  if (buf.empty()) return {};
  // Canonical composition (UAX #15).
  std::size_t starter_pos = 0;
  char32_t starter = buf[0];
  int last_class = combining_class(starter) == 0 ? 0 : 256;
  std::size_t out_pos = 1;
  for (std::size_t i = 1; i < buf.size(); ++i) {
    const char32_t ch = buf[i];
    const int ch_class = combining_class(ch);
    const char32_t composite = last_class == 256 ? 0 : compose_pair(data, starter, ch);
    if (composite != 0 && (last_class < ch_class || last_class == 0)) {
      buf[starter_pos] = composite;
      starter = composite;
      continue;
    }
    if (ch_class == 0) {
      starter_pos = out_pos;
      starter = ch;
    }
    last_class = ch_class;
    buf[out_pos++] = ch;
  }
  buf.resize(out_pos);
  return to_utf8(buf);
}

const char* unicode_data_version() { return kUnicodeVersion; }

// ---- Byte-level alphabet -------------------------------------------------------------

const std::array<char32_t, 256>& bytes_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

int unicode_to_byte(char32_t cp) {
  static const std::array<std::int16_t, 324> inverse = [] {
    std::array<std::int16_t, 324> t{};
    t.fill(-1);
    const auto& forward = bytes_to_unicode();
    for (int b = 0; b < 256; ++b) t[forward[static_cast<std::size_t>(b)]] = static_cast<std::int16_t>(b);
    return t;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

}  // namespace colibri::tokenizer_detail
