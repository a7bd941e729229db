// The AVX-512 path (F, BW, VL, VNNI; compiled with those flags, see
// engine/CMakeLists.txt). Only reached through the dispatch table after the
// CPU was checked. Everything here has internal linkage; see kernel_table.h.
//
// Matrix-vector products process 4 rows at a time, sharing each activation
// load across them, with exactly the same instruction sequence per row as the
// 1-row remainder: a row's result never depends on which rows it was batched
// with, so any split of rows across threads gives bit-identical outputs.
#if defined(__x86_64__)

// GCC 12's _mm512_reduce_* expand _mm512_undefined_*() and then warn about
// it (a known false positive); nothing of ours is left uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "kernels/kernel_table.h"

namespace colibri::kernels {
namespace {

using std::int32_t;
using std::size_t;

constexpr int kRowBlock = 4;

__mmask16 mask16(size_t len) { return len >= 16 ? __mmask16(0xffff) : __mmask16((1u << len) - 1u); }
__mmask64 mask64(size_t len) { return len >= 64 ? ~__mmask64(0) : __mmask64((1ull << len) - 1ull); }
size_t min_size(size_t a, size_t b) { return a < b ? a : b; }
// Not std::min / std::gcd: their instantiations here would be weak symbols
// compiled for AVX-512 that the linker may pick everywhere (kernel_table.h).
int32_t min_int(int32_t a, int32_t b) { return a < b ? a : b; }
int32_t gcd_int(int32_t a, int32_t b) {
  while (b != 0) {
    const int32_t r = a % b;
    a = b;
    b = r;
  }
  return a;
}
int32_t group_count(int32_t cols, int32_t group) { return (cols + group - 1) / group; }

// Rows are consecutive in memory, so 4 rows read at once are 4 streams a
// few KB long each: too short for the hardware prefetcher to ramp up. Asking
// for the same offset one block of rows ahead keeps DRAM busy (+20-25% on
// DRAM-resident Q8 matrices). A prefetch past the end is harmless.
inline void prefetch_next_block(const void* row, size_t offset, size_t row_bytes) {
  _mm_prefetch(static_cast<const char*>(row) + offset + kRowBlock * row_bytes, _MM_HINT_T0);
}

// Runs kernel.template operator()<NR>(row) over [begin, end) in blocks of 4.
template <class Kernel>
void for_row_blocks(int32_t begin, int32_t end, const Kernel& kernel) {
  int32_t r = begin;
  for (; r + kRowBlock <= end; r += kRowBlock) kernel.template operator()<kRowBlock>(r);
  for (; r < end; ++r) kernel.template operator()<1>(r);
}

// ---- f32 / f16 / bf16 weights, f32 activations --------------------------------

// Loads 16 weights (fewer under `m`, the rest zero) as f32.
template <WeightFormat F>
__m512 load_weights16(const void* row, size_t c, __mmask16 m) {
  if constexpr (F == WeightFormat::F32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(row) + c);
  } else {
    const __m256i half = _mm256_maskz_loadu_epi16(m, static_cast<const std::uint16_t*>(row) + c);
    if constexpr (F == WeightFormat::F16) return _mm512_cvtph_ps(half);
    // bf16 is the top half of an f32: widen and shift, exact.
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
  }
}

template <WeightFormat F>
void float_matvec(const Matrix& w, const float* x, float* y, int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t element = F == WeightFormat::F32 ? 4 : 2;
  const auto* base = static_cast<const std::uint8_t*>(w.data);
  for_row_blocks(row_begin, row_end, [&]<int NR>(int32_t r0) {
    const void* rows[NR];
    __m512 acc[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols * element;
      acc[r] = _mm512_setzero_ps();
    }
    for (size_t c = 0; c < cols; c += 16) {
      const __mmask16 m = mask16(cols - c);
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + c);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        prefetch_next_block(rows[r], c * element, cols * element);
        acc[r] = _mm512_fmadd_ps(load_weights16<F>(rows[r], c, m), xv, acc[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) y[r0 + r] = _mm512_reduce_add_ps(acc[r]);
  });
}

// ---- Q8 weights ---------------------------------------------------------------

// int8 activations. vpdpbusd multiplies unsigned by signed bytes; the weights
// are made unsigned by flipping their sign bit (w ^ 0x80 == w + 128), which
// costs one XOR per 64 weights. The extra 128 * sum(x) over the group is
// removed exactly by starting each lane at -8 * sum(x) (16 lanes x 8 = 128).
// A lane gathers 4 products (< 2^17) per 64 columns, so for groups below ~8000
// it stays under 2^24: the conversion to f32 and the group's dot are exact.
// With the residual plane, each weight load feeds a second vpdpbusd.
template <bool Residual>
void q8_int8_matvec(const Matrix& w, const ActivationView& xq, float* y, int32_t row_begin,
                    int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const auto* base = static_cast<const std::int8_t*>(w.data);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for_row_blocks(row_begin, row_end, [&]<int NR>(int32_t r0) {
    const std::int8_t* rows[NR];
    const float* scales[NR];
    __m512 acc[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
      acc[r] = _mm512_setzero_ps();
    }
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
      if ((g & 15) == 0)  // the scale plane is a stream too: a line per 16 groups
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) prefetch_next_block(scales[r], 4 * static_cast<size_t>(g), 4 * static_cast<size_t>(groups));
      const __m512i bias = _mm512_set1_epi32(-8 * xq.sums[g]);
      __m512i dot[NR], lo[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) dot[r] = bias;
      if constexpr (Residual) {
        const __m512i lo_bias = _mm512_set1_epi32(-8 * xq.residual_sums[g]);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) lo[r] = lo_bias;
      }
      size_t c = begin;
      for (; c + 64 <= end; c += 64) {
        const __m512i xv = _mm512_loadu_si512(xq.q + c);
        const __m512i xl = Residual ? _mm512_loadu_si512(xq.residual_q + c) : xv;
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          prefetch_next_block(rows[r], c, cols);
          const __m512i wv = _mm512_xor_si512(_mm512_loadu_si512(rows[r] + c), flip);
          dot[r] = _mm512_dpbusd_epi32(dot[r], wv, xv);
          if constexpr (Residual) lo[r] = _mm512_dpbusd_epi32(lo[r], wv, xl);
        }
      }
      if (c < end) {
        // Masked-off weights read as 0 and flip to 128, but x is 0 there.
        const __mmask64 m = mask64(end - c);
        const __m512i xv = _mm512_maskz_loadu_epi8(m, xq.q + c);
        const __m512i xl = Residual ? _mm512_maskz_loadu_epi8(m, xq.residual_q + c) : xv;
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          const __m512i wv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, rows[r] + c), flip);
          dot[r] = _mm512_dpbusd_epi32(dot[r], wv, xv);
          if constexpr (Residual) lo[r] = _mm512_dpbusd_epi32(lo[r], wv, xl);
        }
      }
      const float x_scale = xq.scales[g];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_set1_ps(scales[r][g] * x_scale), acc[r]);
        if constexpr (Residual)
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo[r]), _mm512_set1_ps(scales[r][g] * xq.residual_scales[g]),
                                   acc[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) y[r0 + r] = _mm512_reduce_add_ps(acc[r]);
  });
}

// f32 activations: widen 16 int8 weights to f32 per step.
void q8_f32_matvec(const Matrix& w, const float* x, float* y, int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const auto* base = static_cast<const std::int8_t*>(w.data);
  for_row_blocks(row_begin, row_end, [&]<int NR>(int32_t r0) {
    const std::int8_t* rows[NR];
    const float* scales[NR];
    __m512 acc[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
      acc[r] = _mm512_setzero_ps();
    }
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
      __m512 partial[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) partial[r] = _mm512_setzero_ps();
      for (size_t c = begin; c < end; c += 16) {
        const __mmask16 m = mask16(end - c);
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + c);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          const __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, rows[r] + c)));
          partial[r] = _mm512_fmadd_ps(wv, xv, partial[r]);
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[r] = _mm512_fmadd_ps(partial[r], _mm512_set1_ps(scales[r][g]), acc[r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) y[r0 + r] = _mm512_reduce_add_ps(acc[r]);
  });
}

// ---- Q4 weights ---------------------------------------------------------------

// int8 activations, for groups of 32, 64 or a multiple of 128 (so no group
// straddles a 128-column block). 64 packed bytes hold 128 columns; their low
// nibbles are the even columns and their high nibbles the odd ones, in the
// order of ActivationQ8::q4, so one vpdpbusd each (codes 0..15 are already
// unsigned) gives 16 lanes where lane j covers columns [8j, 8j + 8) of the
// block. A per-block permute spreads the 1, 2 or 4 group scales over the
// lanes. Columns after the last complete block are added by scalar code. The
// min term, sum_g min_g * x_scale_g * sum(q_g), is one dot product over groups.
bool q4_int8_supported(int32_t group) { return group == 32 || group == 64 || group % 128 == 0; }

// What a Q4 row adds after its complete 128-column blocks: the asymmetric
// minimum term (summed across lanes) and the columns past the last complete
// block. matvec and matmat both finish every row here, so they run the same
// operations in the same order and stay bit-identical.
struct Q4RowEnd {
  float tail;
  float mins;
};

template <bool Residual>
Q4RowEnd q4_row_end(const std::uint8_t* row, const float* row_scales, const float* mins, const ActivationView& a,
                    int32_t groups, size_t group, size_t cols, size_t blocks) {
  __m512 min_acc = _mm512_setzero_ps();
  for (int32_t g = 0; g < groups; g += 16) {
    const __mmask16 m = mask16(static_cast<size_t>(groups - g));
    const __m512 group_mins = _mm512_maskz_loadu_ps(m, mins + g);
    const __m512 x_sum = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a.scales + g),
                                       _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(m, a.sums + g)));
    min_acc = _mm512_fmadd_ps(group_mins, x_sum, min_acc);
    if constexpr (Residual) {
      const __m512 r_sum = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a.residual_scales + g),
                                         _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(m, a.residual_sums + g)));
      min_acc = _mm512_fmadd_ps(group_mins, r_sum, min_acc);
    }
  }
  float tail = 0.0f;
  for (size_t c = blocks * 128; c < cols;) {
    const size_t g = c / group, end = min_size(cols, (g + 1) * group);
    int32_t dot = 0, dot_r = 0;
    for (; c < end; ++c) {
      const int code = (c % 2 == 0) ? (row[c / 2] & 0x0f) : (row[c / 2] >> 4);
      dot += code * a.q[c];
      if constexpr (Residual) dot_r += code * a.residual_q[c];
    }
    tail += row_scales[g] * a.scales[g] * static_cast<float>(dot);
    if constexpr (Residual) tail += row_scales[g] * a.residual_scales[g] * static_cast<float>(dot_r);
  }
  return {tail, _mm512_reduce_add_ps(min_acc)};
}

