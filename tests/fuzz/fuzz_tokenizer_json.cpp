// libFuzzer target for reading a tokenizer (engine/tokenizer/tokenizer_load.cpp
// and the parts it builds): tokenizer.json comes inside model files nobody
// vetted, and its regexes, normalizers and vocabularies are compiled at load.
// Each input is a tokenizer.json text. Reading it must give a tokenizer or an
// error, never a crash, and whatever tokenizer it gives must encode, decode and
// stream-decode a few strings (ASCII, accents, CJK, an emoji, a special-token
// lookalike, spaces and newlines) without crashing; a regex that backtracks
// without end shows as a libFuzzer timeout.
//
// Built by tests/scripts/fuzz_tokenizer_json.sh (tests/fuzz/run_fuzzer.sh).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto tokenizer = colibri::Tokenizer::from_json(text, "", "fuzz");
  if (!tokenizer.ok()) return 0;
  static const char* const kSamples[] = {"Hello world 123", "caf\xC3\xA9 na\xC3\xAFve", "\xE6\x97\xA5\xE6\x9C\xAC",
                                         "\xF0\x9F\x99\x82 <|im_start|>user\n", "  \n\t  x  ", ""};
  for (const char* sample : kSamples) {
    for (const bool parse_special : {false, true}) {
      colibri::EncodeOptions options;
      options.parse_special = parse_special;
      auto ids = tokenizer->encode(sample, options);
      if (!ids.ok()) continue;
      (void)tokenizer->decode(*ids);
      colibri::StreamingDecoder stream(*tokenizer);
      for (const std::int32_t id : *ids) (void)stream.push(id);
      (void)stream.flush();
    }
  }
  return 0;
}
