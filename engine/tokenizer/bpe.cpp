#include "tokenizer/bpe.h"

#include <nlohmann/json.hpp>

#include <queue>
#include <utility>

#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace colibri::tokenizer_detail {

namespace {

struct Symbol {
  std::int32_t id;
  std::int32_t prev;
  std::int32_t next;
  std::uint32_t len;  // bytes of the word it covers; 0 once merged into its left neighbour
};

struct Candidate {
  std::uint32_t rank;
  std::uint32_t pos;
  std::int32_t new_id;
};

// Lowest rank first, then leftmost (models/bpe/word.rs `impl Ord for Merge`).
struct CandidateAfter {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.pos > b.pos;
  }
};

void add_symbol(std::vector<Symbol>& symbols, std::int32_t id, std::size_t byte_len) {
  const auto index = static_cast<std::int32_t>(symbols.size());
  if (!symbols.empty()) symbols.back().next = index;
  symbols.push_back({id, index - 1, -1, static_cast<std::uint32_t>(byte_len)});
}

Result<std::pair<std::string, std::string>> parse_merge(const Json& entry, std::size_t index,
                                                       std::string_view where) {
  if (entry.is_string()) {
    const auto& line = entry.get_ref<const std::string&>();
    const std::size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      return make_error("{}: merges[{}] '{}' is not two tokens separated by one space", where, index, line);
    }
    return std::make_pair(line.substr(0, space), line.substr(space + 1));
  }
  if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
    return std::make_pair(entry[0].get<std::string>(), entry[1].get<std::string>());
  }
  return make_error("{}: merges[{}] must be a string \"a b\" or a pair [\"a\", \"b\"]", where, index);
}

}  // namespace

Result<std::unique_ptr<BpeModel>> BpeModel::from_json(const Json& model, std::string_view where) {
  std::unique_ptr<BpeModel> bpe(new BpeModel());

  const Json* vocab = member(model, "vocab");
  if (vocab == nullptr) return make_error("{}: missing field 'vocab'", where);
  if (!vocab->is_object()) return make_error("{}: 'vocab' must be an object of token -> id", where);
  bpe->vocab_.reserve(vocab->size());
  std::int32_t max_id = -1;
  for (const auto& [token, id_json] : vocab->items()) {
    auto id = to_token_id(id_json, fmt::format("{}: vocab['{}']", where, token));
    if (!id.ok()) return id.error();
    bpe->vocab_.emplace(token, *id);
    max_id = std::max(max_id, *id);
  }
  bpe->vocab_r_.assign(static_cast<std::size_t>(max_id + 1), std::string());
  bpe->has_id_.assign(static_cast<std::size_t>(max_id + 1), false);
  for (const auto& [token, id] : bpe->vocab_) {
    const auto index = static_cast<std::size_t>(id);
    if (!bpe->has_id_[index]) {
      bpe->vocab_r_[index] = token;
      bpe->has_id_[index] = true;
    }
  }

  if (const Json* dropout = member(model, "dropout"); dropout != nullptr) {
    if (!dropout->is_number()) return make_error("{}: 'dropout' must be a number or null", where);
    if (dropout->get<double>() > 0.0) {
      return make_error("{}: BPE dropout {} is not supported (it makes encoding random)", where,
                        dropout->get<double>());
    }
  }
  auto unk = read_optional_string(model, "unk_token", where);
  if (!unk.ok()) return unk.error();
  bpe->unk_token_ = *unk;
  auto prefix = read_optional_string(model, "continuing_subword_prefix", where);
  if (!prefix.ok()) return prefix.error();
  bpe->continuing_subword_prefix_ = prefix->value_or("");
  auto suffix = read_optional_string(model, "end_of_word_suffix", where);
  if (!suffix.ok()) return suffix.error();
  bpe->end_of_word_suffix_ = suffix->value_or("");
  auto fuse_unk = read_bool(model, "fuse_unk", false, where);
  if (!fuse_unk.ok()) return fuse_unk.error();
  bpe->fuse_unk_ = *fuse_unk;
  auto byte_fallback = read_bool(model, "byte_fallback", false, where);
  if (!byte_fallback.ok()) return byte_fallback.error();
  bpe->byte_fallback_ = *byte_fallback;
  auto ignore_merges = read_bool(model, "ignore_merges", false, where);
  if (!ignore_merges.ok()) return ignore_merges.error();
  bpe->ignore_merges_ = *ignore_merges;

  for (int b = 0; b < 256; ++b) {
    const auto id = bpe->token_to_id(fmt::format("<0x{:02X}>", b));
    bpe->byte_ids_[b] = id.value_or(-1);
  }

  if (const Json* merges = member(model, "merges"); merges != nullptr) {
    if (!merges->is_array()) return make_error("{}: 'merges' must be an array", where);
    bpe->merges_.reserve(merges->size());
    std::uint32_t rank = 0;
    const std::string& pre = bpe->continuing_subword_prefix_;
    for (std::size_t i = 0; i < merges->size(); ++i) {
      const Json& entry = (*merges)[i];
      if (entry.is_string() && entry.get_ref<const std::string&>().rfind("#version", 0) == 0) continue;
      auto pair = parse_merge(entry, i, where);
      if (!pair.ok()) return pair.error();
      const auto& [a, b] = *pair;
      const auto a_id = bpe->token_to_id(a);
      const auto b_id = bpe->token_to_id(b);
      if (!a_id || !b_id) {
        return make_error("{}: merges[{}] ('{}' '{}') references '{}', which is not in the vocabulary",
                          where, i, a, b, a_id ? b : a);
      }
      const std::string merged =
          a + (!pre.empty() && b.rfind(pre, 0) == 0 ? b.substr(pre.size()) : b);
      const auto new_id = bpe->token_to_id(merged);
      if (!new_id) {
        return make_error("{}: merges[{}] ('{}' '{}') makes '{}', which is not in the vocabulary", where,
                          i, a, b, merged);
      }
      bpe->merges_[pair_key(*a_id, *b_id)] = Merge{rank, *new_id};
      ++rank;
    }
  }
  return bpe;
}