template <bool Residual>
void q4_int8_matvec(const Matrix& w, const ActivationView& xq, float* y, int32_t row_begin,
                    int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const size_t row_bytes = (cols + 1) / 2;
  const size_t blocks = cols / 128;
  const auto* base = static_cast<const std::uint8_t*>(w.data);
  const int32_t per_block = group >= 128 ? 1 : static_cast<int32_t>(128 / group);
  const __mmask8 scale_mask = static_cast<__mmask8>((1u << per_block) - 1u);
  alignas(64) int32_t lane_group[16];
  for (int j = 0; j < 16; ++j) lane_group[j] = group >= 128 ? 0 : static_cast<int32_t>(8 * j / group);
  const __m512i spread = _mm512_load_si512(lane_group);
  const __m512i low4 = _mm512_set1_epi8(0x0f);

  for_row_blocks(row_begin, row_end, [&]<int NR>(int32_t r0) {
    const std::uint8_t* rows[NR];
    const float* scales[NR];
    __m512 acc[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * row_bytes;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
      acc[r] = _mm512_setzero_ps();
    }
    for (size_t b = 0; b < blocks; ++b) {
      const size_t g0 = 128 * b / group;
      const __m512i x_even = _mm512_loadu_si512(xq.q4 + 128 * b);
      const __m512i x_odd = _mm512_loadu_si512(xq.q4 + 128 * b + 64);
      const __m128 x_scales = _mm_maskz_loadu_ps(scale_mask, xq.scales + g0);
      __m512i r_even = x_even, r_odd = x_odd;
      __m128 r_scales = x_scales;
      if constexpr (Residual) {
        r_even = _mm512_loadu_si512(xq.residual_q4 + 128 * b);
        r_odd = _mm512_loadu_si512(xq.residual_q4 + 128 * b + 64);
        r_scales = _mm_maskz_loadu_ps(scale_mask, xq.residual_scales + g0);
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        prefetch_next_block(rows[r], 64 * b, row_bytes);
        if ((b & 3) == 0) {  // the scale and min planes are streams too: a line per 4 blocks
          prefetch_next_block(scales[r], 4 * g0, 4 * static_cast<size_t>(groups));
          prefetch_next_block(w.mins + (static_cast<size_t>(r0) + r) * groups, 4 * g0, 4 * static_cast<size_t>(groups));
        }
        const __m512i packed = _mm512_loadu_si512(rows[r] + 64 * b);
        const __m512i lo = _mm512_and_si512(packed, low4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
        const __m512i dot =
            _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, x_even), hi, x_odd);
        const __m128 w_scales = _mm_maskz_loadu_ps(scale_mask, scales[r] + g0);
        const __m128 s = _mm_mul_ps(w_scales, x_scales);
        const __m512 lane_scales = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(s));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), lane_scales, acc[r]);
        if constexpr (Residual) {
          const __m512i dot_r =
              _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, r_even), hi, r_odd);
          const __m128 sr = _mm_mul_ps(w_scales, r_scales);
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_r), _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(sr)),
                                   acc[r]);
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const Q4RowEnd end = q4_row_end<Residual>(rows[r], scales[r], w.mins + (static_cast<size_t>(r0) + r) * groups,
                                                xq, groups, group, cols, blocks);
      y[r0 + r] = _mm512_reduce_add_ps(acc[r]) + end.tail + end.mins;
    }
  });
}

// f32 activations, even group sizes (a group then starts on a byte). 16
// packed bytes give 32 codes, interleaved back into column order.
void q4_f32_matvec(const Matrix& w, const float* x, float* y, int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const size_t row_bytes = (cols + 1) / 2;
  const auto* base = static_cast<const std::uint8_t*>(w.data);
  const __m128i low4 = _mm_set1_epi8(0x0f);
  for_row_blocks(row_begin, row_end, [&]<int NR>(int32_t r0) {
    const std::uint8_t* rows[NR];
    const float* scales[NR];
    const float* mins[NR];
    __m512 acc[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * row_bytes;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
      mins[r] = w.mins + (static_cast<size_t>(r0) + r) * groups;
      acc[r] = _mm512_setzero_ps();
    }
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
      __m512 partial[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) partial[r] = _mm512_setzero_ps();
      __m512 x_sum = _mm512_setzero_ps();
      for (size_t c = begin; c < end; c += 32) {
        const size_t len = min_size(32, end - c);
        const __mmask16 byte_mask = mask16((len + 1) / 2);
        const __mmask16 m0 = mask16(len), m1 = mask16(len > 16 ? len - 16 : 0);
        const __m512 x0 = _mm512_maskz_loadu_ps(m0, x + c);
        const __m512 x1 = _mm512_maskz_loadu_ps(m1, x + c + 16);
        x_sum = _mm512_add_ps(x_sum, _mm512_add_ps(x0, x1));
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          const __m128i packed = _mm_maskz_loadu_epi8(byte_mask, rows[r] + c / 2);
          const __m128i lo = _mm_and_si128(packed, low4);
          const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low4);
          const __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
          const __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
          partial[r] = _mm512_fmadd_ps(w1, x1, _mm512_fmadd_ps(w0, x0, partial[r]));
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        acc[r] = _mm512_fmadd_ps(partial[r], _mm512_set1_ps(scales[r][g]), acc[r]);
        acc[r] = _mm512_fmadd_ps(x_sum, _mm512_set1_ps(mins[r][g]), acc[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) y[r0 + r] = _mm512_reduce_add_ps(acc[r]);
  });
}

// ---- Q8R16: 16 rows interleaved, one row per lane ------------------------------
//
// A 64-byte load holds 4 columns of 16 rows, so one vpdpbusd with the
// vector's 4 activations broadcast advances all 16 rows, each in its own int32
// lane: no horizontal sums, and the per-group conversion and FMA are paid once
// per 16 rows instead of once per row. Each lane runs exactly the portable
// definition (kernels_scalar.cpp): exact int32 dot per group, then
// fma(float(dot), w_scale * x_scale, acc). The weights are flipped to
// unsigned as in q8_int8_matvec; the lane then holds dot + 128 * sum(x), so
// it starts at -128 * sum(x). Activation buffers are zero past n (to a
// multiple of 128), so a last 4-column chunk reads zeros where the weights
// are padding. A block of 16 x 2048 weights is 32 KB: tiles of vectors go
// through it from L1/L2 while it is streamed from memory once.

constexpr size_t kQ8R16Prefetch = 4096;  // bytes ahead in the block stream (best of 1-8 KB measured)
constexpr size_t kQ8R16L2Prefetch = 4 * kQ8R16Prefetch;  // into L2 (2x, 4x, 8x measured: 4x best)
// A lone vector's lead on Zen 5 (StreamPrefetch::Near): 2 and 3 KB measured
// alike, 4 KB a little behind, 1 KB and 0.5 KB well behind.
constexpr size_t kQ8R16NearPrefetch = 2048;

// What a Q8R16 stream prefetches in software, one line per 64-byte chunk.
// The best choice for a lone vector differs between CPUs (measured; see
// lone_vector_prefetch()); with 2-4 vectors it is always Pair.
enum class StreamPrefetch {
  None,  // the hardware prefetchers alone
  Near,  // into L1, kQ8R16NearPrefetch ahead
  Pair,  // into L1 kQ8R16Prefetch ahead and into L2 kQ8R16L2Prefetch ahead
};

// acc += dpbusd(w, the 4 bytes at x broadcast), in place. As an intrinsic,
// GCC 12 copies every accumulator through a second register around each
// vpdpbusd (two moves per multiply) and broadcasts separately; this is one
// instruction with an embedded broadcast operand.
inline void dpbusd_broadcast(__m512i& acc, __m512i w, const std::int8_t* x) {
  asm("vpdpbusd %[x]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [x] "m"(*reinterpret_cast<const int32_t*>(x)));
}

// acc += dpbusd(w, x), all in registers (x: 4 activation bytes already in every lane).
inline void dpbusd_registers(__m512i& acc, __m512i w, __m512i x) {
  asm("vpdpbusd %[x], %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [x] "v"(x));
}

// The two planes' step for groups up to kQ8R16CombinedMaxGroup
// (kernels_scalar.cpp): their dots added exactly in int32, one scale step.
inline __m512 q8r16_combined_step(__m512 acc, __m512i dot, __m512i lo, __m512 w_scales, float residual_scale) {
  static_assert(kResidualRatio == 1 << 7);
  const __m512i both = _mm512_add_epi32(_mm512_slli_epi32(dot, 7), lo);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(both), _mm512_mul_ps(w_scales, _mm512_set1_ps(residual_scale)), acc);
}

// acc[k * NV + v] for S blocks of 16 rows (block k at values[k], its scales
// at block_scales[k]) and NV vectors with int8 activations. S > 1 reads S
// blocks side by side: a matrix-vector product then streams S distant parts
// of the matrix at once, as the read test does (one stream per thread reads
// at about 60 % of four).
// noinline: inlined into the callers' nested lambdas, GCC 12 kept the dot
// accumulators in memory and ran the kernel 3-4x slower (measured).
template <bool Residual, int NV, int S = 1, StreamPrefetch Prefetch = (NV > 1 ? StreamPrefetch::Pair : StreamPrefetch::None)>
__attribute__((noinline)) void q8r16_int8_block(const std::int8_t* const* values_in, const float* const* scales_in, size_t cols, size_t group,
                      int32_t groups, const ActivationView* const* xs, __m512* acc_out) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  // Local copies: written through the output pointer every group, the
  // accumulators (and the block pointers, which it might alias) would live
  // in memory; as locals they stay in registers (3x, measured).
  const std::int8_t* values[S];
  const float* block_scales[S];
#pragma GCC unroll 4
  for (int k = 0; k < S; ++k) {
    values[k] = values_in[k];
    block_scales[k] = scales_in[k];
  }
  __m512 acc[S * NV];
#pragma GCC unroll 8
  for (int i = 0; i < S * NV; ++i) acc[i] = _mm512_setzero_ps();
  const bool combined = group <= static_cast<size_t>(kQ8R16CombinedMaxGroup);
  for (int32_t g = 0; g < groups; ++g) {
    const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
    __m512i dot[S * NV], lo[S * NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
#pragma GCC unroll 4
      for (int k = 0; k < S; ++k) {
        dot[k * NV + v] = _mm512_set1_epi32(-128 * xs[v]->sums[g]);
        if constexpr (Residual) lo[k * NV + v] = _mm512_set1_epi32(-128 * xs[v]->residual_sums[g]);
      }
#pragma GCC unroll 4
    for (int k = 0; k < S; ++k)
      _mm_prefetch(reinterpret_cast<const char*>(block_scales[k] + (static_cast<size_t>(g) + 8) * kQ8R16Rows),
                   _MM_HINT_T0);
    for (size_t c = begin; c < end; c += 4) {
      // With several blocks each vector's 4 bytes are broadcast once into a
      // register for all S blocks: from memory, every vpdpbusd loads them
      // again. Two planes, one core, cache-resident (matmat benchmark, two
      // interleaved runs): n = 2 / 3 / 4 at 1.08-1.11x / 1.12-1.16x /
      // 1.30-1.32x the rate with broadcasts from memory; n = 1 (session 28,
      // Zen 5, four runs) 1.20-1.24x with two planes, alike with one.
      constexpr bool kBroadcastOnce = S > 1;
      __m512i xb[NV], rb[NV];
      if constexpr (kBroadcastOnce) {
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
          xb[v] = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(xs[v]->q + c));
          if constexpr (Residual) rb[v] = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(xs[v]->residual_q + c));
        }
      }
#pragma GCC unroll 4
      for (int k = 0; k < S; ++k) {
        const std::int8_t* chunk = values[k] + c * kQ8R16Rows;
        if constexpr (Prefetch == StreamPrefetch::Pair) {
          _mm_prefetch(reinterpret_cast<const char*>(chunk) + kQ8R16Prefetch, _MM_HINT_T0);
          // With 2-4 vectors (a batched decode step's experts) the arithmetic per
          // line is long enough that the 4 KB lead no longer hides DRAM: a second
          // fetch into L2 four leads ahead keeps more lines in flight (16 sessions,
          // colibri-batch-bench: 1.29x; docs/KERNELS.md).
          _mm_prefetch(reinterpret_cast<const char*>(chunk) + kQ8R16L2Prefetch, _MM_HINT_T1);
        } else if constexpr (Prefetch == StreamPrefetch::Near) {
          _mm_prefetch(reinterpret_cast<const char*>(chunk) + kQ8R16NearPrefetch, _MM_HINT_T0);
        }
        const __m512i wv = _mm512_xor_si512(_mm512_loadu_si512(chunk), flip);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
          if constexpr (kBroadcastOnce) {
            dpbusd_registers(dot[k * NV + v], wv, xb[v]);
            if constexpr (Residual) dpbusd_registers(lo[k * NV + v], wv, rb[v]);
          } else {
            dpbusd_broadcast(dot[k * NV + v], wv, xs[v]->q + c);
            if constexpr (Residual) dpbusd_broadcast(lo[k * NV + v], wv, xs[v]->residual_q + c);
          }
        }
      }
    }
