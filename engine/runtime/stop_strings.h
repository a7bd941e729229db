// Streaming stop-string detection over generated text.
//
// Text arrives piece by piece (one detokenized token at a time). push() emits
// everything that can safely be shown and holds back the longest suffix that
// could still grow into a stop string, plus an unfinished trailing UTF-8
// sequence (at most 3 bytes), so a client never sees half a character or the
// beginning of a stop string that then completes.
//
// Matching is byte-exact (UTF-8 stops match their UTF-8 bytes). When several
// stop strings could match, the one that completes first in the stream wins
// (ties: the one that starts first, i.e. the longest); this is the result a
// byte-by-byte check would give, so it does not depend on how the text is cut
// into pieces. The text before the stop is emitted, the stop string itself and
// anything after it are dropped. Empty stop strings are ignored.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace colibri {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);

  struct Step {
    std::string emit;
    bool stopped = false;
  };

  // Once a stop has matched, every later push returns {"", true}.
  Step push(std::string_view text);
  // At end of generation: the held-back text (empty after a stop).
  std::string flush();

  bool stopped() const { return stopped_; }
  // The stop string that matched; empty while not stopped.
  std::string_view matched() const {
    return stopped_ ? std::string_view(stops_[matched_]) : std::string_view();
  }

 private:
  std::size_t hold_length() const;

  std::vector<std::string> stops_;  // non-empty ones only
  std::size_t longest_ = 0;         // length of the longest stop
  std::string pending_;             // held-back text
  std::size_t matched_ = 0;         // index into stops_ once stopped
  bool stopped_ = false;
};

}  // namespace colibri
