// A UTF-8 text file's token ids as the scoring tools read it
// (colibri-perplexity --text, colibri-bench --routing-text): no special
// tokens added; special-token text recognised only when asked.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace colibri_tools {

inline colibri::Result<std::vector<std::int32_t>> encode_text_file(const colibri::Tokenizer& tokenizer,
                                                                   const std::string& path, bool parse_special) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  colibri::EncodeOptions encode;
  encode.add_special_tokens = false;
  encode.parse_special = parse_special;
  return tokenizer.encode(buffer.str(), encode);
}

}  // namespace colibri_tools
