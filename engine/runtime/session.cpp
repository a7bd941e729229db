#include "runtime/session.h"

#include <algorithm>

#include "runtime/batch_decoder.h"

namespace colibri {

std::optional<ActivationModes> activation_preset(std::string_view name) {
  if (name == "int8-ffn") return kPrefillInt8Ffn;
  if (name == "int8-ffn-out") return kPrefillInt8FfnOut;
  return std::nullopt;
}

std::int32_t Session::context_for(const ModelConfig& config, std::int32_t max_context) {
  return max_context > 0 ? std::min(max_context, config.max_positions) : std::min(config.max_positions, kDefaultMaxContext);
}

Session::Session(std::shared_ptr<const Model> model, std::int32_t max_context, ThreadTeam* team,
                 std::int32_t prefill_batch, ExpertStore* store, KvCacheType kv_cache)
    : model_(std::move(model)) {
  const ModelConfig& c = model_->config();
  max_context_ = context_for(c, max_context);
  const std::size_t kv_dim = static_cast<std::size_t>(c.n_kv_heads) * c.head_dim;
  const std::size_t kv_elements = static_cast<std::size_t>(c.n_layers) * max_context_ * kv_dim;
  kv_type_ = resolve_kv_cache_type(kv_cache, *model_);
  if (kv_type_ == KvCacheType::F16) {
    key_cache_f16_.resize(kv_elements);
    value_cache_f16_.resize(kv_elements);
  } else {
    key_cache_.resize(kv_elements);
    value_cache_.resize(kv_elements);
  }
  logits_.resize(static_cast<std::size_t>(c.vocab));
  // A prompt never needs more tokens per pass than the context holds.
  const std::int32_t capacity = std::clamp(prefill_batch, 1, max_context_);
  decoder_ = std::make_unique<BatchDecoder>(model_, capacity, team, max_context_, store);
  items_.resize(static_cast<std::size_t>(capacity));
}

Session::~Session() = default;

Result<std::span<const float>> Session::decode(std::int32_t token) {
  BatchItem& item = items_.front();
  item.session = this;
  item.token = token;
  item.logits = logits_.data();
  COLIBRI_TRY(decoder_->step(std::span<BatchItem>(&item, 1)));
  if (!item.status.ok()) return item.status.error();
  return std::span<const float>(logits_);
}

Result<std::span<const float>> Session::prefill(std::span<const std::int32_t> tokens, const LogitsObserver& observer) {
  const ModelConfig& c = model_->config();
  if (tokens.empty()) return make_error("prefill needs at least one token");
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab)
      return make_error("token id {} (prompt index {}) is outside the vocabulary [0, {})", tokens[i], i, c.vocab);
  if (static_cast<std::size_t>(max_context_ - position_) < tokens.size())
    return make_error("context is full: {} tokens do not fit after {} positions used of {}", tokens.size(),
                      position_, max_context_);
  // As few passes as the capacity allows, of equal length (the first ones one
  // longer): a pass reads every expert any of its tokens routes to, so the
  // pass count is what matters, and balanced passes keep matmat tiles full.
  // An observer needs every position's logits: one token per pass.
  const std::size_t capacity = observer ? 1 : items_.size();
  const std::size_t passes = (tokens.size() + capacity - 1) / capacity;
  const std::size_t base = tokens.size() / passes, longer = tokens.size() % passes;
  // Prefill modes apply for the duration of this call only.
  struct ModesGuard {
    Session& s;
    ActivationModes saved;
    ~ModesGuard() { s.modes_ = saved; }
  } guard{*this, modes_};
  if (prefill_modes_) modes_ = *prefill_modes_;
  std::size_t first = 0;
  for (std::size_t pass = 0; pass < passes; ++pass) {
    const std::size_t n = base + (pass < longer ? 1 : 0);
    for (std::size_t i = 0; i < n; ++i) {
      BatchItem& item = items_[i];
      item.session = this;
      item.token = tokens[first + i];
      item.logits = observer || first + i + 1 == tokens.size() ? logits_.data() : nullptr;
    }
    COLIBRI_TRY(decoder_->step(std::span<BatchItem>(items_.data(), n)));
    // Validated above, so only the forward pass can fail, and then it fails
    // the whole chunk.
    if (!items_.front().status.ok()) return items_.front().status.error();
    if (observer) observer(position_ - 1, logits_);
    first += n;
  }
  return std::span<const float>(logits_);
}

}  // namespace colibri
