// Encoding, decoding and streaming for colibri::Tokenizer (loading is in
// tokenizer_load.cpp).
#include "tokenizer/tokenizer.h"

#include <utility>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace colibri {

using tokenizer_detail::AddedSplit;
using tokenizer_detail::DecodeMode;
using tokenizer_detail::DecodeState;
using tokenizer_detail::PreToken;

namespace {

// Pre-tokenizes one normalized piece of text and runs the model over the pieces.
Status tokenize_text(const Tokenizer::Impl& impl, std::string text, bool at_origin, std::vector<std::int32_t>& ids) {
  std::vector<PreToken> pieces;
  pieces.push_back({std::move(text), at_origin});
  if (impl.pre_tokenizer) COLIBRI_TRY(impl.pre_tokenizer->pre_tokenize(pieces));
  for (const PreToken& piece : pieces) COLIBRI_TRY(impl.model->tokenize(piece.text, ids));
  return Status::Ok();
}

}  // namespace

std::string Tokenizer::Impl::raw_piece(const std::string& content, bool first) const {
  if (!decoder) return content;
  std::vector<std::string> tokens{content};
  DecodeState state{DecodeMode::kRaw, first, false};
  decoder->decode_chain(tokens, state);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

Result<std::vector<std::int32_t>> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  const Impl& impl = *impl_;
  if (const std::size_t bad = tokenizer_detail::find_invalid_utf8(text); bad != std::string_view::npos) {
    return make_error("tokenizer: input text is not valid UTF-8 (byte {} of {})", bad, text.size());
  }
  std::vector<std::int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (options.add_special_tokens) ids.insert(ids.end(), impl.prefix_ids.begin(), impl.prefix_ids.end());

  const bool split_special = !options.parse_special;
  std::vector<AddedSplit> raw_splits;
  COLIBRI_TRY(impl.raw_matcher.split(text, split_special, raw_splits));
  std::vector<AddedSplit> normalized_splits;
  for (const AddedSplit& raw : raw_splits) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    if (raw.span.end == raw.span.start) continue;
    std::string normalized(text.substr(raw.span.start, raw.span.end - raw.span.start));
    if (impl.normalizer) COLIBRI_TRY(impl.normalizer->normalize(normalized));
    if (normalized.empty()) continue;
    const bool at_origin = raw.span.start == 0;
    if (impl.normalized_matcher.empty()) {
      COLIBRI_TRY(tokenize_text(impl, std::move(normalized), at_origin, ids));
      continue;
    }
    normalized_splits.clear();
    COLIBRI_TRY(impl.normalized_matcher.split(normalized, split_special, normalized_splits));
    for (const AddedSplit& piece : normalized_splits) {
      if (piece.id >= 0) {
        ids.push_back(piece.id);
      } else if (piece.span.end > piece.span.start) {
        COLIBRI_TRY(tokenize_text(impl, normalized.substr(piece.span.start, piece.span.end - piece.span.start),
                                  at_origin && piece.span.start == 0, ids));
      }
    }
  }
  if (options.add_special_tokens) ids.insert(ids.end(), impl.suffix_ids.begin(), impl.suffix_ids.end());
  return ids;
}

Result<std::string> Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  const Impl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int32_t id = ids[i];
    const std::string* content = impl.token_content(id);
    if (content == nullptr) {
      return make_error("tokenizer: cannot decode token id {} (position {}): not in the vocabulary of {} ids", id,
                        i, impl.vocab_size);
    }
    if (skip_special && impl.is_special(id)) continue;
    tokens.push_back(*content);
  }
  std::string out;
  if (!impl.decoder) {  // tokenizers joins with spaces when there is no decoder
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  DecodeState state{DecodeMode::kExact, true, false};
  impl.decoder->decode_chain(tokens, state);
  for (const std::string& t : tokens) out += t;
  return out;
}

Result<std::string> Tokenizer::decode_model_ids(std::span<const std::int32_t> ids, bool skip_special) const {
  std::vector<std::int32_t> known;
  known.reserve(ids.size());
  for (const std::int32_t id : ids)
    if (id < impl_->vocab_size) known.push_back(id);
  return decode(known, skip_special);
}

std::string Tokenizer::token_bytes(std::int32_t id) const {
  const std::string* content = impl_->token_content(id);
  if (content == nullptr) return {};
  return impl_->raw_piece(*content, false);
}

std::string Tokenizer::first_token_bytes(std::int32_t id) const {
  const std::string* content = impl_->token_content(id);
  if (content == nullptr) return {};
  return impl_->raw_piece(*content, true);
}

std::optional<std::string> Tokenizer::id_to_token(std::int32_t id) const {
  const std::string* content = impl_->token_content(id);
  if (content == nullptr) return std::nullopt;
  return *content;
}

std::optional<std::int32_t> Tokenizer::token_to_id(std::string_view piece) const {
  if (const auto it = impl_->added_by_content.find(piece); it != impl_->added_by_content.end()) return it->second;
  return impl_->model->token_to_id(piece);
}

std::int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<std::int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<std::int32_t> Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::is_special(std::int32_t id) const { return impl_->is_special(id); }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

bool Tokenizer::add_bos() const {
  return impl_->bos && !impl_->prefix_ids.empty() && impl_->prefix_ids.front() == *impl_->bos;
}

bool Tokenizer::add_eos() const {
  return impl_->eos && !impl_->suffix_ids.empty() && impl_->suffix_ids.back() == *impl_->eos;
}

// ---- StreamingDecoder ------------------------------------------------------------------

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special)
    : impl_(tokenizer.impl_), skip_special_(skip_special) {}

std::string StreamingDecoder::push(std::int32_t id) {
  const std::string* content = impl_->token_content(id);
  if (content == nullptr || (skip_special_ && impl_->is_special(id))) return {};
  std::string piece = impl_->raw_piece(*content, !started_);
  // The text "starts" with the first token that has any content, even if the
  // decoder stripped all of it (e.g. a lone leading space).
  if (!started_ && !impl_->raw_piece(*content, false).empty()) started_ = true;
  pending_ += piece;
  auto scan = tokenizer_detail::decode_utf8_lossy(pending_, /*final=*/false);
  pending_.erase(0, scan.consumed);
  return std::move(scan.text);
}

std::string StreamingDecoder::flush() {
  std::string out = tokenizer_detail::utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace colibri
