// Views of a model's weights in the layout the forward pass reads. All shapes
// are in Hugging Face orientation: a Matrix of [rows, cols] maps a cols-vector
// to a rows-vector (y = W x).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/weight_format.h"

namespace colibri {

struct Matrix {
  const void* data = nullptr;  // values plane: [rows, cols] row-major in `format`
  std::int32_t rows = 0;
  std::int32_t cols = 0;
  WeightFormat format = WeightFormat::F32;
  std::int32_t group = 0;          // quantized formats: values per scale along a row
  const float* scales = nullptr;   // Q8/Q4: [rows, ceil(cols / group)]
  const float* mins = nullptr;     // Q4: [rows, ceil(cols / group)]
  // Q4R16's scales and minimums: IEEE f16 bit patterns in Q8R16's scale order
  // (weight_format.h); `scales` and `mins` stay null for Q4R16.
  const std::uint16_t* half_scales = nullptr;
  const std::uint16_t* half_mins = nullptr;
  bool empty() const { return data == nullptr; }
  const float* f32() const { return static_cast<const float*>(data); }
};

// A SwiGLU feed-forward block: down(silu(gate x) * up x).
struct FfnWeights {
  Matrix gate;  // [ff, hidden]
  Matrix up;    // [ff, hidden]
  Matrix down;  // [hidden, ff]
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // [hidden]
  Matrix q;                          // [n_heads * head_dim, hidden]
  Matrix k;                          // [n_kv_heads * head_dim, hidden]
  Matrix v;                          // [n_kv_heads * head_dim, hidden]
  Matrix o;                          // [hidden, n_heads * head_dim]
  const float* q_bias = nullptr;     // [n_heads * head_dim] where the family has biases
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const float* q_norm = nullptr;     // [head_dim] (per head) or [n_heads * head_dim] (whole)
  const float* k_norm = nullptr;
  const float* ffn_norm = nullptr;   // [hidden]

  bool is_moe = true;
  Matrix router;                     // [n_experts, hidden]
  std::vector<FfnWeights> experts;   // n_experts
  FfnWeights shared;                 // shared expert, where the family has one
  Matrix shared_expert_gate;         // [1, hidden]
  FfnWeights dense;                  // FFN of a non-MoE layer
};

struct ModelWeights {
  Matrix embed;                      // [vocab, hidden]
  Matrix lm_head;                    // [vocab, hidden] (the embedding when tied)
  const float* final_norm = nullptr; // [hidden]
  std::vector<LayerWeights> layers;
};

}  // namespace colibri