#pragma GCC unroll 4
    for (int k = 0; k < S; ++k) {
      const __m512 w_scales = _mm512_loadu_ps(block_scales[k] + static_cast<size_t>(g) * kQ8R16Rows);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        __m512& a = acc[k * NV + v];
        if constexpr (Residual)
          if (combined) {
            a = q8r16_combined_step(a, dot[k * NV + v], lo[k * NV + v], w_scales, xs[v]->residual_scales[g]);
            continue;
          }
        a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[k * NV + v]), _mm512_mul_ps(w_scales, _mm512_set1_ps(xs[v]->scales[g])),
                            a);
        if constexpr (Residual)
          a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo[k * NV + v]),
                              _mm512_mul_ps(w_scales, _mm512_set1_ps(xs[v]->residual_scales[g])), a);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < S * NV; ++i) acc_out[i] = acc[i];
}

// f32 activations: per column, the byte of each row's dword, sign-extended in
// place, converted and multiplied in column order, as the definition does.
template <int NV>
void q8r16_f32_block(const std::int8_t* values, const float* block_scales, size_t cols, size_t group,
                     int32_t groups, const float* const* xs, __m512* acc) {
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = _mm512_setzero_ps();
  for (int32_t g = 0; g < groups; ++g) {
    const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
    __m512 partial[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) partial[v] = _mm512_setzero_ps();
    for (size_t c = begin; c < end; c += 4) {
      const __m512i wv = _mm512_loadu_si512(values + c * kQ8R16Rows);
      __m512 column[4];
      column[0] = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(wv, 24), 24));
      column[1] = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(wv, 16), 24));
      column[2] = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(wv, 8), 24));
      column[3] = _mm512_cvtepi32_ps(_mm512_srai_epi32(wv, 24));
      const size_t width = min_size(4, end - c);
      for (size_t j = 0; j < width; ++j)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) partial[v] = _mm512_fmadd_ps(column[j], _mm512_set1_ps(xs[v][c + j]), partial[v]);
    }
    const __m512 w_scales = _mm512_loadu_ps(block_scales + static_cast<size_t>(g) * kQ8R16Rows);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[v] = _mm512_fmadd_ps(partial[v], w_scales, acc[v]);
  }
}

// Lanes of the block at row r0 that lie in [row_begin, row_end).
__mmask16 q8r16_store_mask(int32_t r0, int32_t row_begin, int32_t row_end) {
  const int32_t lo = row_begin > r0 ? row_begin - r0 : 0;
  const int32_t hi = row_end - r0 < kQ8R16Rows ? row_end - r0 : kQ8R16Rows;
  return static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

// Blocks of 16 rows covering [row_begin, row_end), tiles of up to NV vectors
// per block: block(b, v0, nv, acc) computes block b for vectors v0..v0+nv;
// lanes outside the range are computed and not stored.
template <int NV, class Block>
void r16_blocks(int32_t n, float* const* y, int32_t row_begin, int32_t row_end, const Block& block) {
  for (int32_t r0 = row_begin / kQ8R16Rows * kQ8R16Rows; r0 < row_end; r0 += kQ8R16Rows) {
    const __mmask16 store = q8r16_store_mask(r0, row_begin, row_end);
    for (int32_t v0 = 0; v0 < n; v0 += NV) {
      __m512 acc[NV];
      const int32_t nv = n - v0 < NV ? n - v0 : NV;
      block(r0 / kQ8R16Rows, v0, nv, acc);
      for (int32_t v = 0; v < nv; ++v) _mm512_mask_storeu_ps(y[v0 + v] + r0, store, acc[v]);
    }
  }
}

// The blocks first..first+blocks-1 split into S runs read side by side
// (kernel.template operator()<S>(indices of S blocks, one per run)), then the
// blocks left over one at a time (operator()<1>).
template <int S, class Kernel>
void r16_blocks_side_by_side(int32_t first, int32_t blocks, const Kernel& kernel) {
  const int32_t run = blocks / S;
  for (int32_t i = 0; i < run; ++i) {
    int32_t b[S];
    for (int k = 0; k < S; ++k) b[k] = first + k * run + i;
    kernel.template operator()<S>(b);
  }
  for (int32_t b = first + S * run; b < first + blocks; ++b) kernel.template operator()<1>(&b);
}

// Stores K blocks' results (block b[k]'s NV vectors at acc[k * NV + v]),
// only the lanes inside [row_begin, row_end).
template <int K, int NV>
void store_r16_blocks(const int32_t* b, const __m512* acc, float* const* y, int32_t row_begin, int32_t row_end) {
  for (int k = 0; k < K; ++k) {
    const int32_t r0 = b[k] * kQ8R16Rows;
    const __mmask16 mask = q8r16_store_mask(r0, row_begin, row_end);
    for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(y[v] + r0, mask, acc[k * NV + v]);
  }
}

// What store_r16_blocks stored, back into registers (lanes outside the range zero).
template <int K, int NV>
void load_r16_blocks(const int32_t* b, float* const* y, int32_t row_begin, int32_t row_end, __m512* acc) {
  for (int k = 0; k < K; ++k) {
    const int32_t r0 = b[k] * kQ8R16Rows;
    const __mmask16 mask = q8r16_store_mask(r0, row_begin, row_end);
    for (int v = 0; v < NV; ++v) acc[k * NV + v] = _mm512_maskz_loadu_ps(mask, y[v] + r0);
  }
}

// Dispatches a runtime tile width 1..NV to the block kernel instantiated for it.
template <int NV, class Kernel>
void q8r16_tile(int32_t nv, const Kernel& kernel) {
  if constexpr (NV >= 1) {
    if (nv == NV) return kernel.template operator()<NV>();
    q8r16_tile<NV - 1>(nv, kernel);
  }
}

// One plane: 8 vectors use 16 of the 32 registers; two planes 24.
constexpr int kQ8R16Vectors = 8;

// One or two vectors (decode): the range's blocks split into kQ8R16Streams
// runs read side by side, the blocks left over one at a time. Measured
// interleaved (2 threads): 2 streams read lm_head and the experts 1.2-1.3x
// faster than 1, and decode gained 9-20 %; 4 streams were no better than 2.
constexpr int kQ8R16Streams = 2;
// Up to this many vectors take the side-by-side path: a batch's experts see a
// few tokens each and are streamed from memory like a matrix-vector product.
constexpr int kQ8R16StreamVectors = 4;

struct Q8R16Blocks {
  const std::int8_t* base;
  const float* scales;
  size_t block_bytes, block_scales;
  Q8R16Blocks(const Matrix& w, int32_t groups)
      : base(static_cast<const std::int8_t*>(w.data)),
        scales(w.scales),
        block_bytes(kQ8R16Rows * ((static_cast<size_t>(w.cols) + 3) / 4 * 4)),
        block_scales(static_cast<size_t>(groups) * kQ8R16Rows) {}
  const std::int8_t* values_of(int32_t b) const { return base + static_cast<size_t>(b) * block_bytes; }
  const float* scales_of(int32_t b) const { return scales + static_cast<size_t>(b) * block_scales; }
};

// The AMD family from CPUID leaf 1 (0x19: Zen 3 and Zen 4, 0x1a: Zen 5),
// which GCC 12's __builtin_cpu_is cannot name past Zen 4.
unsigned amd_family() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return 0;
  const unsigned base = (eax >> 8) & 0xf;
  return base == 0xf ? base + ((eax >> 20) & 0xff) : base;
}

// What a lone vector's Q8R16 stream prefetches, as measured per CPU with
// decode on the int8 OLMoE shape (docs/KERNELS.md, "Q8R16"):
// - Zen 4 (session 21): None. The hardware prefetchers alone read lm_head at
//   1.11-1.18x the old read test in DRAM's fast spells, against 0.81-0.85
//   with the Pair.
// - Zen 5 (session 27): Near. Decode ran 1.22x as fast as with None (int8
//   file, median of six alternated pairs), 1.06x on the int4 file (its
//   attention and lm_head); the Pair and leads of 1 and 4 KB in between, 3 KB
//   alike.
// - Intel (Emerald Rapids, session 22): Pair, 1.17-1.22x over None; every
//   CPU other than AMD keeps it, as every CPU did before session 21.
// An AMD family after Zen 5 takes Zen 5's choice, the closest measured.
// COLIBRI_STREAM_PREFETCH=none|near|pair overrides it, to measure a CPU.
StreamPrefetch lone_vector_prefetch() {
  static const StreamPrefetch choice = [] {
    if (const char* env = std::getenv("COLIBRI_STREAM_PREFETCH"); env != nullptr && *env != '\0') {
      // "off" and "on" are the names before Near existed.
      if (std::strcmp(env, "none") == 0 || std::strcmp(env, "off") == 0) return StreamPrefetch::None;
      if (std::strcmp(env, "near") == 0) return StreamPrefetch::Near;
      if (std::strcmp(env, "pair") == 0 || std::strcmp(env, "on") == 0) return StreamPrefetch::Pair;
      std::fprintf(stderr, "colibri: COLIBRI_STREAM_PREFETCH=%s is none of none, near, pair; ignored\n", env);
    }
    __builtin_cpu_init();
    if (!__builtin_cpu_is("amd")) return StreamPrefetch::Pair;
    return amd_family() >= 0x1a ? StreamPrefetch::Near : StreamPrefetch::None;
  }();
  return choice;
}

const char* stream_prefetch_name() {
  switch (lone_vector_prefetch()) {
    case StreamPrefetch::None: return "none";
    case StreamPrefetch::Near: return "near";
    case StreamPrefetch::Pair: return "pair";
  }
  return "";
}

