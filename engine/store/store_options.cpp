#include "store/store_options.h"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace colibri {

namespace {
std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

bool parse_index(std::string_view text, std::int32_t& out) {
  text = trim(text);
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && out >= 0;
}
}  // namespace

std::string_view policy_name(EvictionPolicy policy) {
  switch (policy) {
    case EvictionPolicy::LRU: return "lru";
    case EvictionPolicy::LFU: return "lfu";
    case EvictionPolicy::FIFO: return "fifo";
  }
  return "?";
}

std::string_view io_name(ExpertIo io) {
  switch (io) {
    case ExpertIo::Pread: return "pread";
    case ExpertIo::PreadDirect: return "pread-direct";
    case ExpertIo::MmapAdvise: return "mmap";
  }
  return "?";
}

std::string_view preload_name(ExpertPreload preload) {
  switch (preload) {
    case ExpertPreload::Auto: return "auto";
    case ExpertPreload::On: return "on";
    case ExpertPreload::Off: return "off";
  }
  return "?";
}

Result<EvictionPolicy> parse_policy(std::string_view text) {
  const std::string t = lower(trim(text));
  if (t == "lru") return EvictionPolicy::LRU;
  if (t == "lfu") return EvictionPolicy::LFU;
  if (t == "fifo") return EvictionPolicy::FIFO;
  return make_error("unknown expert eviction policy '{}' (expected lru, lfu or fifo)", text);
}

Result<ExpertIo> parse_io(std::string_view text) {
  const std::string t = lower(trim(text));
  if (t == "pread") return ExpertIo::Pread;
  if (t == "pread-direct" || t == "odirect" || t == "o_direct") return ExpertIo::PreadDirect;
  if (t == "mmap") return ExpertIo::MmapAdvise;
  return make_error("unknown expert I/O mode '{}' (expected pread, pread-direct or mmap)", text);
}

Result<ExpertPreload> parse_preload(std::string_view text) {
  const std::string t = lower(trim(text));
  if (t == "auto") return ExpertPreload::Auto;
  if (t == "on") return ExpertPreload::On;
  if (t == "off") return ExpertPreload::Off;
  return make_error("unknown expert preload '{}' (expected auto, on or off)", text);
}

Result<std::vector<ExpertKey>> parse_pinned(std::string_view text) {
  std::vector<ExpertKey> out;
  if (trim(text).empty()) return out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = trim(text.substr(start, comma - start));
    const std::size_t colon = item.find(':');
    ExpertKey key;
    if (colon == std::string_view::npos || !parse_index(item.substr(0, colon), key.layer) ||
        !parse_index(item.substr(colon + 1), key.expert))
      return make_error("pinned experts: '{}' is not 'layer:expert' (in '{}')", item, text);
    out.push_back(key);
    start = comma + 1;
  }
  return out;
}

}  // namespace colibri