std::optional<std::int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(std::int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= vocab_r_.size() || !has_id_[static_cast<std::size_t>(id)]) {
    return nullptr;
  }
  return &vocab_r_[static_cast<std::size_t>(id)];
}

Status BpeModel::tokenize(std::string_view word, std::vector<std::int32_t>& out) const {
  if (word.empty()) return Status::Ok();
  if (ignore_merges_) {
    if (const auto id = token_to_id(word)) {
      out.push_back(*id);
      return Status::Ok();
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return Status::Ok();
    }
  }
  std::vector<std::int32_t> ids;
  COLIBRI_TRY(merge_word(word, ids));
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(ids));
  }
  return Status::Ok();
}

Status BpeModel::merge_word(std::string_view word, std::vector<std::int32_t>& out) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  // Pending unknown-token run: (id, byte length); id -1 when none.
  std::int32_t unk_id = -1;
  std::size_t unk_len = 0;
  std::string scratch;
  std::size_t pos = 0;
  while (pos < word.size()) {
    const std::size_t start = pos;
    next_code_point(word, pos);
    const std::size_t byte_len = pos - start;
    std::string_view piece = word.substr(start, byte_len);
    const bool add_prefix = start != 0 && !continuing_subword_prefix_.empty();
    const bool add_suffix = pos == word.size() && !end_of_word_suffix_.empty();
    if (add_prefix || add_suffix) {
      scratch.assign(add_prefix ? continuing_subword_prefix_ : std::string());
      scratch.append(piece);
      if (add_suffix) scratch.append(end_of_word_suffix_);
      piece = scratch;
    }
    if (const auto id = token_to_id(piece)) {
      if (unk_id >= 0) {
        add_symbol(symbols, unk_id, unk_len);
        unk_id = -1;
      }
      add_symbol(symbols, *id, byte_len);
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (char c : piece) all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all_bytes) {
        for (char c : piece) add_symbol(symbols, byte_ids_[static_cast<unsigned char>(c)], 1);
        continue;
      }
    }
    if (unk_token_) {
      const auto id = token_to_id(*unk_token_);
      if (!id) return make_error("BPE unk_token '{}' is not in the vocabulary", *unk_token_);
      if (unk_id >= 0 && fuse_unk_) {
        unk_len += byte_len;
      } else {
        if (unk_id >= 0) add_symbol(symbols, unk_id, unk_len);
        unk_id = *id;
        unk_len = byte_len;
      }
    }
  }
  if (unk_id >= 0) add_symbol(symbols, unk_id, unk_len);

  std::priority_queue<Candidate, std::vector<Candidate>, CandidateAfter> queue;
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
    const auto it = merges_.find(pair_key(symbols[i].id, symbols[i + 1].id));
    if (it != merges_.end()) queue.push({it->second.rank, static_cast<std::uint32_t>(i), it->second.new_id});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& current = symbols[top.pos];
    if (current.len == 0 || current.next == -1) continue;
    const Symbol right = symbols[static_cast<std::size_t>(current.next)];
    // Skip stale entries: the pair at this position must still make the same token.
    const auto now = merges_.find(pair_key(current.id, right.id));
    if (now == merges_.end() || now->second.new_id != top.new_id) continue;

    symbols[static_cast<std::size_t>(current.next)].len = 0;
    current.id = top.new_id;
    current.len += right.len;
    current.next = right.next;
    if (right.next >= 0) symbols[static_cast<std::size_t>(right.next)].prev = static_cast<std::int32_t>(top.pos);

    if (current.prev >= 0) {
      const Symbol& prev = symbols[static_cast<std::size_t>(current.prev)];
      const auto it = merges_.find(pair_key(prev.id, current.id));
      if (it != merges_.end()) {
        queue.push({it->second.rank, static_cast<std::uint32_t>(current.prev), it->second.new_id});
      }
    }
    if (current.next >= 0) {
      const Symbol& next = symbols[static_cast<std::size_t>(current.next)];
      const auto it = merges_.find(pair_key(current.id, next.id));
      if (it != merges_.end()) queue.push({it->second.rank, top.pos, it->second.new_id});
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) out.push_back(s.id);
  }
  return Status::Ok();
}

}  // namespace colibri::tokenizer_detail