template <bool Residual, int NV>
void q8r16_int8_streams(const Matrix& w, const ActivationView* const* xq, float* const* y, int32_t row_begin,
                        int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols), group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const Q8R16Blocks at(w, groups);
  const StreamPrefetch lone = lone_vector_prefetch();
  const int32_t first = row_begin / kQ8R16Rows, blocks = (row_end - 1) / kQ8R16Rows - first + 1;
  r16_blocks_side_by_side<kQ8R16Streams>(first, blocks, [&]<int K>(const int32_t* b) {
    const std::int8_t* values[K];
    const float* scales[K];
    for (int k = 0; k < K; ++k) {
      values[k] = at.values_of(b[k]);
      scales[k] = at.scales_of(b[k]);
    }
    __m512 acc[K * NV];
    if constexpr (NV == 1) {
      if (lone == StreamPrefetch::Near)
        q8r16_int8_block<Residual, NV, K, StreamPrefetch::Near>(values, scales, cols, group, groups, xq, acc);
      else if (lone == StreamPrefetch::Pair)
        q8r16_int8_block<Residual, NV, K, StreamPrefetch::Pair>(values, scales, cols, group, groups, xq, acc);
      else
        q8r16_int8_block<Residual, NV, K, StreamPrefetch::None>(values, scales, cols, group, groups, xq, acc);
    } else {
      q8r16_int8_block<Residual, NV, K, StreamPrefetch::Pair>(values, scales, cols, group, groups, xq, acc);
    }
    store_r16_blocks<K, NV>(b, acc, y, row_begin, row_end);
  });
}

// ---- Q8R16 tiles over packed activations (prefill, batches) -----------------------
//
// Read through one pointer per vector and plane, a tile of 8 vectors with two
// planes needs 16 base registers for its broadcasts: GCC spilled them to xmm
// registers and shuffled accumulators around every chunk, and the tile ran
// vpdpbusd at about half the rate one core issues it (2 per cycle on Zen 5).
// So a tile's activations are first packed, transposed: for each 4-column
// chunk one 64-byte line of 16 dwords, [plane][vector], and the kernel
// broadcasts from one pointer at constant offsets. The arithmetic per lane is
// q8r16_int8_block's, so results stay bit-identical to matvec.

constexpr int kPackedSources = 2 * kQ8R16Vectors;       // dwords per line: [plane][vector]
constexpr size_t kPackedMaxCols = 4096;                 // columns a stack-resident pack holds
constexpr int32_t kPackedMaxGroups = 256;
// Weights walked by every tile while in L2 (1 MB here). Half of it: whole
// rows ran as fast with 512 KB as with 1 or 4 MB panels, and column slices of
// a 14336-wide matrix 25-35 % faster with 512 KB than with 1 MB or 256 KB.
constexpr size_t kPackedPanelBytes = 512 * 1024;

// 96 KB, on the stack of the thread that runs the product (docs/C_API.md
// asks embedders for 512 KB stacks): no allocation, and a compute thread's
// pack stays in its own core's caches.
struct PackedTile {
  alignas(64) std::int32_t lines[kPackedMaxCols / 4 * kPackedSources];
  alignas(64) std::int32_t starts[kPackedMaxGroups * kPackedSources];  // -128 x the group's sum
  alignas(64) float scales[kPackedMaxGroups * kPackedSources];
};

// 16 rows of 16 dwords (sources) to 16 lines of 16 dwords (chunks).
inline void transpose16x16(__m512i r[16]) {
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {  // sources 4q..4q+3
    u[4 * q + 0] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
    u[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
  }
  // u[4q + m], 128-bit lane L: sources 4q..4q+3 at chunk 4L + m.
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m) {
    const __m512i a = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x88), b = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xdd);
    const __m512i c = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x88), d = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xdd);
    r[m] = _mm512_shuffle_i32x4(a, c, 0x88);
    r[8 + m] = _mm512_shuffle_i32x4(a, c, 0xdd);
    r[4 + m] = _mm512_shuffle_i32x4(b, d, 0x88);
    r[12 + m] = _mm512_shuffle_i32x4(b, d, 0xdd);
  }
}

// Packs vectors xs[0..nv) (nv <= 8); sources past nv, and the second plane
// without a residual, repeat vector 0 and are never read by the kernel.
// Columns [c0, c0 + cols) and groups [g0, g0 + groups) of each vector.
void pack_tile(const ActivationView* const* xs, int32_t nv, bool residual, size_t c0, size_t cols, int32_t g0,
               int32_t groups, PackedTile& pack) {
  const std::int8_t* source[kPackedSources];
  const std::int32_t* sums[kPackedSources];
  const float* scales[kPackedSources];
  for (int s = 0; s < kPackedSources; ++s) {
    const int v = s % kQ8R16Vectors < nv ? s % kQ8R16Vectors : 0;
    const bool second = residual && s >= kQ8R16Vectors;
    source[s] = (second ? xs[v]->residual_q : xs[v]->q) + c0;
    sums[s] = (second ? xs[v]->residual_sums : xs[v]->sums) + g0;
    scales[s] = (second ? xs[v]->residual_scales : xs[v]->scales) + g0;
  }
  // Activation buffers are zero-padded to a multiple of 128 bytes and c0 is a
  // multiple of 64, so whole 64-byte slices (16 chunks) can be read.
  for (size_t c = 0; c < cols; c += 64) {
    __m512i r[16];
#pragma GCC unroll 16
    for (int s = 0; s < kPackedSources; ++s) r[s] = _mm512_loadu_si512(source[s] + c);
    transpose16x16(r);
    std::int32_t* line = pack.lines + c / 4 * kPackedSources;
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) _mm512_store_si512(line + j * kPackedSources, r[j]);
  }
  for (int32_t g = 0; g < groups; ++g)
#pragma GCC unroll 16
    for (int s = 0; s < kPackedSources; ++s) {
      pack.starts[g * kPackedSources + s] = -128 * sums[s][g];
      pack.scales[g * kPackedSources + s] = scales[s][g];
    }
}

// q8r16_int8_block for one block and a packed tile of NV vectors; `acc`
// holds the sums of earlier column slices when `carry_in`, and gets the new ones.
template <bool Residual, int NV>
__attribute__((noinline)) void q8r16_packed_block(const std::int8_t* values, const float* block_scales, size_t cols,
                                                  size_t group, int32_t groups, const PackedTile& pack,
                                                  bool carry_in, __m512* acc_io, const std::int8_t* fetch_ahead,
                                                  bool stream_ahead) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = carry_in ? acc_io[v] : _mm512_setzero_ps();
  const bool combined = group <= static_cast<size_t>(kQ8R16CombinedMaxGroup);
  for (int32_t g = 0; g < groups; ++g) {
    const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
    const std::int32_t* starts = pack.starts + g * kPackedSources;
    __m512i dot[NV], lo[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      dot[v] = _mm512_set1_epi32(starts[v]);
      if constexpr (Residual) lo[v] = _mm512_set1_epi32(starts[kQ8R16Vectors + v]);
    }
    _mm_prefetch(reinterpret_cast<const char*>(block_scales + (static_cast<size_t>(g) + 8) * kQ8R16Rows), _MM_HINT_T0);
    const std::int8_t* line = reinterpret_cast<const std::int8_t*>(pack.lines + begin / 4 * kPackedSources);
    for (size_t c = begin; c < end; c += 4, line += 4 * kPackedSources) {
      const std::int8_t* chunk = values + c * kQ8R16Rows;
      _mm_prefetch(reinterpret_cast<const char*>(chunk) + kQ8R16Prefetch, _MM_HINT_T0);
      if (fetch_ahead != nullptr) _mm_prefetch(reinterpret_cast<const char*>(fetch_ahead + c * kQ8R16Rows), _MM_HINT_T1);
      if (stream_ahead) _mm_prefetch(reinterpret_cast<const char*>(chunk) + kQ8R16L2Prefetch, _MM_HINT_T1);
      const __m512i wv = _mm512_xor_si512(_mm512_loadu_si512(chunk), flip);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        dpbusd_broadcast(dot[v], wv, line + 4 * v);
        if constexpr (Residual) dpbusd_broadcast(lo[v], wv, line + 4 * (kQ8R16Vectors + v));
      }
    }
    const __m512 w_scales = _mm512_loadu_ps(block_scales + static_cast<size_t>(g) * kQ8R16Rows);
    const float* x_scales = pack.scales + g * kPackedSources;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      if constexpr (Residual)
        if (combined) {
          acc[v] = q8r16_combined_step(acc[v], dot[v], lo[v], w_scales, x_scales[kQ8R16Vectors + v]);
          continue;
        }
      acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[v]), _mm512_mul_ps(w_scales, _mm512_set1_ps(x_scales[v])), acc[v]);
      if constexpr (Residual)
        acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo[v]),
                                 _mm512_mul_ps(w_scales, _mm512_set1_ps(x_scales[kQ8R16Vectors + v])), acc[v]);
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc_io[v] = acc[v];
}

// Groups per column slice: all of them when one pack holds the matrix, else
// as many as a pack holds with the slice a multiple of 64 columns (so every
// slice starts on a whole pack row); 0 if no slice can be made.
int32_t packed_slice_groups(const Matrix& w) {
  const int32_t groups = group_count(w.cols, w.group);
  if (static_cast<size_t>(w.cols) <= kPackedMaxCols && groups <= kPackedMaxGroups) return groups;
  const int32_t most = min_int(kPackedMaxGroups, static_cast<int32_t>(kPackedMaxCols) / w.group);
  const int32_t step = 64 / gcd_int(w.group, 64);
  return most / step * step;
}

bool q8r16_packs(const Matrix& w) { return packed_slice_groups(w) > 0; }

// Panels of blocks small enough to stay in L2 while every tile of vectors
// goes through them; each tile packed once per panel. Rows wider than a pack
// go slice by slice, each slice's panel as large as a whole-row one: the
// partial sums wait in y between slices (stored and reloaded unchanged, so
// still matvec's bits; rows outside the range are neither read nor kept).
template <bool Residual>
void q8r16_packed_matmat(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y,
                         int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols), group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const Q8R16Blocks at(w, groups);
  const int32_t first = row_begin / kQ8R16Rows, last = (row_end - 1) / kQ8R16Rows;
  const int32_t slice_groups = packed_slice_groups(w);
  const int32_t slices = (groups + slice_groups - 1) / slice_groups;
  const size_t slice_bytes = slices > 1 ? kQ8R16Rows * static_cast<size_t>(slice_groups) * group : at.block_bytes;
  const int32_t panel = kPackedPanelBytes >= slice_bytes ? static_cast<int32_t>(kPackedPanelBytes / slice_bytes) : 1;
  const int32_t tiles = (n + kQ8R16Vectors - 1) / kQ8R16Vectors;
  PackedTile pack;
  for (int32_t p0 = first; p0 <= last; p0 += panel) {
    const int32_t p1 = p0 + panel - 1 < last ? p0 + panel - 1 : last;
    for (int32_t slice = 0; slice < slices; ++slice) {
      const int32_t g0 = slice * slice_groups, slice_groups_here = min_int(slice_groups, groups - g0);
      const size_t c0 = static_cast<size_t>(g0) * group, slice_cols = min_size(cols - c0, slice_groups * group);
      for (int32_t v0 = 0; v0 < n; v0 += kQ8R16Vectors) {
        const int32_t nv = n - v0 < kQ8R16Vectors ? n - v0 : kQ8R16Vectors;
        const int32_t tile = v0 / kQ8R16Vectors;
        pack_tile(xq + v0, nv, Residual, c0, slice_cols, g0, slice_groups_here, pack);
        for (int32_t b = p0; b <= p1; ++b) {
          // The first tile streams this panel from DRAM faster than one core
          // reads it, and the later ones find it in L2: so every tile fetches
          // a share of the next panel's blocks into L2 while it computes, in
          // proportion to its vectors (its time).
          const int32_t ahead = b + panel;
          const int32_t owner = static_cast<int32_t>(static_cast<int64_t>(b - p0) * n / (p1 - p0 + 1)) / kQ8R16Vectors;
          const std::int8_t* fetch_ahead =
              tiles > 1 && slices == 1 && ahead <= last && owner == tile ? at.values_of(ahead) : nullptr;
          q8r16_tile<kQ8R16Vectors>(nv, [&]<int NV>() {
            __m512 acc[NV];
            if (slice > 0) load_r16_blocks<1, NV>(&b, y + v0, row_begin, row_end, acc);
            // Nothing fetched the range's first panel ahead: its first tile
            // streams it from DRAM, and with one plane the 4 KB L1 lead left
            // it waiting on memory (cold expert gate n = 16: 168-173 GMAC/s
            // against 191 hot); asking 16 KB ahead into L2 as well gives
            // 182-185. Every panel of a single tile (n <= 8) asking so too
            // gave nothing (n = 8: 105-139 against 140-142).
            const bool stream_ahead = p0 == first && tile == 0;
            q8r16_packed_block<Residual, NV>(at.values_of(b) + c0 * kQ8R16Rows,
                                             at.scales_of(b) + static_cast<size_t>(g0) * kQ8R16Rows, slice_cols, group,
                                             slice_groups_here, pack, slice > 0, acc, fetch_ahead, stream_ahead);
            store_r16_blocks<1, NV>(&b, acc, y + v0, row_begin, row_end);
          });
        }
      }
    }
  }
}

