// Scalar reference kernels. They define what every faster kernel must compute
// and are the path the f32 forward pass uses today.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/weights.h"

namespace colibri::ref {

// y[r] = sum_c w[r, c] * x[c]
void matvec(const Matrix& w, const float* x, float* y);
float dot(const float* a, const float* b, std::int32_t n);
// out = x / rms(x) * weight; out may alias x.
void rmsnorm(const float* x, const float* weight, std::int32_t n, float eps, float* out);
// Rotary embedding in the "rotate half" layout Hugging Face checkpoints use:
// element i pairs with element i + head_dim/2 within each head. In two parts,
// so a position's angles (which depend on neither the layer nor q or k) are
// computed once: cos[i] and sin[i] of position * theta^(-2i / head_dim) for
// i < head_dim / 2 (in double, rounded once), then the rotation.
void rope_angles(std::int32_t head_dim, std::int32_t position, float theta, float* cos, float* sin);
void rope_rotate_half(float* x, std::int32_t n_heads, std::int32_t head_dim, const float* cos, const float* sin);
// In place, numerically stable.
void softmax(float* x, std::int32_t n);
// Attention over one head of a KV cache whose rows are `stride` elements
// apart (kernels.h): scores[p] = scale * dot(q, key p), and
// out[i] = sum_p weights[p] * value p [i]. An f16 cache (IEEE bit patterns)
// is widened exactly with f16_to_f32 first.
void attention_scores(const float* q, const float* keys, std::size_t stride, std::int32_t n_positions,
                      std::int32_t head_dim, float scale, float* scores);
void attention_scores(const float* q, const std::uint16_t* keys, std::size_t stride, std::int32_t n_positions,
                      std::int32_t head_dim, float scale, float* scores);
void attention_values(const float* weights, const float* values, std::size_t stride, std::int32_t n_positions,
                      std::int32_t head_dim, float* out);
void attention_values(const float* weights, const std::uint16_t* values, std::size_t stride,
                      std::int32_t n_positions, std::int32_t head_dim, float* out);
float silu(float x);
float sigmoid(float x);

}  // namespace colibri::ref
