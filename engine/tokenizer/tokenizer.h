// Hugging Face `tokenizer.json` tokenizers (BPE: byte-level as GPT-2/Qwen/OLMoE, and
// SentencePiece-style with byte fallback as Llama/Mistral/Mixtral), reproducing the
// Rust `tokenizers` library id for id and byte for byte.
//
// Encoding: split on added tokens -> normalizer -> split on normalized added tokens
// -> pre-tokenizer -> BPE -> BOS/EOS. Decoding runs the tokenizer.json decoder.
// No exception leaves this API; failures are Errors naming the file and problem.
// A Tokenizer is immutable after loading, cheap to copy (shared state) and safe to
// use from several threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"

namespace colibri {

struct EncodeOptions {
  // Add BOS/EOS as tokenizer_config.json (add_bos_token / add_eos_token) or, where it
  // says nothing, the tokenizer.json post_processor prescribes.
  bool add_special_tokens = true;
  // Recognise special-token text (e.g. "<|im_start|>") in the input. Off by default:
  // text from a user never becomes a control token unless the caller asks. Non-special
  // added tokens are always recognised, as Hugging Face does.
  bool parse_special = false;
};

class Tokenizer {
 public:
  // `dir` holds tokenizer.json and optionally tokenizer_config.json.
  static Result<Tokenizer> load(const std::filesystem::path& dir);
  // The same from in-memory JSON texts; `tokenizer_config_json` may be empty.
  // `source_name` names them in error messages.
  static Result<Tokenizer> from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                                     std::string_view source_name);

  // `text` must be valid UTF-8.
  Result<std::vector<std::int32_t>> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Errors naming the id when an id is not in the vocabulary.
  Result<std::string> decode(std::span<const std::int32_t> ids, bool skip_special = false) const;
  // decode() of ids a model produced or was given: ids at or past vocab_size()
  // (an embedding padded past the vocabulary, as Qwen's: 151936 rows, 151665
  // tokens) are left out, as Hugging Face's decode leaves them.
  Result<std::string> decode_model_ids(std::span<const std::int32_t> ids, bool skip_special = false) const;

  // Raw bytes of one token's piece as it reads mid-text (may be partial UTF-8; e.g.
  // "▁the" -> " the", "<0xE2>" -> "\xE2"). Empty if the id is out of range.
  std::string token_bytes(std::int32_t id) const;
  // The same as the first token of a text reads: a decoder that strips a
  // leading space (SentencePiece's "▁{" -> "{") strips it here.
  std::string first_token_bytes(std::int32_t id) const;
  // The token's string as stored in tokenizer.json (e.g. "Ġthe"); nullopt if unknown.
  std::optional<std::string> id_to_token(std::int32_t id) const;
  std::optional<std::int32_t> token_to_id(std::string_view piece) const;

  std::int32_t vocab_size() const;  // max id + 1, added tokens included
  std::optional<std::int32_t> bos_id() const;
  std::optional<std::int32_t> eos_id() const;  // tokenizer_config.json eos_token
  bool is_special(std::int32_t id) const;
  const std::string& chat_template() const;  // may be empty
  bool add_bos() const;                      // encode() starts with bos_id() when adding special tokens
  bool add_eos() const;                      // encode() ends with eos_id() when adding special tokens

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend class StreamingDecoder;
};

// Incremental detokenizer for streaming output: push() returns only complete UTF-8
// and holds back the bytes of a character that spans tokens. Its output concatenated
// equals decode() of the same ids (except that invalid byte runs become one U+FFFD per
// maximal invalid sequence, as Python's errors="replace", and that a decoder's strip of
// trailing characters cannot apply to a stream).
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  // Ids out of range produce nothing.
  std::string push(std::int32_t id);
  // Whatever is left; invalid or incomplete bytes become U+FFFD.
  std::string flush();

 private:
  std::shared_ptr<const Tokenizer::Impl> impl_;
  std::string pending_;
  bool started_ = false;
  bool skip_special_ = false;
};

}  // namespace colibri
