#include "runtime/session.h"

#include <algorithm>
#include <cmath>

#include "kernels/quantize.h"
#include "kernels/reference.h"
#include "moe/router.h"

namespace colibri {

Session::Session(std::shared_ptr<const Model> model, std::int32_t max_context)
    : model_(std::move(model)) {
  const ModelConfig& c = model_->config();
  max_context_ = max_context > 0 ? std::min(max_context, c.max_positions)
                                 : std::min(c.max_positions, kDefaultMaxContext);
  const std::size_t kv_dim = static_cast<std::size_t>(c.n_kv_heads) * c.head_dim;
  const std::size_t q_dim = static_cast<std::size_t>(c.n_heads) * c.head_dim;
  key_cache_.resize(static_cast<std::size_t>(c.n_layers) * max_context_ * kv_dim);
  value_cache_.resize(key_cache_.size());
  x_.resize(c.hidden);
  xn_.resize(c.hidden);
  q_.resize(q_dim);
  attn_out_.resize(q_dim);
  scores_.resize(max_context_);
  block_out_.resize(c.hidden);
  std::int32_t max_ff = std::max({c.expert_ff, c.shared_ff, c.dense_ff});
  ffn_gate_.resize(max_ff);
  ffn_up_.resize(max_ff);
  ffn_out_.resize(c.hidden);
  router_.resize(c.n_experts);
  router_logits_.resize(c.n_experts);
  chosen_.resize(c.top_k);
  chosen_weight_.resize(c.top_k);
  logits_.resize(c.vocab);
}

void Session::emit(std::string_view name, std::int32_t layer, const float* data,
                   std::int32_t n) const {
  if (hook_) hook_(name, layer, position_, std::span<const float>(data, static_cast<std::size_t>(n)));
}

Result<std::span<const float>> Session::decode(std::int32_t token) {
  const ModelConfig& c = model_->config();
  const ModelWeights& w = model_->weights();
  if (token < 0 || token >= c.vocab)
    return make_error("token id {} is outside the vocabulary [0, {})", token, c.vocab);
  if (position_ >= max_context_)
    return make_error("context is full: {} positions used of {}", position_, max_context_);

  dequantize_row(w.embed, token, x_.data());
  emit("embed", -1, x_.data(), c.hidden);
  for (std::int32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& layer = w.layers[static_cast<std::size_t>(l)];
    ref::rmsnorm(x_.data(), layer.attn_norm, c.hidden, c.rms_eps, xn_.data());
    attention(l);
    for (std::int32_t i = 0; i < c.hidden; ++i) x_[i] += block_out_[i];
    emit("attn_residual", l, x_.data(), c.hidden);

    ref::rmsnorm(x_.data(), layer.ffn_norm, c.hidden, c.rms_eps, xn_.data());
    if (layer.is_moe) {
      Status status = moe_ffn(l);
      if (!status.ok()) return make_error("layer {}: {}", l, status.error().message);
    } else {
      dense_ffn(layer.dense, block_out_.data());
    }
    emit("ffn_out", l, block_out_.data(), c.hidden);
    for (std::int32_t i = 0; i < c.hidden; ++i) x_[i] += block_out_[i];
    emit("layer_out", l, x_.data(), c.hidden);
  }
  ref::rmsnorm(x_.data(), w.final_norm, c.hidden, c.rms_eps, xn_.data());
  ref::matvec(w.lm_head, xn_.data(), logits_.data());
  emit("logits", -1, logits_.data(), c.vocab);
  ++position_;
  return std::span<const float>(logits_);
}

void Session::attention(std::int32_t l) {
  const ModelConfig& c = model_->config();
  const LayerWeights& layer = model_->weights().layers[static_cast<std::size_t>(l)];
  const std::int32_t head_dim = c.head_dim;
  const std::int32_t q_dim = c.n_heads * head_dim;
  const std::int32_t kv_dim = c.n_kv_heads * head_dim;
  const std::size_t layer_base = static_cast<std::size_t>(l) * max_context_ * kv_dim;
  float* k = key_cache_.data() + layer_base + static_cast<std::size_t>(position_) * kv_dim;
  float* v = value_cache_.data() + layer_base + static_cast<std::size_t>(position_) * kv_dim;

  ref::matvec(layer.q, xn_.data(), q_.data());
  ref::matvec(layer.k, xn_.data(), k);
  ref::matvec(layer.v, xn_.data(), v);
  if (layer.q_bias != nullptr) {
    for (std::int32_t i = 0; i < q_dim; ++i) q_[i] += layer.q_bias[i];
    for (std::int32_t i = 0; i < kv_dim; ++i) k[i] += layer.k_bias[i];
    for (std::int32_t i = 0; i < kv_dim; ++i) v[i] += layer.v_bias[i];
  }
  switch (c.arch->qk_norm) {
    case QkNorm::None:
      break;
    case QkNorm::PerHead:
      for (std::int32_t h = 0; h < c.n_heads; ++h)
        ref::rmsnorm(q_.data() + h * head_dim, layer.q_norm, head_dim, c.rms_eps, q_.data() + h * head_dim);
      for (std::int32_t h = 0; h < c.n_kv_heads; ++h)
        ref::rmsnorm(k + h * head_dim, layer.k_norm, head_dim, c.rms_eps, k + h * head_dim);
      break;
    case QkNorm::Whole:
      ref::rmsnorm(q_.data(), layer.q_norm, q_dim, c.rms_eps, q_.data());
      ref::rmsnorm(k, layer.k_norm, kv_dim, c.rms_eps, k);
      break;
  }
  ref::rope_rotate_half(q_.data(), c.n_heads, head_dim, position_, c.rope_theta);
  ref::rope_rotate_half(k, c.n_kv_heads, head_dim, position_, c.rope_theta);
  emit("q", l, q_.data(), q_dim);
  emit("k", l, k, kv_dim);
  emit("v", l, v, kv_dim);

  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const std::int32_t group = c.n_heads / c.n_kv_heads;
  const std::int32_t n_positions = position_ + 1;
  const float* keys = key_cache_.data() + layer_base;
  const float* values = value_cache_.data() + layer_base;
  for (std::int32_t h = 0; h < c.n_heads; ++h) {
    const float* qh = q_.data() + h * head_dim;
    const std::int32_t kv_head = h / group;
    for (std::int32_t p = 0; p < n_positions; ++p)
      scores_[p] = ref::dot(qh, keys + static_cast<std::size_t>(p) * kv_dim + kv_head * head_dim, head_dim) * scale;
    ref::softmax(scores_.data(), n_positions);
    float* out = attn_out_.data() + h * head_dim;
    std::fill_n(out, head_dim, 0.0f);
    for (std::int32_t p = 0; p < n_positions; ++p) {
      const float* vp = values + static_cast<std::size_t>(p) * kv_dim + kv_head * head_dim;
      for (std::int32_t i = 0; i < head_dim; ++i) out[i] += scores_[p] * vp[i];
    }
  }
  emit("attn_heads", l, attn_out_.data(), q_dim);
  ref::matvec(layer.o, attn_out_.data(), block_out_.data());
  emit("attn_out", l, block_out_.data(), c.hidden);
}

void Session::dense_ffn(const FfnWeights& ffn, float* out) {
  const std::int32_t ff = ffn.gate.rows;
  ref::matvec(ffn.gate, xn_.data(), ffn_gate_.data());
  ref::matvec(ffn.up, xn_.data(), ffn_up_.data());
  for (std::int32_t i = 0; i < ff; ++i) ffn_gate_[i] = ref::silu(ffn_gate_[i]) * ffn_up_[i];
  ref::matvec(ffn.down, ffn_gate_.data(), out);
}

Status Session::moe_ffn(std::int32_t l) {
  const LayerWeights& layer = model_->weights().layers[static_cast<std::size_t>(l)];
  const ModelConfig& c = model_->config();
  ref::matvec(layer.router, xn_.data(), router_logits_.data());
  emit("router_logits", l, router_logits_.data(), c.n_experts);
  // Logits come from finite weights and activations; a failure here means the
  // model produced NaN, which route_top_k reports rather than choosing garbage.
  const RouterSpec spec{c.n_experts, c.top_k, c.norm_topk};
  Status routed = route_top_k(spec, router_logits_, router_, chosen_, chosen_weight_);
  if (!routed.ok()) return routed;

  std::fill(block_out_.begin(), block_out_.end(), 0.0f);
  for (std::int32_t slot = 0; slot < c.top_k; ++slot) {
    dense_ffn(layer.experts[static_cast<std::size_t>(chosen_[slot])], ffn_out_.data());
    for (std::int32_t i = 0; i < c.hidden; ++i) block_out_[i] += chosen_weight_[slot] * ffn_out_[i];
  }
  if (!layer.shared.gate.empty()) {
    dense_ffn(layer.shared, ffn_out_.data());
    float gate_logit = 0.0f;
    ref::matvec(layer.shared_expert_gate, xn_.data(), &gate_logit);
    float gate = ref::sigmoid(gate_logit);
    for (std::int32_t i = 0; i < c.hidden; ++i) block_out_[i] += gate * ffn_out_[i];
  }
  return Status::Ok();
}

}  // namespace colibri
