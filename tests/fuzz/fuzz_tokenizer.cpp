// libFuzzer target for the tokenizer (engine/tokenizer): every request's text
// goes through it, and so does every generated token on its way back. Each
// input is text for the tokenizers listed in COLIBRI_FUZZ_TOKENIZERS (folders
// holding tokenizer.json, separated by ':'): the fixtures' byte-level BPE, the
// bundled model's, and Llama 2's SentencePiece-style BPE with byte fallback.
//
// Invalid UTF-8 must be refused with a message. Valid text must encode, with
// special-token parsing on and off. With it off, the ids must decode back to
// the same bytes, as the tokenizer tests' random round trips check. None of
// these tokenizers applies Unicode normalization (NFC); Llama 2 maps a literal
// U+2581 to a space, so text holding one is not compared there. Streaming the
// ids one at a time must give what decode gives.
//
// Built by tests/scripts/fuzz_tokenizer.sh (tests/fuzz/run_fuzzer.sh) with
// clang++, or by CMake when the compiler itself supports libFuzzer.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

std::vector<std::unique_ptr<colibri::Tokenizer>>& tokenizers() {
  static std::vector<std::unique_ptr<colibri::Tokenizer>> loaded;
  return loaded;
}

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "fuzz_tokenizer: %s\n", message.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dirs = std::getenv("COLIBRI_FUZZ_TOKENIZERS");
  if (dirs == nullptr || *dirs == '\0') die("set COLIBRI_FUZZ_TOKENIZERS to tokenizer folders separated by ':'");
  std::string_view rest(dirs);
  while (!rest.empty()) {
    const std::size_t colon = rest.find(':');
    const std::string dir(rest.substr(0, colon));
    rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    auto tokenizer = colibri::Tokenizer::load(dir);
    if (!tokenizer.ok()) die(tokenizer.error().message);
    tokenizers().push_back(std::make_unique<colibri::Tokenizer>(std::move(*tokenizer)));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const bool valid = colibri::tokenizer_detail::find_invalid_utf8(text) == std::string_view::npos;
  const bool has_sentencepiece_space = text.find("\xE2\x96\x81") != std::string::npos;
  for (const auto& tokenizer : tokenizers()) {
    for (bool parse_special : {false, true}) {
      auto ids = tokenizer->encode(text, {.add_special_tokens = false, .parse_special = parse_special});
      if (!valid) {
        if (ids.ok() || ids.error().message.empty()) __builtin_trap();  // refused, and says why
        continue;
      }
      if (!ids.ok()) __builtin_trap();
      auto decoded = tokenizer->decode(*ids);
      if (!decoded.ok()) __builtin_trap();
      if (!parse_special && !(has_sentencepiece_space && tokenizer->token_to_id("\xE2\x96\x81").has_value()) &&
          *decoded != text)
        __builtin_trap();
      colibri::StreamingDecoder stream(*tokenizer);
      std::string streamed;
      for (std::int32_t id : *ids) streamed += stream.push(id);
      streamed += stream.flush();
      if (streamed != *decoded) __builtin_trap();
    }
  }
  return 0;
}
