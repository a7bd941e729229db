// The fast kernels the forward pass runs. Every function here forwards to the
// implementation that kernels/dispatch.h selected for this CPU (scalar, AVX2,
// AVX-512 or NEON); kernels/reference.h stays the definition of what each must
// compute. All functions are safe to call from several threads at once on
// disjoint outputs, and none allocates (quantize_activation only grows its
// output's buffers up to the largest size it has seen; reserve() up front).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/activation_planes.h"
#include "model/weights.h"

namespace colibri::kernels {

// One input vector quantized to int8 in groups, symmetric like Q8 weights:
// x[c] ~ scales[c / group] * q[c], q in [-127, 127] (never -128, so the
// integer kernels may negate it). Matrix-vector products with Q8/Q4 weights of
// the same group size then run on integer dot products.
//
// With `residual`, a second int8 plane quantizes what the first one missed,
// x[c] - scales * q[c], at exactly 1/kResidualRatio of the first plane's
// scale (codes within [-kResidualLimit, kResidualLimit], the residual being at
// most half a step): x[c] ~ scales * q[c] + residual_scales * residual_q[c].
// The fixed power-of-two ratio lets the Q8R16 kernels add the two planes'
// integer dots before one scale step (kernels_scalar.cpp). The
// kernels then take two integer dot products per weight load, and the
// activation error drops by about 130x, to near the f32 result, for about
// half again the arithmetic (the weights, which bound the speed, are read once).
struct ActivationQ8 {
  std::int32_t n = 0;
  std::int32_t group = 0;
  bool residual = false;
  // Natural order; zero from n up to the end of the buffer (a multiple of 128).
  std::vector<std::int8_t> q;
  // The same values rearranged for the Q4 kernels: for each complete 128-column
  // block, its 64 even columns, then its 64 odd columns. This is the order the
  // low and high nibbles of 64 packed bytes come out in, so the kernels never
  // have to interleave nibbles. Columns past the last complete block are only
  // in `q`.
  std::vector<std::int8_t> q4;
  std::vector<float> scales;         // [ceil(n / group)]
  std::vector<std::int32_t> sums;    // [ceil(n / group)]: sum of q over the group
  // The residual plane, laid out like the above; empty unless `residual`.
  std::vector<std::int8_t> residual_q;
  std::vector<std::int8_t> residual_q4;
  std::vector<float> residual_scales;
  std::vector<std::int32_t> residual_sums;
  std::vector<float> residual_x;  // working space: x minus its first plane

  // Sizes the buffers (both planes) for vectors up to max_n long with groups
  // of at least min_group, so later quantize_activation calls never allocate.
  void reserve(std::int32_t max_n, std::int32_t min_group);
};

// Quantizes x[0..n) with one scale per `group` values (group >= 1; a group
// larger than n means one scale for the whole vector), with the residual
// plane when asked.
void quantize_activation(const float* x, std::int32_t n, std::int32_t group, ActivationQ8& out,
                         bool residual = false);

// True when matvec(w, x, xq, ...) multiplies int8 activations: w is Q8 or Q4
// and xq was quantized with w's group size. Otherwise matvec reads x (f32).
bool uses_int8_activations(const Matrix& w, const ActivationQ8* xq);

// y[r] = sum_c w[r, c] * x[c] for r in [row_begin, row_end); other entries of
// y are not touched, so threads may share y with disjoint row ranges. A row's
// result depends only on the row, never on the range it was computed in.
// xq (may be null) is the quantized x; it is used as uses_int8_activations says.
void matvec(const Matrix& w, const float* x, const ActivationQ8* xq, float* y,
            std::int32_t row_begin, std::int32_t row_end);
inline void matvec(const Matrix& w, const float* x, const ActivationQ8* xq, float* y) {
  matvec(w, x, xq, y, 0, w.rows);
}

// The product of one matrix with n vectors, for prefill and batched decode:
// y[v][r] = sum_c w[r, c] * x[v][c] for v in [0, n), r in [row_begin, row_end).
// Each weight row is read once for all n vectors, and every y[v][r] is
// bit-identical to what matvec(w, x[v], xq[v], y[v], ...) writes, so a token's
// logits do not depend on what it was batched with. xq (may be null) holds n
// pointers, used per vector as uses_int8_activations says; the vectors of one
// call should all use int8 activations or all not (mixing is correct, slower).
// n may be any size; up to kMatmatChunk vectors go through the weights together.
inline constexpr std::int32_t kMatmatChunk = 64;
void matmat(const Matrix& w, std::int32_t n, const float* const* x, const ActivationQ8* const* xq,
            float* const* y, std::int32_t row_begin, std::int32_t row_end);

float dot(const float* a, const float* b, std::int32_t n);
// out = x / rms(x) * weight; out may alias x.
void rmsnorm(const float* x, const float* weight, std::int32_t n, float eps, float* out);
// In place, numerically stable.
void softmax(float* x, std::int32_t n);
// out[i] = silu(gate[i]) * up[i]; out may alias gate or up.
void swiglu(const float* gate, const float* up, std::int32_t n, float* out);

// Attention over a KV cache whose rows are `stride` floats apart:
// scores[p] = scale * dot(q, keys + p * stride, head_dim) for p in [0, n_positions).
void attention_scores(const float* q, const float* keys, std::size_t stride, std::int32_t n_positions,
                      std::int32_t head_dim, float scale, float* scores);
// out[i] = sum_p weights[p] * values[p * stride + i] for i in [0, head_dim).
void attention_values(const float* weights, const float* values, std::size_t stride,
                      std::int32_t n_positions, std::int32_t head_dim, float* out);

// The same over a KV cache stored as IEEE f16 (bit patterns; `stride` is in
// elements), for half the cache's memory and of the bytes read per position:
// every key and value is widened to f32 exactly, in registers, and then
// summed as in the f32 kernels (on x86 by the same code).
void attention_scores_f16(const float* q, const std::uint16_t* keys, std::size_t stride,
                          std::int32_t n_positions, std::int32_t head_dim, float scale, float* scores);
void attention_values_f16(const float* weights, const std::uint16_t* values, std::size_t stride,
                          std::int32_t n_positions, std::int32_t head_dim, float* out);
// out[i] = x[i] as f16, rounded to nearest even (core/dtype.h f32_to_f16):
// how K and V rows enter an f16 cache. Every path gives f32_to_f16's bits
// (NaN payloads aside), so a cache's contents do not depend on the path.
void convert_f32_to_f16(const float* x, std::int32_t n, std::uint16_t* out);

}  // namespace colibri::kernels
