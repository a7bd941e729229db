// Scalar reference kernels. They define what every faster kernel must compute
// and are the path the f32 forward pass uses today.
#pragma once

#include <cstdint>

#include "model/weights.h"

namespace colibri::ref {

// y[r] = sum_c w[r, c] * x[c]
void matvec(const Matrix& w, const float* x, float* y);
float dot(const float* a, const float* b, std::int32_t n);
// out = x / rms(x) * weight; out may alias x.
void rmsnorm(const float* x, const float* weight, std::int32_t n, float eps, float* out);
// Rotary embedding in the "rotate half" layout Hugging Face checkpoints use:
// element i pairs with element i + head_dim/2 within each head.
void rope_rotate_half(float* x, std::int32_t n_heads, std::int32_t head_dim, std::int32_t position,
                      float theta);
// In place, numerically stable.
void softmax(float* x, std::int32_t n);
float silu(float x);
float sigmoid(float x);

}  // namespace colibri::ref