void q8r16_matmat(const Matrix& w, int32_t n, const float* const* x, const ActivationView* const* xq,
                  float* const* y, int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols), group = static_cast<size_t>(w.group);
  const bool residual = xq != nullptr && xq[0]->residual_q != nullptr;
  if (xq != nullptr && n <= kQ8R16StreamVectors) {
    q8r16_tile<kQ8R16StreamVectors>(n, [&]<int NV>() {
      if (residual)
        q8r16_int8_streams<true, NV>(w, xq, y, row_begin, row_end);
      else
        q8r16_int8_streams<false, NV>(w, xq, y, row_begin, row_end);
    });
    return;
  }
  if (xq != nullptr && q8r16_packs(w)) {
    if (residual)
      q8r16_packed_matmat<true>(w, n, xq, y, row_begin, row_end);
    else
      q8r16_packed_matmat<false>(w, n, xq, y, row_begin, row_end);
    return;
  }
  const int32_t groups = group_count(w.cols, w.group);
  const Q8R16Blocks at(w, groups);
  r16_blocks<kQ8R16Vectors>(n, y, row_begin, row_end, [&](int32_t b, int32_t v0, int32_t nv, __m512* acc) {
    const std::int8_t* values = at.values_of(b);
    const float* scales = at.scales_of(b);
    q8r16_tile<kQ8R16Vectors>(nv, [&]<int NV>() {
      if (xq == nullptr)
        q8r16_f32_block<NV>(values, scales, cols, group, groups, x + v0, acc);
      else if (residual)
        q8r16_int8_block<true, NV>(&values, &scales, cols, group, groups, xq + v0, acc);
      else
        q8r16_int8_block<false, NV>(&values, &scales, cols, group, groups, xq + v0, acc);
    });
  });
}

// ---- Q4R16: Q8R16's walk over 4-bit codes ----------------------------------------
//
// One 64-byte load holds 8 columns of 16 rows: its low nibbles are a Q8R16
// chunk of columns c..c+3, its high nibbles of c+4..c+7 (weight_format.h).
// An AND and a shift give two vpdpbusd operands, codes 0..15 as the unsigned
// side, so nothing needs flipping. Scales and minimums are 16 f16 values per
// block and group, widened by vcvtph2ps (exact). Each lane runs the portable
// definition (kernels_scalar.cpp). f32 activations go to the portable path:
// no configuration the engine runs multiplies 4-bit weights by them.

constexpr size_t kQ4R16Prefetch = 2048;  // bytes ahead: 2048 and 4096 measured alike, 1024 10-15 % slower

struct Q4R16Block {
  const std::uint8_t* values;
  const std::uint16_t* scales;
  const std::uint16_t* mins;
};

struct Q4R16Blocks {
  const std::uint8_t* base;
  const std::uint16_t* scales;
  const std::uint16_t* mins;
  size_t block_bytes, block_scales;
  Q4R16Blocks(const Matrix& w, int32_t groups)
      : base(static_cast<const std::uint8_t*>(w.data)),
        scales(w.half_scales),
        mins(w.half_mins),
        block_bytes(kQ4R16Rows * ((static_cast<size_t>(w.cols) + 7) / 8 * 4)),
        block_scales(static_cast<size_t>(groups) * kQ4R16Rows) {}
  Q4R16Block operator[](int32_t b) const {
    const size_t i = static_cast<size_t>(b);
    return {base + i * block_bytes, scales + i * block_scales, mins + i * block_scales};
  }
};

template <bool Residual, int NV, int S = 1>
__attribute__((noinline)) void q4r16_int8_block(  // noinline: see q8r16_int8_block
const Q4R16Block* blocks_in, size_t cols, size_t group, int32_t groups,
                      const ActivationView* const* xs, __m512* acc_out) {
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  Q4R16Block blocks[S];  // locals, for registers (see q8r16_int8_block)
#pragma GCC unroll 4
  for (int k = 0; k < S; ++k) blocks[k] = blocks_in[k];
  __m512 acc[S * NV];
#pragma GCC unroll 8
  for (int i = 0; i < S * NV; ++i) acc[i] = _mm512_setzero_ps();
  for (int32_t g = 0; g < groups; ++g) {
    const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
    __m512i dot[S * NV], lo[S * NV];
#pragma GCC unroll 8
    for (int i = 0; i < S * NV; ++i) {
      dot[i] = _mm512_setzero_si512();
      if constexpr (Residual) lo[i] = _mm512_setzero_si512();
    }
#pragma GCC unroll 4
    for (int k = 0; k < S; ++k) {
      _mm_prefetch(reinterpret_cast<const char*>(blocks[k].scales + (static_cast<size_t>(g) + 16) * kQ4R16Rows),
                   _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(blocks[k].mins + (static_cast<size_t>(g) + 16) * kQ4R16Rows),
                   _MM_HINT_T0);
    }
    for (size_t c = begin; c < end; c += 8) {
      // The loads, not the arithmetic, bounded this loop: each vpdpbusd
      // broadcast its 4 bytes from memory, and GCC folded the line's load
      // into both nibble operations, so a lone vector's two streams issued
      // 11 loads for 2 lines. Broadcasting once for all S blocks and loading
      // the line once leaves 6 (Zen 5, session 28: cache-resident 1.17-1.27x;
      // int4 decode 1.10x, docs/KERNELS.md "Q4R16").
      constexpr bool kBroadcastOnce = S > 1;
      __m512i xb[NV], xh[NV], rb[NV], rh[NV];
      if constexpr (kBroadcastOnce) {
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
          xb[v] = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(xs[v]->q + c));
          xh[v] = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(xs[v]->q + c + 4));
          if constexpr (Residual) {
            rb[v] = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(xs[v]->residual_q + c));
            rh[v] = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(xs[v]->residual_q + c + 4));
          }
        }
      }
#pragma GCC unroll 4
      for (int k = 0; k < S; ++k) {
        const std::uint8_t* chunk = blocks[k].values + c * (kQ4R16Rows / 2);
        _mm_prefetch(reinterpret_cast<const char*>(chunk) + kQ4R16Prefetch, _MM_HINT_T0);
        __m512i wv = _mm512_loadu_si512(chunk);
        asm("" : "+v"(wv));  // in a register: one load, not one per use
        const __m512i low = _mm512_and_si512(wv, nibble);
        const __m512i high = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nibble);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
          if constexpr (kBroadcastOnce) {
            dpbusd_registers(dot[k * NV + v], low, xb[v]);
            dpbusd_registers(dot[k * NV + v], high, xh[v]);
            if constexpr (Residual) {
              dpbusd_registers(lo[k * NV + v], low, rb[v]);
              dpbusd_registers(lo[k * NV + v], high, rh[v]);
            }
          } else {
            dpbusd_broadcast(dot[k * NV + v], low, xs[v]->q + c);
            dpbusd_broadcast(dot[k * NV + v], high, xs[v]->q + c + 4);
            if constexpr (Residual) {
              dpbusd_broadcast(lo[k * NV + v], low, xs[v]->residual_q + c);
              dpbusd_broadcast(lo[k * NV + v], high, xs[v]->residual_q + c + 4);
            }
          }
        }
      }
    }
#pragma GCC unroll 4
    for (int k = 0; k < S; ++k) {
      const size_t slot = static_cast<size_t>(g) * kQ4R16Rows;
      const __m512 w_scales = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blocks[k].scales + slot)));
      const __m512 w_mins = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blocks[k].mins + slot)));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        const ActivationView& x = *xs[v];
        __m512& a = acc[k * NV + v];
        a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[k * NV + v]), _mm512_mul_ps(w_scales, _mm512_set1_ps(x.scales[g])), a);
        a = _mm512_fmadd_ps(w_mins, _mm512_set1_ps(x.scales[g] * static_cast<float>(x.sums[g])), a);
        if constexpr (Residual) {
          a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo[k * NV + v]),
                              _mm512_mul_ps(w_scales, _mm512_set1_ps(x.residual_scales[g])), a);
          a = _mm512_fmadd_ps(w_mins, _mm512_set1_ps(x.residual_scales[g] * static_cast<float>(x.residual_sums[g])), a);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < S * NV; ++i) acc_out[i] = acc[i];
}

template <bool Residual, int NV>
void q4r16_int8_streams(const Matrix& w, const ActivationView* const* xq, float* const* y, int32_t row_begin,
                        int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols), group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const Q4R16Blocks at(w, groups);
  const int32_t first = row_begin / kQ4R16Rows, blocks = (row_end - 1) / kQ4R16Rows - first + 1;
  r16_blocks_side_by_side<kQ8R16Streams>(first, blocks, [&]<int K>(const int32_t* b) {
    Q4R16Block block[K];
    for (int k = 0; k < K; ++k) block[k] = at[b[k]];
    __m512 acc[K * NV];
    q4r16_int8_block<Residual, NV, K>(block, cols, group, groups, xq, acc);
    store_r16_blocks<K, NV>(b, acc, y, row_begin, row_end);
  });
}

void q4r16_matmat(const Matrix& w, int32_t n, const float* const* x, const ActivationView* const* xq,
                  float* const* y, int32_t row_begin, int32_t row_end) {
  if (xq == nullptr) return scalar_kernel_table()->matmat(w, n, x, xq, y, row_begin, row_end);
  const size_t cols = static_cast<size_t>(w.cols), group = static_cast<size_t>(w.group);
  const bool residual = xq[0]->residual_q != nullptr;
  if (n <= kQ8R16StreamVectors) {
    q8r16_tile<kQ8R16StreamVectors>(n, [&]<int NV>() {
      if (residual)
        q4r16_int8_streams<true, NV>(w, xq, y, row_begin, row_end);
      else
        q4r16_int8_streams<false, NV>(w, xq, y, row_begin, row_end);
    });
    return;
  }
  const int32_t groups = group_count(w.cols, w.group);
  const Q4R16Blocks at(w, groups);
  r16_blocks<kQ8R16Vectors>(n, y, row_begin, row_end, [&](int32_t b, int32_t v0, int32_t nv, __m512* acc) {
    const Q4R16Block block = at[b];
    q8r16_tile<kQ8R16Vectors>(nv, [&]<int NV>() {
      if (residual)
        q4r16_int8_block<true, NV>(&block, cols, group, groups, xq + v0, acc);
      else
        q4r16_int8_block<false, NV>(&block, cols, group, groups, xq + v0, acc);
    });
  });
}

