// libFuzzer target for the HTTP API's request parsing (server/http_json.cpp):
// a body as a client could send it, through parse_json_body and, when it is a
// JSON object, through the parser of every route that takes one (completions,
// chat, Anthropic messages, tokenize, detokenize, route). Malformed input must come back as an
// error with a status and a message. An exception escaping, a crash or a
// sanitizer report is a finding: over HTTP it would be a 500, not the 400 the
// API promises.
//
// Built by tests/scripts/fuzz_http_requests.sh (tests/fuzz/run_fuzzer.sh) with
// clang++, or by CMake when the compiler itself supports libFuzzer.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "http_json.h"

namespace {

volatile std::size_t sink;

template <class E>
void check(const E& parsed) {
  if (parsed) {
    sink = sink + 1;
    return;
  }
  if (parsed.error().message.empty() || parsed.error().status < 400 || parsed.error().status > 599) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  auto json = colibri::server::parse_json_body(body);
  check(json);
  if (!json) return 0;
  check(colibri::server::parse_generation(*json, false));
  check(colibri::server::parse_generation(*json, true));
  check(colibri::server::parse_anthropic_messages(*json));
  check(colibri::server::parse_tokenize(*json));
  check(colibri::server::parse_detokenize(*json));
  check(colibri::server::parse_route(*json));
  return 0;
}
