#include "runtime/session.h"

#include <algorithm>
#include <cmath>

#include "kernels/quantize.h"
#include "kernels/reference.h"
#include "moe/router.h"
#include "runtime/thread_team.h"

namespace colibri {
namespace {

// Rows per unit of work handed to a thread: 16 f32 outputs fill a cache line,
// so threads never write the same line of y.
constexpr std::int32_t kRowGrain = 16;

}  // namespace

Session::Session(std::shared_ptr<const Model> model, std::int32_t max_context, ThreadTeam* team)
    : model_(std::move(model)), team_(team) {
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
  max_ff_ = std::max({c.expert_ff, c.shared_ff, c.dense_ff});
  // A layer runs at most top_k routed experts plus a shared one (or one dense FFN).
  const std::size_t blocks = static_cast<std::size_t>(std::max(c.top_k, 1)) + 1;
  ffn_gate_.resize(blocks * max_ff_);
  ffn_up_.resize(blocks * max_ff_);
  ffn_out_.resize(blocks * c.hidden);
  router_.resize(c.n_experts);
  router_logits_.resize(c.n_experts);
  chosen_.resize(c.top_k);
  chosen_weight_.resize(c.top_k);
  logits_.resize(c.vocab);

  for (kernels::ActivationQ8& q : xn_q_) q.reserve(c.hidden, 1);
  attn_q_.reserve(static_cast<std::int32_t>(q_dim), 1);
  hidden_q_.resize(blocks);
  for (kernels::ActivationQ8& q : hidden_q_) q.reserve(max_ff_, 1);
  block_ffns_.resize(blocks);
  block_outs_.resize(blocks);
  tasks_.resize(2 * blocks + 1);
  task_offsets_.resize(tasks_.size() + 1);
  if (team_ != nullptr) team_->reserve_scratch(static_cast<std::size_t>(max_context_) * sizeof(float));
}

void Session::emit(std::string_view name, std::int32_t layer, const float* data,
                   std::int32_t n) const {
  if (hook_) hook_(name, layer, position_, std::span<const float>(data, static_cast<std::size_t>(n)));
}

const kernels::ActivationQ8* Session::quantized_xn(const Matrix& w, ActivationMode mode) {
  if (!is_quantized(w.format) || mode == ActivationMode::F32) return nullptr;
  const bool residual = mode == ActivationMode::Int8Residual;
  for (std::int32_t i = 0; i < xn_q_valid_; ++i)
    if (xn_q_[i].group == w.group && xn_q_[i].residual == residual) return &xn_q_[i];
  // A fourth (group, mode) in one block evicts the last; a task still holding
  // the evicted one sees the group mismatch and falls back to f32 activations
  // (or to one plane, if only the mode differs): slower, never wrong.
  const std::int32_t slot = xn_q_valid_ < 3 ? xn_q_valid_++ : 2;
  kernels::quantize_activation(xn_.data(), static_cast<std::int32_t>(xn_.size()), w.group, xn_q_[slot], residual);
  return &xn_q_[slot];
}

void Session::run_matvecs(const MatvecTask* tasks, std::int32_t count) {
  if (team_ == nullptr || team_->size() == 1) {
    for (std::int32_t i = 0; i < count; ++i)
      kernels::matvec(*tasks[i].w, tasks[i].x, tasks[i].xq, tasks[i].y, 0, tasks[i].w->rows);
    return;
  }
  // The tasks' rows laid end to end, each padded to the grain, form one row
  // space that the team splits; a range may span several tasks.
  std::int32_t* offsets = task_offsets_.data();
  offsets[0] = 0;
  for (std::int32_t i = 0; i < count; ++i)
    offsets[i + 1] = offsets[i] + (tasks[i].w->rows + kRowGrain - 1) / kRowGrain * kRowGrain;
  team_->parallel_for(offsets[count], kRowGrain, [&](std::int32_t, std::int32_t begin, std::int32_t end) {
    for (std::int32_t i = 0; i < count; ++i) {
      const std::int32_t lo = std::max(begin, offsets[i]);
      const std::int32_t hi = std::min(end, offsets[i] + tasks[i].w->rows);
      if (lo < hi) kernels::matvec(*tasks[i].w, tasks[i].x, tasks[i].xq, tasks[i].y, lo - offsets[i], hi - offsets[i]);
    }
  });
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
    kernels::rmsnorm(x_.data(), layer.attn_norm, c.hidden, c.rms_eps, xn_.data());
    xn_q_valid_ = 0;
    attention(l);
    for (std::int32_t i = 0; i < c.hidden; ++i) x_[i] += block_out_[i];
    emit("attn_residual", l, x_.data(), c.hidden);

    kernels::rmsnorm(x_.data(), layer.ffn_norm, c.hidden, c.rms_eps, xn_.data());
    xn_q_valid_ = 0;
    if (layer.is_moe) {
      Status status = moe_ffn(l);
      if (!status.ok()) return make_error("layer {}: {}", l, status.error().message);
    } else {
      const FfnWeights* dense = &layer.dense;
      float* out = block_out_.data();
      ffn_blocks(&dense, 1, &out, nullptr);
    }
    emit("ffn_out", l, block_out_.data(), c.hidden);
    for (std::int32_t i = 0; i < c.hidden; ++i) x_[i] += block_out_[i];
    emit("layer_out", l, x_.data(), c.hidden);
  }
  kernels::rmsnorm(x_.data(), w.final_norm, c.hidden, c.rms_eps, xn_.data());
  xn_q_valid_ = 0;
  const MatvecTask lm_head{&w.lm_head, xn_.data(), quantized_xn(w.lm_head, modes_.lm_head), logits_.data()};
  run_matvecs(&lm_head, 1);
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

