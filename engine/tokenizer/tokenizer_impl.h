// The state behind colibri::Tokenizer, shared by tokenizer.cpp (encode/decode) and
// tokenizer_load.cpp (building it from JSON). Internal to engine/tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/tokenizer.h"

namespace colibri {

struct Tokenizer::Impl {
  std::unique_ptr<tokenizer_detail::BpeModel> model;
  std::unique_ptr<tokenizer_detail::Normalizer> normalizer;      // may be null
  std::unique_ptr<tokenizer_detail::PreTokenizer> pre_tokenizer;  // may be null
  std::unique_ptr<tokenizer_detail::Decoder> decoder;             // may be null

  std::vector<tokenizer_detail::AddedToken> added_tokens;
  std::unordered_map<std::int32_t, std::size_t> added_by_id;
  tokenizer_detail::Vocab added_by_content;
  tokenizer_detail::AddedTokenMatcher raw_matcher;         // normalized=false tokens, on the input
  tokenizer_detail::AddedTokenMatcher normalized_matcher;  // normalized=true tokens, after the normalizer

  // What encode() adds around the text when add_special_tokens is set.
  std::vector<std::int32_t> prefix_ids;
  std::vector<std::int32_t> suffix_ids;
  std::optional<std::int32_t> bos;
  std::optional<std::int32_t> eos;
  std::string chat_template;
  std::int32_t vocab_size = 0;

  // The token's stored string (added tokens first, then the model), or nullptr.
  const std::string* token_content(std::int32_t id) const {
    if (const auto it = added_by_id.find(id); it != added_by_id.end()) return &added_tokens[it->second].content;
    return model->id_to_token(id);
  }
  bool is_special(std::int32_t id) const {
    const auto it = added_by_id.find(id);
    return it != added_by_id.end() && added_tokens[it->second].special;
  }
  // Raw bytes of one token through the decoder; `first` when it starts the text.
  std::string raw_piece(const std::string& content, bool first) const;
};

// Builds the Impl; `tokenizer_label` / `config_label` name the two JSON texts in
// error messages. `config_json` may be empty.
Result<std::shared_ptr<const Tokenizer::Impl>> build_tokenizer(std::string_view tokenizer_json,
                                                               std::string_view config_json,
                                                               const std::string& tokenizer_label,
                                                               const std::string& config_label);

}  // namespace colibri
