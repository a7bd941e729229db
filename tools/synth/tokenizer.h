// A synthetic byte-level BPE tokenizer of any vocabulary size, for models with
// random weights: ids 0-255 are the 256 bytes (GPT-2's byte-to-character map),
// then merges of frequent-looking pairs (letters and space first) fill the
// vocabulary up to its last id, which is "<|endoftext|>". It round-trips any
// text, like a real byte-level BPE; its merges are not learnt from any corpus.
#pragma once

#include <cstdint>
#include <string>

#include "core/result.h"

namespace colibri::synth {

struct TokenizerFiles {
  std::string tokenizer_json;         // Hugging Face tokenizer.json
  std::string tokenizer_config_json;  // tokenizer_config.json
};

// vocab: total ids, at least 257 (256 bytes and the end-of-text token) and at
// most 256 + 256^2 + 256^3 + 1.
Result<TokenizerFiles> synthetic_tokenizer(std::int32_t vocab);

}  // namespace colibri::synth
