#include "model/tensor_plan.h"

namespace colibri {
namespace {

std::string tensor_name(std::string_view pattern, std::int32_t layer, std::int32_t expert) {
  std::string out(pattern);
  auto substitute = [&out](std::string_view key, std::int32_t value) {
    for (auto pos = out.find(key); pos != std::string::npos; pos = out.find(key))
      out.replace(pos, key.size(), std::to_string(value));
  };
  if (layer >= 0) substitute("{L}", layer);
  if (expert >= 0) substitute("{E}", expert);
  return out;
}

class Planner {
 public:
  explicit Planner(std::vector<PlannedTensor>& out) : out_(out) {}

  void matrix(Matrix* m, TensorRole role, std::string_view pattern, std::int32_t layer,
              std::int32_t expert, std::int32_t rows, std::int32_t cols) {
    m->rows = rows;
    m->cols = cols;
    PlannedTensor t{tensor_name(pattern, layer, expert), role, layer, expert, rows, cols};
    t.matrix = m;
    out_.push_back(std::move(t));
  }

  void vector(const float** v, TensorRole role, std::string_view pattern, std::int32_t layer,
              std::int32_t size) {
    PlannedTensor t{tensor_name(pattern, layer, -1), role, layer, -1, 1, size};
    t.is_vector = true;
    t.vector = v;
    out_.push_back(std::move(t));
  }

  void ffn(FfnWeights* f, TensorRole role, std::string_view gate, std::string_view up,
           std::string_view down, std::int32_t layer, std::int32_t expert, std::int32_t hidden,
           std::int32_t ff) {
    matrix(&f->gate, role, gate, layer, expert, ff, hidden);
    matrix(&f->up, role, up, layer, expert, ff, hidden);
    matrix(&f->down, role, down, layer, expert, hidden, ff);
  }

 private:
  std::vector<PlannedTensor>& out_;
};

}  // namespace

std::string_view tensor_role_name(TensorRole role) {
  switch (role) {
    case TensorRole::Embedding: return "embedding";
    case TensorRole::LmHead: return "lm_head";
    case TensorRole::Norm: return "norm";
    case TensorRole::Bias: return "bias";
    case TensorRole::Attention: return "attention";
    case TensorRole::Router: return "router";
    case TensorRole::Expert: return "expert";
    case TensorRole::SharedExpert: return "shared_expert";
    case TensorRole::SharedExpertGate: return "shared_expert_gate";
    case TensorRole::DenseFfn: return "dense_ffn";
  }
  return "?";
}

std::vector<PlannedTensor> plan_tensors(const ModelConfig& c, ModelWeights& w, bool tied_lm_head) {
  const HfTensorNames& names = c.arch->tensor_names;
  const std::int32_t q_dim = c.n_heads * c.head_dim;
  const std::int32_t kv_dim = c.n_kv_heads * c.head_dim;
  std::vector<PlannedTensor> out;
  Planner plan(out);

  plan.matrix(&w.embed, TensorRole::Embedding, names.embed, -1, -1, c.vocab, c.hidden);
  if (!tied_lm_head) plan.matrix(&w.lm_head, TensorRole::LmHead, names.lm_head, -1, -1, c.vocab, c.hidden);
  plan.vector(&w.final_norm, TensorRole::Norm, names.final_norm, -1, c.hidden);

  w.layers.assign(static_cast<std::size_t>(c.n_layers), LayerWeights{});
  for (std::int32_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& layer = w.layers[static_cast<std::size_t>(l)];
    plan.vector(&layer.attn_norm, TensorRole::Norm, names.attn_norm, l, c.hidden);
    plan.matrix(&layer.q, TensorRole::Attention, names.q, l, -1, q_dim, c.hidden);
    plan.matrix(&layer.k, TensorRole::Attention, names.k, l, -1, kv_dim, c.hidden);
    plan.matrix(&layer.v, TensorRole::Attention, names.v, l, -1, kv_dim, c.hidden);
    plan.matrix(&layer.o, TensorRole::Attention, names.o, l, -1, c.hidden, q_dim);
    if (c.qkv_bias) {
      plan.vector(&layer.q_bias, TensorRole::Bias, names.q_bias, l, q_dim);
      plan.vector(&layer.k_bias, TensorRole::Bias, names.k_bias, l, kv_dim);
      plan.vector(&layer.v_bias, TensorRole::Bias, names.v_bias, l, kv_dim);
    }
    if (c.arch->qk_norm == QkNorm::PerHead) {
      plan.vector(&layer.q_norm, TensorRole::Norm, names.q_norm, l, c.head_dim);
      plan.vector(&layer.k_norm, TensorRole::Norm, names.k_norm, l, c.head_dim);
    } else if (c.arch->qk_norm == QkNorm::Whole) {
      plan.vector(&layer.q_norm, TensorRole::Norm, names.q_norm, l, q_dim);
      plan.vector(&layer.k_norm, TensorRole::Norm, names.k_norm, l, kv_dim);
    }
    plan.vector(&layer.ffn_norm, TensorRole::Norm, names.ffn_norm, l, c.hidden);
    layer.is_moe = c.layer_is_moe[static_cast<std::size_t>(l)];
    if (!layer.is_moe) {
      plan.ffn(&layer.dense, TensorRole::DenseFfn, names.dense_gate, names.dense_up, names.dense_down, l,
               -1, c.hidden, c.dense_ff);
      continue;
    }
    plan.matrix(&layer.router, TensorRole::Router, names.router, l, -1, c.n_experts, c.hidden);
    if (c.arch->has_shared_expert) {
      plan.ffn(&layer.shared, TensorRole::SharedExpert, names.shared_gate, names.shared_up,
               names.shared_down, l, -1, c.hidden, c.shared_ff);
      plan.matrix(&layer.shared_expert_gate, TensorRole::SharedExpertGate, names.shared_expert_gate, l,
                  -1, 1, c.hidden);
    }
    layer.experts.resize(static_cast<std::size_t>(c.n_experts));
    for (std::int32_t e = 0; e < c.n_experts; ++e)
      plan.ffn(&layer.experts[static_cast<std::size_t>(e)], TensorRole::Expert, names.expert_gate,
               names.expert_up, names.expert_down, l, e, c.hidden, c.expert_ff);
  }
  return out;
}

}  // namespace colibri