void matvec(const Matrix& w, const float* x, const ActivationView* xq, float* y, int32_t row_begin,
            int32_t row_end) {
  switch (w.format) {
    case WeightFormat::F32: return float_matvec<WeightFormat::F32>(w, x, y, row_begin, row_end);
    case WeightFormat::F16: return float_matvec<WeightFormat::F16>(w, x, y, row_begin, row_end);
    case WeightFormat::BF16: return float_matvec<WeightFormat::BF16>(w, x, y, row_begin, row_end);
    case WeightFormat::Q8:
      if (xq != nullptr && xq->residual_q != nullptr) return q8_int8_matvec<true>(w, *xq, y, row_begin, row_end);
      if (xq != nullptr) return q8_int8_matvec<false>(w, *xq, y, row_begin, row_end);
      return q8_f32_matvec(w, x, y, row_begin, row_end);
    case WeightFormat::Q8R16:
      return q8r16_matmat(w, 1, &x, xq != nullptr ? &xq : nullptr, &y, row_begin, row_end);
    case WeightFormat::Q4R16:
      return q4r16_matmat(w, 1, &x, xq != nullptr ? &xq : nullptr, &y, row_begin, row_end);
    case WeightFormat::Q4:
      if (xq != nullptr && q4_int8_supported(w.group)) {
        if (xq->residual_q != nullptr) return q4_int8_matvec<true>(w, *xq, y, row_begin, row_end);
        return q4_int8_matvec<false>(w, *xq, y, row_begin, row_end);
      }
      if (xq == nullptr && w.group % 2 == 0) return q4_f32_matvec(w, x, y, row_begin, row_end);
      break;
  }
  // Group sizes no model uses: the portable kernel, same arithmetic contract.
  scalar_kernel_table()->matvec(w, x, xq, y, row_begin, row_end);
}

// ---- matrix x several vectors (matmat) ------------------------------------------
//
// Each kernel below mirrors the matvec above it with a second tile dimension:
// NR rows x NV vectors, the weights of a row loaded (and converted or
// sign-flipped) once per chunk for all NV vectors. Every (row, vector) pair
// keeps its own accumulator and sees exactly the instruction sequence matvec
// runs for that row (same integer lanes, same f32 operations in the same
// order, same reduction), so each result is bit-identical to matvec's.
// f32/f16/bf16 and f32-activation kernels take row blocks as the outer loop
// and vector tiles as the inner one: a block's weights (4 rows, a few KB)
// stay in L1 while every tile goes through them. The int8 kernels, which read
// a tile's activations for every row, go by row panels (weights in L2), then
// tiles (activations in L1), then row blocks. Only the first tile prefetches
// the next rows.

// Runs kernel.template operator()<NR, NV>(r0, v0) over rows [begin, end) x
// vectors [0, n): tiles of NV vectors, then one tile of the n % NV rest.
template <int NR, int NV, class Kernel>
void vector_rest(const Kernel& kernel, int32_t r0, int32_t v0, int32_t rest) {
  if constexpr (NV > 1) {
    if (rest == NV - 1) return kernel.template operator()<NR, NV - 1>(r0, v0);
    vector_rest<NR, NV - 1>(kernel, r0, v0, rest);
  }
}

template <int NV, class Kernel>
void for_tiles(int32_t begin, int32_t end, int32_t n, const Kernel& kernel) {
  auto row_block = [&]<int NR>(int32_t r0) {
    int32_t v = 0;
    for (; v + NV <= n; v += NV) kernel.template operator()<NR, NV>(r0, v);
    if (v < n) vector_rest<NR, NV>(kernel, r0, v, n - v);
  };
  int32_t r = begin;
  for (; r + kRowBlock <= end; r += kRowBlock) row_block.template operator()<kRowBlock>(r);
  for (; r < end; ++r) row_block.template operator()<1>(r);
}

template <WeightFormat F>
void float_matmat(const Matrix& w, int32_t n, const float* const* x, float* const* y, int32_t row_begin,
                  int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t element = F == WeightFormat::F32 ? 4 : 2;
  const auto* base = static_cast<const std::uint8_t*>(w.data);
  for_tiles<4>(row_begin, row_end, n, [&]<int NR, int NV>(int32_t r0, int32_t v0) {
    const bool prefetch = v0 == 0;
    const void* rows[NR];
    __m512 acc[NR][NV];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols * element;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
    }
    for (size_t c = 0; c < cols; c += 16) {
      const __mmask16 m = mask16(cols - c);
      __m512 xv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) xv[v] = _mm512_maskz_loadu_ps(m, x[v0 + v] + c);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        if (prefetch) prefetch_next_block(rows[r], c * element, cols * element);
        const __m512 wv = load_weights16<F>(rows[r], c, m);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(wv, xv[v], acc[r][v]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) y[v0 + v][r0 + r] = _mm512_reduce_add_ps(acc[r][v]);
  });
}

// Rows per panel: a panel's weights (about 128 KB) stay in L2 while every
// vector tile goes through them, with the tile's activations in L1.
int32_t panel_rows(size_t row_bytes) {
  const size_t rows = (size_t{128} << 10) / (row_bytes + 1);
  return static_cast<int32_t>(rows < 4 ? 4 : rows > 256 ? 256 : rows / 4 * 4);
}

// Runs kernel.template operator()<NR, NV>(r0, v0, prefetch) over row panels,
// tiles of up to NV vectors within a panel, row blocks within a tile; only
// the first tile of a panel prefetches the next row block.
template <int NR, int NV, class Kernel>
void tile_rest(const Kernel& kernel, int32_t r0, int32_t v0, int32_t nv, bool prefetch) {
  if constexpr (NV >= 1) {
    if (nv == NV) return kernel.template operator()<NR, NV>(r0, v0, prefetch);
    tile_rest<NR, NV - 1>(kernel, r0, v0, nv, prefetch);
  }
}

template <int NV, class Kernel>
void for_panel_tiles(int32_t begin, int32_t end, int32_t n, int32_t panel, const Kernel& kernel) {
  for (int32_t p = begin; p < end; p += panel) {
    const int32_t p_end = p + panel < end ? p + panel : end;
    for (int32_t v0 = 0; v0 < n; v0 += NV) {
      const int32_t nv = n - v0 < NV ? n - v0 : NV;
      int32_t r = p;
      for (; r + kRowBlock <= p_end; r += kRowBlock) tile_rest<kRowBlock, NV>(kernel, r, v0, nv, v0 == 0);
      for (; r < p_end; ++r) tile_rest<1, NV>(kernel, r, v0, nv, v0 == 0);
    }
  }
}

// Groups of at most 64 columns (the common 32 and 64) are one dpbusd per
// (row, vector): the activations of the group stay in registers for all rows
// and each group's int32 lanes go straight into the f32 accumulator. Larger
// groups take rows one at a time, each with NV running dot products and the
// activations read from L1.
//
// The per-group factors are made 16 groups at a time: w_scale * x_scale for
// every pair with full-width multiplies (the scales of a row and of a vector
// are both contiguous; each lane is the same single rounding as matvec's
// scalar product) and the dpbusd start values -8 * sum. They are stored, and
// the empty asm keeps them in memory, so the FMAs take their factor as a
// broadcast operand instead of shuffles the compiler would build.
template <bool Residual>
void q8_int8_matmat(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y,
                    int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const auto* base = static_cast<const std::int8_t*>(w.data);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const bool one_chunk = group <= 64;
  // Two planes need twice the activation registers: 4 x 3 tiles keep all
  // accumulators in registers where 4 x 4 would spill them.
  constexpr int kTileVectors = Residual ? 3 : 4;
  for_panel_tiles<kTileVectors>(row_begin, row_end, n, panel_rows(cols), [&]<int NR, int NV>(int32_t r0, int32_t v0, bool prefetch) {
    const std::int8_t* rows[NR];
    const float* scales[NR];
    const ActivationView* xs[NV];
    __m512 acc[NR][NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) xs[v] = xq[v0 + v];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
    }
    alignas(64) float s[NR][NV][16], sr[NR][NV][16];
    alignas(64) int32_t bias[NV][16], lo_bias[NV][16];
    const __m512i minus8 = _mm512_set1_epi32(-8);
    for (int32_t g16 = 0; g16 < groups; g16 += 16) {
      const __mmask16 gm = mask16(static_cast<size_t>(groups - g16));
      if (prefetch)
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) prefetch_next_block(scales[r], 4 * static_cast<size_t>(g16), 4 * static_cast<size_t>(groups));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        _mm512_store_si512(bias[v], _mm512_mullo_epi32(_mm512_maskz_loadu_epi32(gm, xs[v]->sums + g16), minus8));
        if constexpr (Residual)
          _mm512_store_si512(lo_bias[v], _mm512_mullo_epi32(_mm512_maskz_loadu_epi32(gm, xs[v]->residual_sums + g16), minus8));
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const __m512 w_scales = _mm512_maskz_loadu_ps(gm, scales[r] + g16);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          _mm512_store_ps(s[r][v], _mm512_mul_ps(w_scales, _mm512_maskz_loadu_ps(gm, xs[v]->scales + g16)));
          if constexpr (Residual)
            _mm512_store_ps(sr[r][v], _mm512_mul_ps(w_scales, _mm512_maskz_loadu_ps(gm, xs[v]->residual_scales + g16)));
        }
      }
      asm("" : "+m"(s), "+m"(sr), "+m"(bias), "+m"(lo_bias));
      const int32_t g_end = groups - g16 < 16 ? groups : g16 + 16;
      for (int32_t g = g16; g < g_end; ++g) {
        const int32_t k = g - g16;
        const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
        if (one_chunk) {
          // Masked-off weights read as 0 and flip to 128, but x is 0 there.
          const __mmask64 m = mask64(end - begin);
          __m512i xv[NV], xl[NV];
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) {
            xv[v] = _mm512_maskz_loadu_epi8(m, xs[v]->q + begin);
            if constexpr (Residual) xl[v] = _mm512_maskz_loadu_epi8(m, xs[v]->residual_q + begin);
          }
          if (prefetch)
#pragma GCC unroll 4
            for (int r = 0; r < NR; ++r) prefetch_next_block(rows[r], begin, cols);
#pragma GCC unroll 4
          for (int r = 0; r < NR; ++r) {
            const __m512i wv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, rows[r] + begin), flip);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) {
              const __m512i dot = _mm512_dpbusd_epi32(_mm512_set1_epi32(bias[v][k]), wv, xv[v]);
              acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(s[r][v][k]), acc[r][v]);
              if constexpr (Residual) {
                const __m512i lo = _mm512_dpbusd_epi32(_mm512_set1_epi32(lo_bias[v][k]), wv, xl[v]);
                acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_set1_ps(sr[r][v][k]), acc[r][v]);
              }
            }
          }
          continue;
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          __m512i dot[NV], lo[NV];
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) {
            dot[v] = _mm512_set1_epi32(bias[v][k]);
            if constexpr (Residual) lo[v] = _mm512_set1_epi32(lo_bias[v][k]);
          }
          size_t c = begin;
          for (; c + 64 <= end; c += 64) {
            if (prefetch) prefetch_next_block(rows[r], c, cols);
            const __m512i wv = _mm512_xor_si512(_mm512_loadu_si512(rows[r] + c), flip);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) {
              dot[v] = _mm512_dpbusd_epi32(dot[v], wv, _mm512_loadu_si512(xs[v]->q + c));
              if constexpr (Residual) lo[v] = _mm512_dpbusd_epi32(lo[v], wv, _mm512_loadu_si512(xs[v]->residual_q + c));
            }
          }
          if (c < end) {
            const __mmask64 m = mask64(end - c);
            const __m512i wv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, rows[r] + c), flip);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) {
              dot[v] = _mm512_dpbusd_epi32(dot[v], wv, _mm512_maskz_loadu_epi8(m, xs[v]->q + c));
              if constexpr (Residual)
                lo[v] = _mm512_dpbusd_epi32(lo[v], wv, _mm512_maskz_loadu_epi8(m, xs[v]->residual_q + c));
            }
          }
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) {
            acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[v]), _mm512_set1_ps(s[r][v][k]), acc[r][v]);
            if constexpr (Residual)
              acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo[v]), _mm512_set1_ps(sr[r][v][k]), acc[r][v]);
          }
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) y[v0 + v][r0 + r] = _mm512_reduce_add_ps(acc[r][v]);
  });
}