  const ActivationMode mode = modes_.attention;
  const MatvecTask qkv[3] = {{&layer.q, xn_.data(), quantized_xn(layer.q, mode), q_.data()},
                             {&layer.k, xn_.data(), quantized_xn(layer.k, mode), k},
                             {&layer.v, xn_.data(), quantized_xn(layer.v, mode), v}};
  run_matvecs(qkv, 3);
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
        kernels::rmsnorm(q_.data() + h * head_dim, layer.q_norm, head_dim, c.rms_eps, q_.data() + h * head_dim);
      for (std::int32_t h = 0; h < c.n_kv_heads; ++h)
        kernels::rmsnorm(k + h * head_dim, layer.k_norm, head_dim, c.rms_eps, k + h * head_dim);
      break;
    case QkNorm::Whole:
      kernels::rmsnorm(q_.data(), layer.q_norm, q_dim, c.rms_eps, q_.data());
      kernels::rmsnorm(k, layer.k_norm, kv_dim, c.rms_eps, k);
      break;
  }
  ref::rope_rotate_half(q_.data(), c.n_heads, head_dim, position_, c.rope_theta);
  ref::rope_rotate_half(k, c.n_kv_heads, head_dim, position_, c.rope_theta);
  emit("q", l, q_.data(), q_dim);
  emit("k", l, k, kv_dim);
  emit("v", l, v, kv_dim);

  // Heads are independent; with a team each member scores into its own scratch.
  if (team_ != nullptr && team_->size() > 1) {
    team_->parallel_for(c.n_heads, 1, [&](std::int32_t member, std::int32_t begin, std::int32_t end) {
      attention_heads(l, begin, end, reinterpret_cast<float*>(team_->scratch(member).data()));
    });
  } else {
    attention_heads(l, 0, c.n_heads, scores_.data());
  }
  emit("attn_heads", l, attn_out_.data(), q_dim);

  const kernels::ActivationQ8* attn_q = nullptr;
  if (is_quantized(layer.o.format) && modes_.attention_out != ActivationMode::F32) {
    kernels::quantize_activation(attn_out_.data(), q_dim, layer.o.group, attn_q_,
                                 modes_.attention_out == ActivationMode::Int8Residual);
    attn_q = &attn_q_;
  }
  const MatvecTask o{&layer.o, attn_out_.data(), attn_q, block_out_.data()};
  run_matvecs(&o, 1);
  emit("attn_out", l, block_out_.data(), c.hidden);
}

void Session::attention_heads(std::int32_t l, std::int32_t head_begin, std::int32_t head_end, float* scores) {
  const ModelConfig& c = model_->config();
  const std::int32_t head_dim = c.head_dim;
  const std::size_t kv_dim = static_cast<std::size_t>(c.n_kv_heads) * head_dim;
  const std::size_t layer_base = static_cast<std::size_t>(l) * max_context_ * kv_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const std::int32_t group = c.n_heads / c.n_kv_heads;
  const std::int32_t n_positions = position_ + 1;
  for (std::int32_t h = head_begin; h < head_end; ++h) {
    const std::size_t kv_offset = static_cast<std::size_t>(h / group) * head_dim;
    kernels::attention_scores(q_.data() + static_cast<std::size_t>(h) * head_dim,
                              key_cache_.data() + layer_base + kv_offset, kv_dim, n_positions, head_dim, scale,
                              scores);
    kernels::softmax(scores, n_positions);
    kernels::attention_values(scores, value_cache_.data() + layer_base + kv_offset, kv_dim, n_positions, head_dim,
                              attn_out_.data() + static_cast<std::size_t>(h) * head_dim);
  }
}

