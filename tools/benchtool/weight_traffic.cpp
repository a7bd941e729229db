#include "benchtool/weight_traffic.h"

namespace colibri::benchtool {
namespace {

std::uint64_t matrix_bytes(const Matrix& m) {
  if (m.empty()) return 0;
  const auto layout = weight_layout(m.format, static_cast<std::uint64_t>(m.rows), static_cast<std::uint64_t>(m.cols),
                                    static_cast<std::uint32_t>(m.group));
  return layout ? layout->total_bytes : 0;
}

std::uint64_t ffn_bytes(const FfnWeights& f) { return matrix_bytes(f.gate) + matrix_bytes(f.up) + matrix_bytes(f.down); }

std::uint64_t row_bytes(const Matrix& m) {
  return m.rows > 0 ? matrix_bytes(m) / static_cast<std::uint64_t>(m.rows) : 0;
}

}  // namespace

WeightTraffic decode_step_traffic(const Model& model) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  const std::uint64_t f32 = sizeof(float);
  const std::uint64_t hidden = static_cast<std::uint64_t>(c.hidden);
  const std::uint64_t q_dim = static_cast<std::uint64_t>(c.n_heads) * static_cast<std::uint64_t>(c.head_dim);
  const std::uint64_t kv_dim = static_cast<std::uint64_t>(c.n_kv_heads) * static_cast<std::uint64_t>(c.head_dim);
  WeightTraffic t;
  t.embedding = row_bytes(w.embed);
  t.lm_head = matrix_bytes(w.lm_head) + hidden * f32;
  for (const LayerWeights& layer : w.layers) {
    t.attention += matrix_bytes(layer.q) + matrix_bytes(layer.k) + matrix_bytes(layer.v) + matrix_bytes(layer.o);
    t.attention += 2 * hidden * f32;  // attention and FFN norms
    if (layer.q_bias != nullptr) t.attention += (q_dim + 2 * kv_dim) * f32;
    if (layer.q_norm != nullptr) {
      const bool whole = c.arch->qk_norm == QkNorm::Whole;
      t.attention += (whole ? q_dim + kv_dim : 2 * static_cast<std::uint64_t>(c.head_dim)) * f32;
    }
    if (layer.is_moe) {
      t.router += matrix_bytes(layer.router) + matrix_bytes(layer.shared_expert_gate);
      // Experts of one layer share a shape and format: the first one stands for any top_k.
      if (!layer.experts.empty()) t.experts += static_cast<std::uint64_t>(c.top_k) * ffn_bytes(layer.experts.front());
      t.experts += ffn_bytes(layer.shared);
    } else {
      t.experts += ffn_bytes(layer.dense);
    }
  }
  return t;
}

}  // namespace colibri::benchtool