// Rows one at a time within a group, NV partial sums each, activations from L1.
void q8_f32_matmat(const Matrix& w, int32_t n, const float* const* x, float* const* y, int32_t row_begin,
                   int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const auto* base = static_cast<const std::int8_t*>(w.data);
  for_tiles<4>(row_begin, row_end, n, [&]<int NR, int NV>(int32_t r0, int32_t v0) {
    const std::int8_t* rows[NR];
    const float* scales[NR];
    __m512 acc[NR][NV];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
    }
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        __m512 partial[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) partial[v] = _mm512_setzero_ps();
        for (size_t c = begin; c < end; c += 16) {
          const __mmask16 m = mask16(end - c);
          const __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, rows[r] + c)));
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) partial[v] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x[v0 + v] + c), partial[v]);
        }
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(partial[v], _mm512_set1_ps(scales[r][g]), acc[r][v]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) y[v0 + v][r0 + r] = _mm512_reduce_add_ps(acc[r][v]);
  });
}

// Per 128-column block the lane scales are spread once per vector and once
// per row, then multiplied per pair: the same products matvec spreads after
// multiplying, so the same bits.
template <bool Residual>
void q4_int8_matmat(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y,
                    int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const size_t row_bytes = (cols + 1) / 2;
  const size_t blocks = cols / 128;
  const auto* base = static_cast<const std::uint8_t*>(w.data);
  const int32_t per_block = group >= 128 ? 1 : static_cast<int32_t>(128 / group);
  const __mmask8 scale_mask = static_cast<__mmask8>((1u << per_block) - 1u);
  alignas(64) int32_t lane_group[16];
  for (int j = 0; j < 16; ++j) lane_group[j] = group >= 128 ? 0 : static_cast<int32_t>(8 * j / group);
  const __m512i spread = _mm512_load_si512(lane_group);
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  auto spread_scales = [&](const float* s) { return _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_maskz_loadu_ps(scale_mask, s))); };

  // Per block the tile's activations are loaded once into registers for all
  // rows: 4 x 3 tiles with one plane, 4 x 2 with two, so that they and the
  // accumulators fit in the 32 registers. Panels keep them in L1.
  constexpr int kTileVectors = Residual ? 2 : 3;
  for_panel_tiles<kTileVectors>(row_begin, row_end, n, panel_rows(row_bytes), [&]<int NR, int NV>(int32_t r0, int32_t v0, bool prefetch) {
    const std::uint8_t* rows[NR];
    const float* scales[NR];
    const ActivationView* xs[NV];
    __m512 acc[NR][NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) xs[v] = xq[v0 + v];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * row_bytes;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
    }
    for (size_t b = 0; b < blocks; ++b) {
      const size_t g0 = 128 * b / group;
      __m512 x_scales[NV], r_scales[NV];
      __m512i x_even[NV], x_odd[NV], r_even[NV], r_odd[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        x_scales[v] = spread_scales(xs[v]->scales + g0);
        x_even[v] = _mm512_loadu_si512(xs[v]->q4 + 128 * b);
        x_odd[v] = _mm512_loadu_si512(xs[v]->q4 + 128 * b + 64);
        if constexpr (Residual) {
          r_scales[v] = spread_scales(xs[v]->residual_scales + g0);
          r_even[v] = _mm512_loadu_si512(xs[v]->residual_q4 + 128 * b);
          r_odd[v] = _mm512_loadu_si512(xs[v]->residual_q4 + 128 * b + 64);
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        if (prefetch) {
          prefetch_next_block(rows[r], 64 * b, row_bytes);
          if ((b & 3) == 0) {
            prefetch_next_block(scales[r], 4 * g0, 4 * static_cast<size_t>(groups));
            prefetch_next_block(w.mins + (static_cast<size_t>(r0) + r) * groups, 4 * g0, 4 * static_cast<size_t>(groups));
          }
        }
        const __m512i packed = _mm512_loadu_si512(rows[r] + 64 * b);
        const __m512i lo = _mm512_and_si512(packed, low4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
        const __m512 w_scales = spread_scales(scales[r] + g0);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, x_even[v]), hi, x_odd[v]);
          acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(w_scales, x_scales[v]), acc[r][v]);
          if constexpr (Residual) {
            const __m512i dot_r = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, r_even[v]), hi, r_odd[v]);
            acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_r), _mm512_mul_ps(w_scales, r_scales[v]), acc[r][v]);
          }
        }
      }
    }
    // The min term and the columns past the last block, as in matvec.
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const float* mins = w.mins + (static_cast<size_t>(r0) + r) * groups;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        const Q4RowEnd end = q4_row_end<Residual>(rows[r], scales[r], mins, *xs[v], groups, group, cols, blocks);
        y[v0 + v][r0 + r] = _mm512_reduce_add_ps(acc[r][v]) + end.tail + end.mins;
      }
    }
  });
}

// Even group sizes. The group's sum of x is the same for every row, so it is
// computed once per vector in matvec's order before the rows.
void q4_f32_matmat(const Matrix& w, int32_t n, const float* const* x, float* const* y, int32_t row_begin,
                   int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const size_t row_bytes = (cols + 1) / 2;
  const auto* base = static_cast<const std::uint8_t*>(w.data);
  const __m128i low4 = _mm_set1_epi8(0x0f);
  for_tiles<4>(row_begin, row_end, n, [&]<int NR, int NV>(int32_t r0, int32_t v0) {
    const std::uint8_t* rows[NR];
    const float* scales[NR];
    const float* mins[NR];
    __m512 acc[NR][NV];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * row_bytes;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
      mins[r] = w.mins + (static_cast<size_t>(r0) + r) * groups;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
    }
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
      __m512 x_sum[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        x_sum[v] = _mm512_setzero_ps();
        for (size_t c = begin; c < end; c += 32) {
          const size_t len = min_size(32, end - c);
          const __m512 x0 = _mm512_maskz_loadu_ps(mask16(len), x[v0 + v] + c);
          const __m512 x1 = _mm512_maskz_loadu_ps(mask16(len > 16 ? len - 16 : 0), x[v0 + v] + c + 16);
          x_sum[v] = _mm512_add_ps(x_sum[v], _mm512_add_ps(x0, x1));
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        __m512 partial[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) partial[v] = _mm512_setzero_ps();
        for (size_t c = begin; c < end; c += 32) {
          const size_t len = min_size(32, end - c);
          const __mmask16 byte_mask = mask16((len + 1) / 2);
          const __mmask16 m0 = mask16(len), m1 = mask16(len > 16 ? len - 16 : 0);
          const __m128i packed = _mm_maskz_loadu_epi8(byte_mask, rows[r] + c / 2);
          const __m128i lo = _mm_and_si128(packed, low4);
          const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low4);
          const __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
          const __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) {
            const __m512 x0 = _mm512_maskz_loadu_ps(m0, x[v0 + v] + c);
            const __m512 x1 = _mm512_maskz_loadu_ps(m1, x[v0 + v] + c + 16);
            partial[v] = _mm512_fmadd_ps(w1, x1, _mm512_fmadd_ps(w0, x0, partial[v]));
          }
        }
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          acc[r][v] = _mm512_fmadd_ps(partial[v], _mm512_set1_ps(scales[r][g]), acc[r][v]);
          acc[r][v] = _mm512_fmadd_ps(x_sum[v], _mm512_set1_ps(mins[r][g]), acc[r][v]);
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) y[v0 + v][r0 + r] = _mm512_reduce_add_ps(acc[r][v]);
  });
}

// xq is null (f32 activations) or n views usable with w. Shapes matvec sends
// to the portable kernel go to the portable matmat, which matches it the same way.
void matmat(const Matrix& w, int32_t n, const float* const* x, const ActivationView* const* xq, float* const* y,
            int32_t row_begin, int32_t row_end) {
  if (n == 1) return matvec(w, x[0], xq != nullptr ? xq[0] : nullptr, y[0], row_begin, row_end);
  bool residual = false, mixed = false;
  if (xq != nullptr) {
    residual = xq[0]->residual_q != nullptr;
    for (int32_t v = 1; v < n; ++v) mixed = mixed || (xq[v]->residual_q != nullptr) != residual;
  }
  if (mixed) {  // one plane for some vectors, two for others: each alone
    for (int32_t v = 0; v < n; ++v) matvec(w, x[v], xq[v], y[v], row_begin, row_end);
    return;
  }
  switch (w.format) {
    case WeightFormat::F32: return float_matmat<WeightFormat::F32>(w, n, x, y, row_begin, row_end);
    case WeightFormat::F16: return float_matmat<WeightFormat::F16>(w, n, x, y, row_begin, row_end);
    case WeightFormat::BF16: return float_matmat<WeightFormat::BF16>(w, n, x, y, row_begin, row_end);
    case WeightFormat::Q8:
      if (xq != nullptr && residual) return q8_int8_matmat<true>(w, n, xq, y, row_begin, row_end);
      if (xq != nullptr) return q8_int8_matmat<false>(w, n, xq, y, row_begin, row_end);
      return q8_f32_matmat(w, n, x, y, row_begin, row_end);
    case WeightFormat::Q8R16: return q8r16_matmat(w, n, x, xq, y, row_begin, row_end);
    case WeightFormat::Q4R16: return q4r16_matmat(w, n, x, xq, y, row_begin, row_end);
    case WeightFormat::Q4:
      if (xq != nullptr && q4_int8_supported(w.group)) {
        if (residual) return q4_int8_matmat<true>(w, n, xq, y, row_begin, row_end);
        return q4_int8_matmat<false>(w, n, xq, y, row_begin, row_end);
      }
      if (xq == nullptr && w.group % 2 == 0) return q4_f32_matmat(w, n, x, y, row_begin, row_end);
      break;
  }
  scalar_kernel_table()->matmat(w, n, x, xq, y, row_begin, row_end);
}

