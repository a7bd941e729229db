// The BPE model of tokenizer.json, merging as Hugging Face `tokenizers` does
// (models/bpe/word.rs): a priority queue of candidate merges ordered by (rank,
// position) over a linked list of symbols, O(n log n) per word. Internal.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/result.h"

namespace colibri::tokenizer_detail {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `model` is the "model" object of tokenizer.json; `where` names it in errors.
  static Result<std::unique_ptr<BpeModel>> from_json(const nlohmann::json& model, std::string_view where);

  // Appends the ids of one pre-tokenized word.
  Status tokenize(std::string_view word, std::vector<std::int32_t>& out) const;

  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  // nullptr when no token has this id.
  const std::string* id_to_token(std::int32_t id) const;
  std::int32_t max_id() const { return static_cast<std::int32_t>(vocab_r_.size()) - 1; }

 private:
  BpeModel() = default;
  struct Merge {
    std::uint32_t rank;
    std::int32_t new_id;
  };
  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }
  Status merge_word(std::string_view word, std::vector<std::int32_t>& out) const;

  Vocab vocab_;
  std::vector<std::string> vocab_r_;
  std::vector<bool> has_id_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::optional<std::string> unk_token_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::int32_t byte_ids_[256] = {};  // <0xNN> ids, -1 when absent

  // Cache of merged words (as the Rust implementation keeps one).
  static constexpr std::size_t kCacheCapacity = 10000;
  static constexpr std::size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace colibri::tokenizer_detail
