#include "runtime/stop_strings.h"

#include <algorithm>
#include <utility>

namespace colibri {

namespace {

// Length of an unfinished UTF-8 sequence at the end of `s` (0 if the text ends
// on a character boundary or the tail is not a valid sequence start).
std::size_t incomplete_utf8_tail(std::string_view s) {
  const std::size_t limit = std::min<std::size_t>(s.size(), 3);
  for (std::size_t i = 1; i <= limit; ++i) {
    const auto byte = static_cast<unsigned char>(s[s.size() - i]);
    if ((byte & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    std::size_t need = 1;
    if (byte >= 0xC2 && byte <= 0xDF) need = 2;
    else if (byte >= 0xE0 && byte <= 0xEF) need = 3;
    else if (byte >= 0xF0 && byte <= 0xF4) need = 4;
    return need > i ? i : 0;
  }
  return 0;
}

}  // namespace

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (auto& stop : stops) {
    if (stop.empty()) continue;
    longest_ = std::max(longest_, stop.size());
    stops_.push_back(std::move(stop));
  }
}

// Longest suffix of pending_ that is a proper prefix of some stop string.
std::size_t StopStringMatcher::hold_length() const {
  if (longest_ == 0) return 0;
  const std::string_view text = pending_;
  for (std::size_t k = std::min(text.size(), longest_ - 1); k > 0; --k) {
    const std::string_view tail = text.substr(text.size() - k);
    for (const auto& stop : stops_) {
      if (stop.size() > k && std::string_view(stop).starts_with(tail)) return k;
    }
  }
  return 0;
}

StopStringMatcher::Step StopStringMatcher::push(std::string_view text) {
  Step step;
  if (stopped_) {
    step.stopped = true;
    return step;
  }
  const std::size_t old_size = pending_.size();
  pending_.append(text);

  // The held-back text holds no complete stop, so a match must end in `text`.
  std::size_t best_end = std::string::npos;
  std::size_t best_pos = std::string::npos;
  std::size_t best = stops_.size();
  for (std::size_t i = 0; i < stops_.size(); ++i) {
    const std::string& stop = stops_[i];
    const std::size_t from = old_size >= stop.size() ? old_size - stop.size() + 1 : 0;
    const std::size_t pos = pending_.find(stop, from);
    if (pos == std::string::npos) continue;
    const std::size_t end = pos + stop.size();
    if (end < best_end || (end == best_end && pos < best_pos)) {
      best_end = end;
      best_pos = pos;
      best = i;
    }
  }
  if (best < stops_.size()) {
    step.emit = pending_.substr(0, best_pos);
    step.stopped = true;
    stopped_ = true;
    matched_ = best;
    pending_.clear();
    return step;
  }

  const std::size_t hold = std::max(hold_length(), incomplete_utf8_tail(pending_));
  step.emit = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return step;
}

std::string StopStringMatcher::flush() {
  std::string out = std::move(pending_);
  pending_.clear();
  return out;
}

}  // namespace colibri