// ---- activation quantization ----------------------------------------------------

// Zeros q from n to a multiple of 128 and writes q4, q's complete 128-column
// blocks in the Q4 kernels' order.
void pad_and_rearrange(std::int8_t* q, std::int8_t* q4, int32_t n) {
  const size_t padded = (static_cast<size_t>(n) + 127) / 128 * 128;
  for (size_t c = static_cast<size_t>(n); c < padded; c += 64)
    _mm512_mask_storeu_epi8(q + c, mask64(padded - c), _mm512_setzero_si512());
  // Even bytes are the low halves of 16-bit lanes, odd bytes the high halves.
  for (size_t block = 0; block + 128 <= static_cast<size_t>(n); block += 128) {
    const __m512i a = _mm512_loadu_si512(q + block), b = _mm512_loadu_si512(q + block + 64);
    const __m512i even = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(a)),
                                            _mm512_cvtepi16_epi8(b), 1);
    const __m512i odd = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(a, 8))),
                                           _mm512_cvtepi16_epi8(_mm512_srli_epi16(b, 8)), 1);
    _mm512_storeu_si512(q4 + block, even);
    _mm512_storeu_si512(q4 + block + 64, odd);
  }
}

void quantize_activation(const float* x, int32_t n, int32_t group, std::int8_t* q, std::int8_t* q4,
                         float* scales, int32_t* sums, float* residual) {
  const int32_t groups = group_count(n, group);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int32_t g = 0; g < groups; ++g) {
    const size_t begin = static_cast<size_t>(g) * group;
    const size_t end = min_size(static_cast<size_t>(n), begin + static_cast<size_t>(group));
    __m512 amax = _mm512_setzero_ps();
    for (size_t c = begin; c < end; c += 16)
      // The NaN operand first: max_ps then returns amax, skipping it as std::max does.
      amax = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(mask16(end - c), x + c)), amax);
    const float m = _mm512_reduce_max_ps(amax);
    const float inverse = m >= kSmallestActivationAmax ? 127.0f / m : 0.0f;
    const __m512 inv = _mm512_set1_ps(inverse);
    __m512i sum = _mm512_setzero_si512();
    const float scale = m / 127.0f;
    for (size_t c = begin; c < end; c += 16) {
      const __mmask16 mask = mask16(end - c);
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + c);
      // cvtps rounds to nearest even, like the scalar path's nearbyint; NaN gives 0.
      const __m512 scaled = _mm512_mul_ps(xv, inv);
      __m512i v = _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask(scaled, scaled, _CMP_ORD_Q), scaled);
      v = _mm512_min_epi32(_mm512_max_epi32(v, lo), hi);
      sum = _mm512_add_epi32(sum, v);
      _mm_mask_storeu_epi8(q + c, mask, _mm512_cvtepi32_epi8(v));
      if (residual != nullptr)  // multiply, then subtract: the scalar path's two roundings
        _mm512_mask_storeu_ps(residual + c, mask,
                              _mm512_sub_ps(xv, _mm512_mul_ps(_mm512_set1_ps(scale), _mm512_cvtepi32_ps(v))));
    }
    scales[g] = scale;
    sums[g] = _mm512_reduce_add_epi32(sum);
  }
  pad_and_rearrange(q, q4, n);
}

// The scalar path's quantize_residual: cvtps rounds to nearest even as its
// rounding does, after the same clamp, so the bytes are the same.
void quantize_residual(const float* r, int32_t n, int32_t group, const float* first_scales, std::int8_t* q,
                       std::int8_t* q4, float* scales, int32_t* sums) {
  const int32_t groups = group_count(n, group);
  const __m512 limit = _mm512_set1_ps(static_cast<float>(kResidualLimit));
  const __m512 minus_limit = _mm512_set1_ps(-static_cast<float>(kResidualLimit));
  for (int32_t g = 0; g < groups; ++g) {
    const size_t begin = static_cast<size_t>(g) * group;
    const size_t end = min_size(static_cast<size_t>(n), begin + static_cast<size_t>(group));
    const float scale = first_scales[g] / static_cast<float>(kResidualRatio);
    const float inverse = scale >= FLT_MIN ? 1.0f / scale : 0.0f;
    const __m512 inv = _mm512_set1_ps(inverse);
    __m512i sum = _mm512_setzero_si512();
    for (size_t c = begin; c < end; c += 16) {
      const __mmask16 mask = mask16(end - c);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, r + c), inv);
      const __m512 held = _mm512_max_ps(_mm512_min_ps(v, limit), minus_limit);
      const __m512i codes = _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), held);  // NaN: 0
      sum = _mm512_add_epi32(sum, codes);
      _mm_mask_storeu_epi8(q + c, mask, _mm512_cvtepi32_epi8(codes));
    }
    scales[g] = scale;
    sums[g] = _mm512_reduce_add_epi32(sum);
  }
  pad_and_rearrange(q, q4, n);
}

// ---- elementwise and attention kernels ------------------------------------------

// exp(x) to about 2 ulp: x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial
// for exp(r) (Cephes expf coefficients), then scalef by 2^n. Inputs below
// -87.3 give ~1e-38 rather than 0, which no caller can tell apart.
__m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.72283f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

float dot(const float* a, const float* b, int32_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int32_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = mask16(static_cast<size_t>(n - i));
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

void rmsnorm(const float* x, const float* weight, int32_t n, float eps, float* out) {
  const float sum_sq = dot(x, x, n);
  const __m512 scale = _mm512_set1_ps(static_cast<float>(1.0 / __builtin_sqrt(static_cast<double>(sum_sq) / n + eps)));
  for (int32_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(static_cast<size_t>(n - i));
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale);
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, weight + i)));
  }
}

void softmax(float* x, int32_t n) {
  __m512 max = _mm512_set1_ps(x[0]);
  for (int32_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(static_cast<size_t>(n - i));
    max = _mm512_mask_max_ps(max, m, max, _mm512_maskz_loadu_ps(m, x + i));
  }
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(max));
  __m512 sum = _mm512_setzero_ps();
  for (int32_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(static_cast<size_t>(n - i));
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), top));
    sum = _mm512_mask_add_ps(sum, m, sum, e);
    _mm512_mask_storeu_ps(x + i, m, e);
  }
  const __m512 inverse = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  for (int32_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(static_cast<size_t>(n - i));
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inverse));
  }
}

void swiglu(const float* gate, const float* up, int32_t n, float* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int32_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(static_cast<size_t>(n - i));
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

// Up to 16 cached keys or values as f32: an f32 cache as stored, an f16
// cache widened by vcvtph2ps (exact), so both caches share one kernel.
__m512 load_kv16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
__m512 load_kv16(const std::uint16_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

// A head's cached rows are `stride` elements apart (all KV heads of a
// position are one row), too far apart for the hardware prefetcher: each
// row's lines are requested kPositionsAhead positions early.
constexpr int32_t kPositionsAhead = 8;

template <class T>
inline void prefetch_row(const T* row, size_t dim) {
  for (size_t b = 0; b < dim * sizeof(T); b += 64) _mm_prefetch(reinterpret_cast<const char*>(row) + b, _MM_HINT_T0);
}

// Four positions at a time so four independent FMA chains hide the latency.
template <class T>
void attention_scores(const float* q, const T* keys, size_t stride, int32_t n_positions, int32_t head_dim,
                      float scale, float* scores) {
  const size_t dim = static_cast<size_t>(head_dim);
  int32_t p = 0;
  auto block = [&]<int NP>(int32_t p0) {
    __m512 acc[NP];
#pragma GCC unroll 4
    for (int k = 0; k < NP; ++k) {
      acc[k] = _mm512_setzero_ps();
      if (p0 + k + kPositionsAhead < n_positions)
        prefetch_row(keys + (static_cast<size_t>(p0) + k + kPositionsAhead) * stride, dim);
    }
    for (size_t i = 0; i < dim; i += 16) {
      const __mmask16 m = mask16(dim - i);
      const __m512 qv = _mm512_maskz_loadu_ps(m, q + i);
#pragma GCC unroll 4
      for (int k = 0; k < NP; ++k)
        acc[k] = _mm512_fmadd_ps(qv, load_kv16(keys + (static_cast<size_t>(p0) + k) * stride + i, m), acc[k]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < NP; ++k) scores[p0 + k] = _mm512_reduce_add_ps(acc[k]) * scale;
  };
  for (; p + 4 <= n_positions; p += 4) block.template operator()<4>(p);
  for (; p < n_positions; ++p) block.template operator()<1>(p);
}

// Output in slices of up to 128 floats held in eight registers while all
// positions stream through once (a 128-wide head reads each row once; slices
// of 64 read every row twice).
template <class T>
void attention_values(const float* weights, const T* values, size_t stride, int32_t n_positions, int32_t head_dim,
                      float* out) {
  const size_t dim = static_cast<size_t>(head_dim);
  auto slice = [&]<int NS>(size_t i) {
    __mmask16 m[NS];
    __m512 acc[NS];
#pragma GCC unroll 8
    for (int k = 0; k < NS; ++k) {
      const size_t at = i + 16 * static_cast<size_t>(k);
      m[k] = at < dim ? mask16(dim - at) : __mmask16(0);
      acc[k] = _mm512_setzero_ps();
    }
    for (int32_t p = 0; p < n_positions; ++p) {
      const __m512 wp = _mm512_set1_ps(weights[p]);
      const T* v = values + static_cast<size_t>(p) * stride + i;
      if (p + kPositionsAhead < n_positions)
        prefetch_row(v + kPositionsAhead * stride, min_size(16 * NS, dim - i));
#pragma GCC unroll 8
      for (int k = 0; k < NS; ++k) acc[k] = _mm512_fmadd_ps(wp, load_kv16(v + 16 * k, m[k]), acc[k]);
    }
#pragma GCC unroll 8
    for (int k = 0; k < NS; ++k) _mm512_mask_storeu_ps(out + i + 16 * k, m[k], acc[k]);
  };
  for (size_t i = 0; i < dim; i += 128) {
    if (dim - i > 64)
      slice.template operator()<8>(i);
    else
      slice.template operator()<4>(i);
  }
}

// vcvtps2ph with round-to-nearest-even in the instruction, not MXCSR's mode:
// the same bits as f32_to_f16.
void convert_f32_to_f16(const float* x, int32_t n, std::uint16_t* out) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int32_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask16(static_cast<size_t>(n - i));
    _mm256_mask_storeu_epi16(out + i, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), kRound));
  }
}

constexpr KernelTable kTable{
    .isa = Isa::Avx512,
    .quantize_activation = quantize_activation,
    .quantize_residual = quantize_residual,
    .matvec = matvec,
    .matmat = matmat,
    .dot = dot,
    .rmsnorm = rmsnorm,
    .softmax = softmax,
    .swiglu = swiglu,
    .attention_scores = attention_scores<float>,
    .attention_values = attention_values<float>,
    .attention_scores_f16 = attention_scores<std::uint16_t>,
    .attention_values_f16 = attention_values<std::uint16_t>,
    .convert_f32_to_f16 = convert_f32_to_f16,
    .stream_prefetch = stream_prefetch_name,
};

}  // namespace

const KernelTable* avx512_kernel_table() { return &kTable; }

}  // namespace colibri::kernels

#endif  // __x86_64__