void Session::ffn_blocks(const FfnWeights* const* ffns, std::int32_t count, float* const* outs,
                         const MatvecTask* extra) {
  std::int32_t n = 0;
  for (std::int32_t i = 0; i < count; ++i) {
    const FfnWeights& f = *ffns[i];
    const std::size_t slice = static_cast<std::size_t>(i) * max_ff_;
    tasks_[n++] = {&f.gate, xn_.data(), quantized_xn(f.gate, modes_.ffn_gate_up), ffn_gate_.data() + slice};
    tasks_[n++] = {&f.up, xn_.data(), quantized_xn(f.up, modes_.ffn_gate_up), ffn_up_.data() + slice};
  }
  if (extra != nullptr) tasks_[n++] = *extra;
  run_matvecs(tasks_.data(), n);

  // SwiGLU and the down projections' input quantization are O(ff) per block:
  // on the calling thread, between the two jobs.
  for (std::int32_t i = 0; i < count; ++i) {
    const FfnWeights& f = *ffns[i];
    float* hidden = ffn_gate_.data() + static_cast<std::size_t>(i) * max_ff_;
    kernels::swiglu(hidden, ffn_up_.data() + static_cast<std::size_t>(i) * max_ff_, f.gate.rows, hidden);
    const kernels::ActivationQ8* hidden_q = nullptr;
    if (is_quantized(f.down.format) && modes_.ffn_down != ActivationMode::F32) {
      kernels::quantize_activation(hidden, f.gate.rows, f.down.group, hidden_q_[static_cast<std::size_t>(i)],
                                   modes_.ffn_down == ActivationMode::Int8Residual);
      hidden_q = &hidden_q_[static_cast<std::size_t>(i)];
    }
    tasks_[i] = {&f.down, hidden, hidden_q, outs[i]};
  }
  run_matvecs(tasks_.data(), count);
}

Status Session::moe_ffn(std::int32_t l) {
  const LayerWeights& layer = model_->weights().layers[static_cast<std::size_t>(l)];
  const ModelConfig& c = model_->config();
  const MatvecTask router{&layer.router, xn_.data(), quantized_xn(layer.router, modes_.router),
                          router_logits_.data()};
  run_matvecs(&router, 1);
  emit("router_logits", l, router_logits_.data(), c.n_experts);
  // Logits come from finite weights and activations; a failure here means the
  // model produced NaN, which route_top_k reports rather than choosing garbage.
  const RouterSpec spec{c.n_experts, c.top_k, c.norm_topk};
  Status routed = route_top_k(spec, router_logits_, router_, chosen_, chosen_weight_);
  if (!routed.ok()) return routed;

  std::int32_t count = 0;
  for (std::int32_t slot = 0; slot < c.top_k; ++slot, ++count) {
    block_ffns_[static_cast<std::size_t>(count)] = &layer.experts[static_cast<std::size_t>(chosen_[slot])];
    block_outs_[static_cast<std::size_t>(count)] = ffn_out_.data() + static_cast<std::size_t>(count) * c.hidden;
  }
  const bool shared = !layer.shared.gate.empty();
  float gate_logit = 0.0f;
  MatvecTask gate_task;
  if (shared) {
    block_ffns_[static_cast<std::size_t>(count)] = &layer.shared;
    block_outs_[static_cast<std::size_t>(count)] = ffn_out_.data() + static_cast<std::size_t>(count) * c.hidden;
    ++count;
    gate_task = {&layer.shared_expert_gate, xn_.data(), quantized_xn(layer.shared_expert_gate, modes_.router),
                 &gate_logit};
  }
  ffn_blocks(block_ffns_.data(), count, block_outs_.data(), shared ? &gate_task : nullptr);

  std::fill(block_out_.begin(), block_out_.end(), 0.0f);
  for (std::int32_t slot = 0; slot < c.top_k; ++slot) {
    const float* out = block_outs_[static_cast<std::size_t>(slot)];
    for (std::int32_t i = 0; i < c.hidden; ++i) block_out_[i] += chosen_weight_[slot] * out[i];
  }
  if (shared) {
    const float gate = ref::sigmoid(gate_logit);
    const float* out = block_outs_[static_cast<std::size_t>(c.top_k)];
    for (std::int32_t i = 0; i < c.hidden; ++i) block_out_[i] += gate * out[i];
  }
  return Status::Ok();
}

}  // namespace colibri
