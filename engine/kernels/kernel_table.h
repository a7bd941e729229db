// Internal: the table of kernel entry points one instruction-set path
// provides. Each path's source file exports exactly one function returning its
// table; everything else in those files has internal linkage. That matters:
// an inline function or template instantiated in a file compiled with -mavx512f
// would be a weak symbol the linker could pick for callers everywhere, putting
// AVX-512 instructions on the scalar path. So path files use only plain structs
// (no std::vector, no inline library templates) and receive raw pointers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/activation_planes.h"
#include "kernels/dispatch.h"
#include "model/weights.h"

namespace colibri::kernels {

// The smallest group maximum quantize_activation divides 127 by: below it the
// inverse overflows to infinity and values would come out as -127 whatever
// their sign. Such a group, and a NaN value, quantize to 0 in every path (NaN
// is also left out of the group's maximum).
constexpr float kSmallestActivationAmax = 1e-36f;

// Q8R16 products with the residual plane and groups up to this size combine
// the two planes' exact dots in int32, kResidualRatio x dot + lo (at most
// group x 127 x (127 x 128 + 64) < 2^31), and take one scale step with the
// residual scale instead of one per plane. Larger groups keep two steps.
constexpr std::int32_t kQ8R16CombinedMaxGroup = 1024;

// Read-only view of an ActivationQ8 (kernels.h) without its std::vectors.
// The residual plane's pointers are null when it is absent.
struct ActivationView {
  const std::int8_t* q = nullptr;
  const std::int8_t* q4 = nullptr;
  const float* scales = nullptr;
  const std::int32_t* sums = nullptr;
  std::int32_t n = 0;
  std::int32_t group = 0;
  const std::int8_t* residual_q = nullptr;
  const std::int8_t* residual_q4 = nullptr;
  const float* residual_scales = nullptr;
  const std::int32_t* residual_sums = nullptr;
};

struct KernelTable {
  Isa isa = Isa::Scalar;
  // Writes q (natural order, padded with zeros to a multiple of 128), q4 (see
  // ActivationQ8), scales and sums. Every path must produce identical bytes.
  // With `residual` non-null, it gets what the plane missed, x - scales * q
  // (a multiply, then a subtract: no fused rounding), for quantize_residual.
  void (*quantize_activation)(const float* x, std::int32_t n, std::int32_t group, std::int8_t* q,
                              std::int8_t* q4, float* scales, std::int32_t* sums, float* residual);
  // The residual plane of r (what quantize_activation's first plane missed):
  // scale = first_scales[g] / kResidualRatio, codes r * inverse with inverse
  // = 1 / scale (0 when scale < FLT_MIN), held to [-kResidualLimit,
  // kResidualLimit], then rounded to nearest even (NaN gives 0), with
  // quantize_activation's padding and q4 order. Every path must produce
  // identical bytes.
  void (*quantize_residual)(const float* r, std::int32_t n, std::int32_t group, const float* first_scales,
                            std::int8_t* q, std::int8_t* q4, float* scales, std::int32_t* sums);
  // xq is null unless w is Q8/Q4 with xq->group == w.group.
  void (*matvec)(const Matrix& w, const float* x, const ActivationView* xq, float* y,
                 std::int32_t row_begin, std::int32_t row_end);
  // Several vectors through one matrix, reading each weight row once for all
  // of them (kernels.h matmat). xq is null, or n views each usable with w as
  // for matvec. Null in a path's table: dispatch runs matvec per vector.
  void (*matmat)(const Matrix& w, std::int32_t n, const float* const* x, const ActivationView* const* xq,
                 float* const* y, std::int32_t row_begin, std::int32_t row_end);
  float (*dot)(const float* a, const float* b, std::int32_t n);
  void (*rmsnorm)(const float* x, const float* weight, std::int32_t n, float eps, float* out);
  void (*softmax)(float* x, std::int32_t n);
  void (*swiglu)(const float* gate, const float* up, std::int32_t n, float* out);
  void (*attention_scores)(const float* q, const float* keys, std::size_t stride,
                           std::int32_t n_positions, std::int32_t head_dim, float scale, float* scores);
  void (*attention_values)(const float* weights, const float* values, std::size_t stride,
                           std::int32_t n_positions, std::int32_t head_dim, float* out);
  void (*attention_scores_f16)(const float* q, const std::uint16_t* keys, std::size_t stride,
                               std::int32_t n_positions, std::int32_t head_dim, float scale, float* scores);
  void (*attention_values_f16)(const float* weights, const std::uint16_t* values, std::size_t stride,
                               std::int32_t n_positions, std::int32_t head_dim, float* out);
  void (*convert_f32_to_f16)(const float* x, std::int32_t n, std::uint16_t* out);
  // What a lone vector's Q8R16 stream prefetches here ("none", "near",
  // "pair"; dispatch.h stream_prefetch()). Null on paths without that choice.
  const char* (*stream_prefetch)();
};

// Defined by kernels_scalar.cpp (always), kernels_avx2.cpp / kernels_avx512.cpp
// / kernels_amx.cpp (x86-64 builds) and kernels_neon.cpp (aarch64 builds).
const KernelTable* scalar_kernel_table();
const KernelTable* avx2_kernel_table();
const KernelTable* avx512_kernel_table();
// AMX's table holds only isa and matmat (the rest is AVX-512's): dispatch.cpp
// completes it.
const KernelTable* amx_kernel_table();
const KernelTable* neon_kernel_table();

}  // namespace colibri::kernels
