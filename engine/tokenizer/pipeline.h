// The configurable stages of a tokenizer.json pipeline: normalizers, pre-tokenizers and
// decoders, each built from its JSON object. Internal to engine/tokenizer.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "tokenizer/regex.h"

namespace colibri::tokenizer_detail {

// {"String": ...} or {"Regex": ...} under `key`.
Result<Pattern> read_pattern(const nlohmann::json& object, std::string_view key, std::string_view where);

// ---- Normalizers ---------------------------------------------------------------------

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual Status normalize(std::string& text) const = 0;
};

// `where` names the JSON object in error messages, e.g. "x/tokenizer.json: normalizer".
Result<std::unique_ptr<Normalizer>> make_normalizer(const nlohmann::json& config, std::string_view where);

// ---- Pre-tokenizers ------------------------------------------------------------------

struct PreToken {
  std::string text;
  bool at_origin;  // starts at offset 0 of the original input (Metaspace prepend_scheme "first")
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their pre-tokenized sub-pieces; empty pieces are dropped.
  virtual Status pre_tokenize(std::vector<PreToken>& pieces) const = 0;
};

Result<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const nlohmann::json& config, std::string_view where);

// ---- Decoders ------------------------------------------------------------------------

// kExact reproduces `tokenizers` decode(); kRaw keeps raw bytes (no U+FFFD
// substitution) and decodes one token at a time for token_bytes()/streaming.
enum class DecodeMode { kExact, kRaw };

struct DecodeState {
  DecodeMode mode;
  bool first;  // (kRaw) the token is the first of the decoded sequence
  bool fused;  // (kRaw) a Fuse-like step already ran: later steps see "the whole text"
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens, DecodeState& state) const = 0;
};

Result<std::unique_ptr<Decoder>> make_decoder(const nlohmann::json& config, std::string_view where);

}  // namespace colibri::tokenizer_detail
