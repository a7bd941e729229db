// The AVX2 path (with FMA and F16C; compiled with those flags, see
// engine/CMakeLists.txt). Only reached through the dispatch table after the
// CPU was checked. Everything here has internal linkage; see kernel_table.h.
// The structure follows kernels_avx512.cpp at half the width: 4 rows per
// block with the same per-row instruction sequence as the 1-row remainder, so
// results never depend on how rows were split across threads.
#if defined(__x86_64__)

#include <immintrin.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/kernel_table.h"

namespace colibri::kernels {
namespace {

using std::int32_t;
using std::size_t;

constexpr int kRowBlock = 4;

// Eight -1 then eight 0: loading 8 ints at (8 - len) gives a mask of len lanes.
alignas(64) constexpr int32_t kMaskTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

__m256i mask8(size_t len) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMaskTable + 8 - (len >= 8 ? 8 : len)));
}
size_t min_size(size_t a, size_t b) { return a < b ? a : b; }
int32_t group_count(int32_t cols, int32_t group) { return (cols + group - 1) / group; }

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// `len` (< 32) bytes into a zeroed 32-byte register: AVX2 has no masked byte loads.
__m256i load_bytes_partial(const void* p, size_t len) {
  alignas(32) std::uint8_t buffer[32] = {};
  std::memcpy(buffer, p, len);
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(buffer));
}

// One block of rows ahead; see kernels_avx512.cpp.
inline void prefetch_next_block(const void* row, size_t offset, size_t row_bytes) {
  _mm_prefetch(static_cast<const char*>(row) + offset + kRowBlock * row_bytes, _MM_HINT_T0);
}

template <class Kernel>
void for_row_blocks(int32_t begin, int32_t end, const Kernel& kernel) {
  int32_t r = begin;
  for (; r + kRowBlock <= end; r += kRowBlock) kernel.template operator()<kRowBlock>(r);
  for (; r < end; ++r) kernel.template operator()<1>(r);
}

// ---- f32 / f16 / bf16 weights -----------------------------------------------------

template <WeightFormat F>
__m256 load_weights8(const void* row, size_t c, size_t len) {
  if constexpr (F == WeightFormat::F32) {
    const float* p = static_cast<const float*>(row) + c;
    return len >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask8(len));
  } else {
    const auto* p = static_cast<const std::uint16_t*>(row) + c;
    __m128i half;
    if (len >= 8) {
      half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    } else {
      alignas(16) std::uint16_t buffer[8] = {};
      std::memcpy(buffer, p, 2 * len);
      half = _mm_load_si128(reinterpret_cast<const __m128i*>(buffer));
    }
    if constexpr (F == WeightFormat::F16) return _mm256_cvtph_ps(half);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
  }
}

template <WeightFormat F>
void float_matvec(const Matrix& w, const float* x, float* y, int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t element = F == WeightFormat::F32 ? 4 : 2;
  const auto* base = static_cast<const std::uint8_t*>(w.data);
  for_row_blocks(row_begin, row_end, [&]<int NR>(int32_t r0) {
    const void* rows[NR];
    __m256 acc[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols * element;
      acc[r] = _mm256_setzero_ps();
    }
    for (size_t c = 0; c < cols; c += 8) {
      const size_t len = min_size(8, cols - c);
      const __m256 xv = len == 8 ? _mm256_loadu_ps(x + c) : _mm256_maskload_ps(x + c, mask8(len));
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        if (c % 16 == 0) prefetch_next_block(rows[r], c * element, cols * element);
        acc[r] = _mm256_fmadd_ps(load_weights8<F>(rows[r], c, len), xv, acc[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) y[r0 + r] = hsum(acc[r]);
  });
}

// ---- Q8 weights ---------------------------------------------------------------------

// int8 activations with the sign trick: maddubs needs an unsigned operand, so
// it multiplies |w| by x carrying w's sign. Both stay within [-127, 127], so a
// pair sum is at most 2 * 127 * 128 < 32767 and the int16 step never saturates.
// With the residual plane each weight load feeds a second product.
template <bool Residual>
void q8_int8_matvec(const Matrix& w, const ActivationView& xq, float* y, int32_t row_begin,
                    int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const auto* base = static_cast<const std::int8_t*>(w.data);
  const __m256i ones = _mm256_set1_epi16(1);
  for_row_blocks(row_begin, row_end, [&]<int NR>(int32_t r0) {
    const std::int8_t* rows[NR];
    const float* scales[NR];
    __m256 acc[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
      acc[r] = _mm256_setzero_ps();
    }
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
      if ((g & 15) == 0)  // the scale plane is a stream too: a line per 16 groups
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) prefetch_next_block(scales[r], 4 * static_cast<size_t>(g), 4 * static_cast<size_t>(groups));
      __m256i dot[NR], lo[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) dot[r] = lo[r] = _mm256_setzero_si256();
      for (size_t c = begin; c < end; c += 32) {
        const size_t len = min_size(32, end - c);
        const __m256i xv = len == 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.q + c))
                                     : load_bytes_partial(xq.q + c, len);
        __m256i xl = xv;
        if constexpr (Residual)
          xl = len == 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.residual_q + c))
                         : load_bytes_partial(xq.residual_q + c, len);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          prefetch_next_block(rows[r], c, cols);
          const __m256i wv = len == 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r] + c))
                                       : load_bytes_partial(rows[r] + c, len);
          const __m256i magnitude = _mm256_abs_epi8(wv);
          const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xv, wv));
          dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(pairs, ones));
          if constexpr (Residual)
            lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xl, wv)), ones));
        }
      }
      const float x_scale = xq.scales[g];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), _mm256_set1_ps(scales[r][g] * x_scale), acc[r]);
        if constexpr (Residual)
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[r]), _mm256_set1_ps(scales[r][g] * xq.residual_scales[g]),
                                   acc[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) y[r0 + r] = hsum(acc[r]);
  });
}

void q8_f32_matvec(const Matrix& w, const float* x, float* y, int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const auto* base = static_cast<const std::int8_t*>(w.data);
  for_row_blocks(row_begin, row_end, [&]<int NR>(int32_t r0) {
    const std::int8_t* rows[NR];
    const float* scales[NR];
    __m256 acc[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
      acc[r] = _mm256_setzero_ps();
    }
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
      __m256 partial[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) partial[r] = _mm256_setzero_ps();
      for (size_t c = begin; c < end; c += 8) {
        const size_t len = min_size(8, end - c);
        const __m256 xv = len == 8 ? _mm256_loadu_ps(x + c) : _mm256_maskload_ps(x + c, mask8(len));
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          std::int64_t bytes = 0;
          std::memcpy(&bytes, rows[r] + c, len);
          const __m256 wv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(bytes)));
          partial[r] = _mm256_fmadd_ps(wv, xv, partial[r]);
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[r] = _mm256_fmadd_ps(partial[r], _mm256_set1_ps(scales[r][g]), acc[r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) y[r0 + r] = hsum(acc[r]);
  });
}

// ---- Q4 weights ---------------------------------------------------------------------

// int8 activations; see kernels_avx512.cpp for the layout. Each 32 packed
// bytes (64 columns) give 8 int32 lanes, lane j covering columns [8j, 8j + 8).
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
  __m256 min_acc = _mm256_setzero_ps();
  for (int32_t g = 0; g < groups; g += 8) {
    const __m256i m = mask8(static_cast<size_t>(groups - g));
    const __m256 group_mins = _mm256_maskload_ps(mins + g, m);
    const __m256 x_sum = _mm256_mul_ps(_mm256_maskload_ps(a.scales + g, m),
                                       _mm256_cvtepi32_ps(_mm256_maskload_epi32(a.sums + g, m)));
    min_acc = _mm256_fmadd_ps(group_mins, x_sum, min_acc);
    if constexpr (Residual) {
      const __m256 r_sum = _mm256_mul_ps(_mm256_maskload_ps(a.residual_scales + g, m),
                                         _mm256_cvtepi32_ps(_mm256_maskload_epi32(a.residual_sums + g, m)));
      min_acc = _mm256_fmadd_ps(group_mins, r_sum, min_acc);
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
  return {tail, hsum(min_acc)};
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
  const size_t per_block = group >= 128 ? 1 : 128 / group;
  const __m128i scale_mask = _mm_castps_si128(_mm256_castps256_ps128(_mm256_castsi256_ps(mask8(per_block))));
  alignas(32) int32_t lane_group[2][8];
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 8; ++j)
      lane_group[h][j] = group >= 128 ? 0 : static_cast<int32_t>((64 * h + 8 * j) / group);
  const __m256i spread0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lane_group[0]));
  const __m256i spread1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lane_group[1]));
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);

  for_row_blocks(row_begin, row_end, [&]<int NR>(int32_t r0) {
    const std::uint8_t* rows[NR];
    const float* scales[NR];
    __m256 acc[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * row_bytes;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
      acc[r] = _mm256_setzero_ps();
    }
    for (size_t b = 0; b < blocks; ++b) {
      const size_t g0 = 128 * b / group;
      const std::int8_t* xb = xq.q4 + 128 * b;
      const std::int8_t* rb = Residual ? xq.residual_q4 + 128 * b : xb;
      const __m128 x_scales = _mm_maskload_ps(xq.scales + g0, scale_mask);
      const __m128 r_scales = Residual ? _mm_maskload_ps(xq.residual_scales + g0, scale_mask) : x_scales;
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        prefetch_next_block(rows[r], 64 * b, row_bytes);
        if ((b & 3) == 0) {  // the scale and min planes are streams too: a line per 4 blocks
          prefetch_next_block(scales[r], 4 * g0, 4 * static_cast<size_t>(groups));
          prefetch_next_block(w.mins + (static_cast<size_t>(r0) + r) * groups, 4 * g0, 4 * static_cast<size_t>(groups));
        }
        __m256i dot[2], dot_r[2];
        for (int h = 0; h < 2; ++h) {
          const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r] + 64 * b + 32 * h));
          const __m256i lo = _mm256_and_si256(packed, low4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
          const __m256i x_even = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 32 * h));
          const __m256i x_odd = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 64 + 32 * h));
          // Codes <= 15: each int16 pair sum is below 2 * 15 * 127, two of them fit.
          const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x_even), _mm256_maddubs_epi16(hi, x_odd));
          dot[h] = _mm256_madd_epi16(pairs, ones);
          if constexpr (Residual) {
            const __m256i r_even = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rb + 32 * h));
            const __m256i r_odd = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rb + 64 + 32 * h));
            dot_r[h] = _mm256_madd_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(lo, r_even), _mm256_maddubs_epi16(hi, r_odd)), ones);
          }
        }
        const __m128 w_scales = _mm_maskload_ps(scales[r] + g0, scale_mask);
        const __m256 s256 = _mm256_castps128_ps256(_mm_mul_ps(w_scales, x_scales));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[0]), _mm256_permutevar8x32_ps(s256, spread0), acc[r]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[1]), _mm256_permutevar8x32_ps(s256, spread1), acc[r]);
        if constexpr (Residual) {
          const __m256 r256 = _mm256_castps128_ps256(_mm_mul_ps(w_scales, r_scales));
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_r[0]), _mm256_permutevar8x32_ps(r256, spread0), acc[r]);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_r[1]), _mm256_permutevar8x32_ps(r256, spread1), acc[r]);
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const Q4RowEnd end = q4_row_end<Residual>(rows[r], scales[r], w.mins + (static_cast<size_t>(r0) + r) * groups,
                                                xq, groups, group, cols, blocks);
      y[r0 + r] = hsum(acc[r]) + end.tail + end.mins;
    }
  });
}

// f32 activations, even group sizes: 8 packed bytes give 16 codes per step.
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
    __m256 acc[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * row_bytes;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
      mins[r] = w.mins + (static_cast<size_t>(r0) + r) * groups;
      acc[r] = _mm256_setzero_ps();
    }
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
      __m256 partial[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) partial[r] = _mm256_setzero_ps();
      __m256 x_sum = _mm256_setzero_ps();
      for (size_t c = begin; c < end; c += 16) {
        const size_t len = min_size(16, end - c);
        const __m256 x0 = len >= 8 ? _mm256_loadu_ps(x + c) : _mm256_maskload_ps(x + c, mask8(len));
        const __m256 x1 = len >= 16 ? _mm256_loadu_ps(x + c + 8) : _mm256_maskload_ps(x + c + 8, mask8(len > 8 ? len - 8 : 0));
        x_sum = _mm256_add_ps(x_sum, _mm256_add_ps(x0, x1));
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          std::int64_t bytes = 0;
          std::memcpy(&bytes, rows[r] + c / 2, (len + 1) / 2);
          const __m128i packed = _mm_cvtsi64_si128(bytes);
          const __m128i lo = _mm_and_si128(packed, low4);
          const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low4);
          const __m128i codes = _mm_unpacklo_epi8(lo, hi);
          const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes));
          const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8)));
          partial[r] = _mm256_fmadd_ps(w1, x1, _mm256_fmadd_ps(w0, x0, partial[r]));
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        acc[r] = _mm256_fmadd_ps(partial[r], _mm256_set1_ps(scales[r][g]), acc[r]);
        acc[r] = _mm256_fmadd_ps(x_sum, _mm256_set1_ps(mins[r][g]), acc[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) y[r0 + r] = hsum(acc[r]);
  });
}

// ---- Q8R16 weights --------------------------------------------------------------------
//
// Lanes are rows: one ymm holds 8 rows of a 16-row block, so a block is two
// halves (bytes 0-31 and 32-63 of each 64-byte chunk of 4 columns) and no
// sum ever crosses lanes. Each lane runs the portable definition's operations
// (kernels_scalar.cpp "Q8R16") in its order, so matvec, matmat and the
// portable path agree bit for bit whatever the tiling. matvec is matmat with
// one vector. Per block and group, tiles of vectors go through the group's
// chunks (its weights stay in L1 for all of them); the running sums of every
// vector wait on the stack between groups, since the tile's dot products
// already take most of the 16 registers. Whole blocks are computed; only the
// rows of [row_begin, row_end) are stored.
//
// Blocks follow each other in memory, so a thread's rows are one stream. The
// first tile asks for the line kQ8R16Prefetch bytes ahead of each it reads,
// about what one thread reads from DRAM in a memory latency: +5-10% over the
// hardware prefetcher alone on DRAM-resident matrices (measured). A block
// ahead, as the row-major kernels ask, did as well there but cost a quarter
// of the speed on an L3-resident matrix.
//
// The two-plane and f32 tiles hold 8 int32 dot (or f32 partial) registers.
// sign, maddubs and madd share two pipes on the CPU measured (Zen 5), which
// bounds the int8 kernels; larger tiles only spilled. The one-plane tile
// (q8r16_one_plane) holds one register per vector.
constexpr int32_t kQ8R16Int8Tile = 6;
constexpr int32_t kQ8R16ResidualTile = 2;
constexpr int32_t kQ8R16F32Tile = 4;
constexpr int32_t kQ8R16Chunk = 64;  // vectors whose sums wait on the stack at once
constexpr int32_t kQ8R16PanelMinVectors = 4;
constexpr size_t kQ8R16Prefetch = 2048;

struct Q8R16Sums {
  __m256 half[2];  // rows 0-7 and 8-15 of the block
};

// Tiles of NV vectors, then one tile of the rest.
template <int NV, class Kernel>
void q8r16_rest(const Kernel& kernel, int32_t v, int32_t rest) {
  if constexpr (NV > 0) {
    if (rest == NV) return kernel.template operator()<NV>(v);
    q8r16_rest<NV - 1>(kernel, v, rest);
  }
}

template <int NV, class Kernel>
void q8r16_tiles(int32_t n, const Kernel& kernel) {
  int32_t v = 0;
  for (; v + NV <= n; v += NV) kernel.template operator()<NV>(v);
  if (v < n) q8r16_rest<NV - 1>(kernel, v, n - v);
}

void q8r16_store(float* y, int32_t r0, int32_t row_begin, int32_t row_end, const Q8R16Sums& sums) {
  if (r0 >= row_begin && r0 + kQ8R16Rows <= row_end) {
    _mm256_storeu_ps(y + r0, sums.half[0]);
    _mm256_storeu_ps(y + r0 + 8, sums.half[1]);
    return;
  }
  alignas(32) float rows[kQ8R16Rows];
  _mm256_store_ps(rows, sums.half[0]);
  _mm256_store_ps(rows + 8, sums.half[1]);
  for (int32_t r = r0 > row_begin ? r0 : row_begin; r < row_end && r < r0 + kQ8R16Rows; ++r) y[r] = rows[r - r0];
}

// 4 activation bytes into every dword: each row's lane meets the same 4 columns.
__m256i broadcast4(const std::int8_t* p) {
  int32_t value;
  std::memcpy(&value, p, 4);
  return _mm256_set1_epi32(value);
}

// dot += the 4-column products of 8 rows (their weights w, |w| given) with
// 4 activations broadcast to every lane; exact in int32.
__m256i q8r16_dot4(__m256i dot, __m256i w, __m256i magnitude, __m256i x, __m256i ones) {
  return _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(x, w)), ones));
}

// The scale product is rounded on its own, then one fused step: std::fma(d, ws * xs, acc).
__m256 q8r16_scale_step(__m256 acc, __m256i dot, __m256 w_scale, float x_scale) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(w_scale, _mm256_set1_ps(x_scale)), acc);
}

// Both planes' steps (kernels_scalar.cpp): for groups up to
// kQ8R16CombinedMaxGroup the dots added exactly in int32 and one step.
__m256 q8r16_planes_step(__m256 acc, __m256i dot, __m256i lo, __m256 w_scale, const ActivationView& a, int32_t g,
                         bool combined) {
  static_assert(kResidualRatio == 1 << 7);
  if (combined) return q8r16_scale_step(acc, _mm256_add_epi32(_mm256_slli_epi32(dot, 7), lo), w_scale, a.residual_scales[g]);
  return q8r16_scale_step(q8r16_scale_step(acc, dot, w_scale, a.scales[g]), lo, w_scale, a.residual_scales[g]);
}

// One group of a panel of 16-row blocks, as the int8 kernels' tiles see it.
struct Q8R16Group {
  const std::int8_t* block;  // the first block's first chunk
  const float* scales;       // the group's 16 row scales in the first block
  size_t begin, end;         // its columns; end is a multiple of 4 (whole chunks)
  int32_t g;
  int32_t blocks;             // in the panel, each block_stride bytes and scale_stride scales after the last
  size_t block_stride, scale_stride;
};

// The walk the int8 kernels share: chunks of up to kQ8R16Chunk vectors,
// panels of up to kPanel 16-row blocks, groups in order, and per group tiles
// of up to kTile vectors: tile<NV>(group, vectors, their sums, first) adds
// the group's steps to the sums of every block of the panel (block b's at
// sums[b * kQ8R16Chunk + v]; `first`: the group's first tile, which
// prefetches). Columns past `cols` up to the chunk's end are zero in the
// weights (and in q, which is zero-padded to 128), so whole chunks are exact.
// Only a tile that walks at.blocks blocks may be given kPanel > 1 (the
// others read the first block only). Fewer than kQ8R16PanelMinVectors
// vectors take panels of one block: their product is bound by DRAM, which
// reads one stream faster than a panel's interleaved ones (two vectors, two
// planes: 0.75x with panels of 8).
template <int kTile, int kPanel = 1, class Tile>
void q8r16_walk(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y, int32_t row_begin,
                int32_t row_end, const Tile& tile) {
  const size_t cols4 = (static_cast<size_t>(w.cols) + 3) / 4 * 4;
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const size_t block_stride = kQ8R16Rows * cols4;
  const size_t scale_stride = kQ8R16Rows * static_cast<size_t>(groups);
  const auto* base = static_cast<const std::int8_t*>(w.data);
  Q8R16Sums acc[kPanel * kQ8R16Chunk];
  for (int32_t first = 0; first < n; first += kQ8R16Chunk) {
    const int32_t count = n - first < kQ8R16Chunk ? n - first : kQ8R16Chunk;
    const ActivationView* const* xs = xq + first;
    const int32_t panel = count < kQ8R16PanelMinVectors ? 1 : kPanel;
    for (int32_t r0 = row_begin / kQ8R16Rows * kQ8R16Rows; r0 < row_end; r0 += panel * kQ8R16Rows) {
      const int32_t left = (row_end - r0 + kQ8R16Rows - 1) / kQ8R16Rows;
      const int32_t blocks = left < panel ? left : panel;
      const std::int8_t* block = base + static_cast<size_t>(r0) * cols4;
      const float* block_scales = w.scales + static_cast<size_t>(r0) * static_cast<size_t>(groups);
      for (int32_t b = 0; b < blocks; ++b)
        for (int32_t v = 0; v < count; ++v)
          acc[b * kQ8R16Chunk + v].half[0] = acc[b * kQ8R16Chunk + v].half[1] = _mm256_setzero_ps();
      for (int32_t g = 0; g < groups; ++g) {
        const size_t begin = static_cast<size_t>(g) * group;
        const Q8R16Group at{block,  block_scales + static_cast<size_t>(g) * kQ8R16Rows,
                            begin,  min_size(cols4, begin + group),
                            g,      blocks,
                            block_stride, scale_stride};
        // The scale plane is a second stream: its lines for this group in the next panel.
        for (int32_t b = 0; b < blocks; ++b)
          _mm_prefetch(reinterpret_cast<const char*>(at.scales + (panel + b) * scale_stride), _MM_HINT_T0);
        q8r16_tiles<kTile>(count, [&]<int NV>(int32_t v0) {
          tile.template operator()<NV>(at, xs + v0, acc + v0, v0 == 0);
        });
      }
      for (int32_t b = 0; b < blocks; ++b)
        for (int32_t v = 0; v < count; ++v)
          q8r16_store(y[first + v], r0 + b * kQ8R16Rows, row_begin, row_end, acc[b * kQ8R16Chunk + v]);
    }
  }
}

// One int8 plane, with the sign trick of q8_int8_matvec. A tile walks the
// group once per half block, so its NV dot registers are all it holds and 6
// vectors fit in the 16 registers; walking both halves at once (8 sums for 4
// vectors) spilled and reloaded the activation pointers (Zen 3: 1.1-1.2x at
// 4-16 vectors, docs/KERNELS.md).
void q8r16_one_plane(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y, int32_t row_begin,
                     int32_t row_end) {
  const __m256i ones = _mm256_set1_epi16(1);
  auto tile = [&]<int NV>(const Q8R16Group& at, const ActivationView* const* xs, Q8R16Sums* sums, bool first) {
    const std::int8_t* q[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) q[v] = xs[v]->q;
    for (int h = 0; h < 2; ++h) {
      __m256i dot[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) dot[v] = _mm256_setzero_si256();
      for (size_t c = at.begin; c < at.end; c += 4) {
        const std::int8_t* half = at.block + c * kQ8R16Rows + 32 * h;
        if (first && h == 0) _mm_prefetch(reinterpret_cast<const char*>(half + kQ8R16Prefetch), _MM_HINT_T0);
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(half));
        const __m256i magnitude = _mm256_abs_epi8(wv);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) dot[v] = q8r16_dot4(dot[v], wv, magnitude, broadcast4(q[v] + c), ones);
      }
      const __m256 w_scale = _mm256_loadu_ps(at.scales + 8 * h);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        sums[v].half[h] = q8r16_scale_step(sums[v].half[h], dot[v], w_scale, xs[v]->scales[at.g]);
    }
  };
  q8r16_walk<kQ8R16Int8Tile>(w, n, xq, y, row_begin, row_end, tile);
}

// Both int8 planes, each with the sign trick: the decode streams' leftover
// blocks, and groups above kQ8R16CombinedMaxGroup (q8r16_combined takes the rest).
void q8r16_two_planes(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y, int32_t row_begin,
                      int32_t row_end) {
  const __m256i ones = _mm256_set1_epi16(1);
  const bool combined = w.group <= kQ8R16CombinedMaxGroup;
  auto tile = [&]<int NV>(const Q8R16Group& at, const ActivationView* const* xs, Q8R16Sums* sums, bool first) {
    __m256i dot[NV][2], lo[NV][2];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) dot[v][0] = dot[v][1] = lo[v][0] = lo[v][1] = _mm256_setzero_si256();
    for (size_t c = at.begin; c < at.end; c += 4) {
      const std::int8_t* chunk = at.block + c * kQ8R16Rows;
      if (first) _mm_prefetch(reinterpret_cast<const char*>(chunk + kQ8R16Prefetch), _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32 * h));
        const __m256i magnitude = _mm256_abs_epi8(wv);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          dot[v][h] = q8r16_dot4(dot[v][h], wv, magnitude, broadcast4(xs[v]->q + c), ones);
          lo[v][h] = q8r16_dot4(lo[v][h], wv, magnitude, broadcast4(xs[v]->residual_q + c), ones);
        }
      }
    }
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      for (int h = 0; h < 2; ++h) {
        const __m256 w_scale = _mm256_loadu_ps(at.scales + 8 * h);
        sums[v].half[h] = q8r16_planes_step(sums[v].half[h], dot[v][h], lo[v][h], w_scale, *xs[v], at.g, combined);
      }
    }
  };
  q8r16_walk<kQ8R16ResidualTile>(w, n, xq, y, row_begin, row_end, tile);
}

template <bool Residual>
void q8r16_int8(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y, int32_t row_begin,
                int32_t row_end) {
  if constexpr (Residual) return q8r16_two_planes(w, n, xq, y, row_begin, row_end);
  else return q8r16_one_plane(w, n, xq, y, row_begin, row_end);
}

// Both planes, groups up to kQ8R16CombinedMaxGroup: the definition's exact
// kResidualRatio * dot + lo is the dot of the weights with one int16
// activation per column, 128 q + residual_q (|.| <= 127 * 128 + 64 < 2^15).
// madd of the sign-extended weights with it takes 2 multiplies and 2 adds per
// 32 weights and vector, where the sign trick takes 8 operations (sign,
// maddubs, madd and add per plane): a prompt's q/k/v and down products are
// bound by those operations, not by memory (Zen 3: 1.5-1.7x at 8-64 vectors,
// docs/KERNELS.md). A lone vector still takes q8r16_int8_streams, which reads
// from DRAM at the same speed either way (measured). Each row's column pairs
// land in two neighbouring int32 lanes, added (exactly) once per group. Tiles
// walk a group once per half block: two sums per vector and 4 vectors (6
// ran slower). A tile's int16 activations serve a panel of 8 blocks, not one
// (building them was a sixth of the kernel's time; Zen 3: 1.1-1.2x at 16-64
// vectors, docs/KERNELS.md).
constexpr int32_t kQ8R16CombinedTile = 4;
constexpr int32_t kQ8R16CombinedPanel = 8;

// Columns [begin, end) of x as 128 q + residual_q. end is a multiple of 4
// (the chunks'); past the row's columns q and residual_q are zero.
void combine_planes(const ActivationView& a, size_t begin, size_t end, int16_t* out) {
  size_t c = begin;
  for (; c + 16 <= end; c += 16) {
    const __m256i q = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.q + c)));
    const __m256i lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.residual_q + c)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (c - begin)), _mm256_add_epi16(_mm256_slli_epi16(q, 7), lo));
  }
  for (; c < end; ++c) out[c - begin] = static_cast<int16_t>(a.q[c] * kResidualRatio + a.residual_q[c]);
}

// 4 int16 activations into every 64 bits: each row's two lanes meet columns c..c+3.
__m256i broadcast4_int16(const int16_t* p) {
  int64_t value;
  std::memcpy(&value, p, 8);
  return _mm256_set1_epi64x(value);
}

// Rows 0-3 and 4-7 of a half, two int32 lanes per row, into each row's sum in row order.
__m256i row_sums(__m256i rows03, __m256i rows47) {
  return _mm256_permute4x64_epi64(_mm256_hadd_epi32(rows03, rows47), 0xD8);
}

void q8r16_combined(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y, int32_t row_begin,
                    int32_t row_end) {
  alignas(32) int16_t planes[kQ8R16CombinedTile][kQ8R16CombinedMaxGroup];
  auto tile = [&]<int NV>(const Q8R16Group& at, const ActivationView* const* xs, Q8R16Sums* sums, bool first) {
    for (int v = 0; v < NV; ++v) combine_planes(*xs[v], at.begin, at.end, planes[v]);
    for (int32_t b = 0; b < at.blocks; ++b) {
      const std::int8_t* block = at.block + b * at.block_stride;
      Q8R16Sums* block_sums = sums + b * kQ8R16Chunk;
      for (int h = 0; h < 2; ++h) {
        __m256i rows03[NV], rows47[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) rows03[v] = rows47[v] = _mm256_setzero_si256();
        for (size_t c = at.begin; c < at.end; c += 4) {
          const std::int8_t* half = block + c * kQ8R16Rows + 32 * h;
          if (first && h == 0) _mm_prefetch(reinterpret_cast<const char*>(half + kQ8R16Prefetch), _MM_HINT_T0);
          const __m256i w03 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(half)));
          const __m256i w47 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(half + 16)));
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) {
            const __m256i x = broadcast4_int16(planes[v] + (c - at.begin));
            rows03[v] = _mm256_add_epi32(rows03[v], _mm256_madd_epi16(w03, x));
            rows47[v] = _mm256_add_epi32(rows47[v], _mm256_madd_epi16(w47, x));
          }
        }
        const __m256 w_scale = _mm256_loadu_ps(at.scales + b * at.scale_stride + 8 * h);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
          block_sums[v].half[h] = q8r16_scale_step(block_sums[v].half[h], row_sums(rows03[v], rows47[v]), w_scale,
                                                   xs[v]->residual_scales[at.g]);
      }
    }
  };
  q8r16_walk<kQ8R16CombinedTile, kQ8R16CombinedPanel>(w, n, xq, y, row_begin, row_end, tile);
}

// One vector (decode): two distant runs of blocks read side by side, one
// block of each per step, as on AVX-512 (one sequential stream per thread
// reads well below the memory's rate). Each lane's arithmetic is
// q8r16_int8's; blocks left over go through it.
template <bool Residual>
void q8r16_int8_streams(const Matrix& w, const ActivationView* xq, float* y, int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t cols4 = (cols + 3) / 4 * 4;
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const auto* base = static_cast<const std::int8_t*>(w.data);
  const __m256i ones = _mm256_set1_epi16(1);
  const bool combined = w.group <= kQ8R16CombinedMaxGroup;
  const ActivationView& a = *xq;
  const int32_t first = row_begin / kQ8R16Rows, blocks = (row_end - 1) / kQ8R16Rows - first + 1;
  const int32_t run = blocks / 2;
  for (int32_t i = 0; i < run; ++i) {
    const int32_t r0[2] = {(first + i) * kQ8R16Rows, (first + run + i) * kQ8R16Rows};
    const std::int8_t* block[2];
    const float* block_scales[2];
    Q8R16Sums acc[2];
    for (int k = 0; k < 2; ++k) {
      block[k] = base + static_cast<size_t>(r0[k]) * cols4;
      block_scales[k] = w.scales + static_cast<size_t>(r0[k]) * static_cast<size_t>(groups);
      acc[k].half[0] = acc[k].half[1] = _mm256_setzero_ps();
    }
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
      __m256i dot[2][2], lo[2][2];
      for (int k = 0; k < 2; ++k) {
        _mm_prefetch(reinterpret_cast<const char*>(block_scales[k] + (static_cast<size_t>(g) + 8) * kQ8R16Rows),
                     _MM_HINT_T0);
        dot[k][0] = dot[k][1] = lo[k][0] = lo[k][1] = _mm256_setzero_si256();
      }
      for (size_t c = begin; c < end; c += 4) {
        const __m256i xv = broadcast4(a.q + c);
        const __m256i xl = Residual ? broadcast4(a.residual_q + c) : xv;
#pragma GCC unroll 2
        for (int k = 0; k < 2; ++k) {
          const std::int8_t* chunk = block[k] + c * kQ8R16Rows;
          _mm_prefetch(reinterpret_cast<const char*>(chunk + kQ8R16Prefetch), _MM_HINT_T0);
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) {
            const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32 * h));
            const __m256i magnitude = _mm256_abs_epi8(wv);
            dot[k][h] = q8r16_dot4(dot[k][h], wv, magnitude, xv, ones);
            if constexpr (Residual) lo[k][h] = q8r16_dot4(lo[k][h], wv, magnitude, xl, ones);
          }
        }
      }
      for (int k = 0; k < 2; ++k) {
        const float* ws = block_scales[k] + static_cast<size_t>(g) * kQ8R16Rows;
        for (int h = 0; h < 2; ++h) {
          const __m256 w_scale = _mm256_loadu_ps(ws + 8 * h);
          if constexpr (Residual)
            acc[k].half[h] = q8r16_planes_step(acc[k].half[h], dot[k][h], lo[k][h], w_scale, a, g, combined);
          else
            acc[k].half[h] = q8r16_scale_step(acc[k].half[h], dot[k][h], w_scale, a.scales[g]);
        }
      }
    }
    for (int k = 0; k < 2; ++k) q8r16_store(y, r0[k], row_begin, row_end, acc[k]);
  }
  const int32_t rest_begin = (first + 2 * run) * kQ8R16Rows;
  if (rest_begin < row_end)
    q8r16_int8<Residual>(w, 1, &xq, &y, rest_begin > row_begin ? rest_begin : row_begin, row_end);
}

// Column J of each row's 4 bytes, sign-extended and converted (exactly).
template <int J>
__m256 q8r16_column(__m256i w) {
  if constexpr (J == 3) return _mm256_cvtepi32_ps(_mm256_srai_epi32(w, 24));
  return _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(w, 24 - 8 * J), 24));
}

// f32 activations: one fused step per column, columns in order, as the
// definition's partial sum. x is never read past cols, so the last chunk
// takes only its real columns.
void q8r16_f32(const Matrix& w, int32_t n, const float* const* x, float* const* y, int32_t row_begin,
               int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t cols4 = (cols + 3) / 4 * 4;
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const auto* base = static_cast<const std::int8_t*>(w.data);
  Q8R16Sums acc[kQ8R16Chunk];
  for (int32_t first = 0; first < n; first += kQ8R16Chunk) {
    const int32_t count = n - first < kQ8R16Chunk ? n - first : kQ8R16Chunk;
    const float* const* xs = x + first;
    for (int32_t r0 = row_begin / kQ8R16Rows * kQ8R16Rows; r0 < row_end; r0 += kQ8R16Rows) {
      const std::int8_t* block = base + static_cast<size_t>(r0) * cols4;
      const float* block_scales = w.scales + static_cast<size_t>(r0) * static_cast<size_t>(groups);
      for (int32_t v = 0; v < count; ++v) acc[v].half[0] = acc[v].half[1] = _mm256_setzero_ps();
      for (int32_t g = 0; g < groups; ++g) {
        const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
        const float* ws = block_scales + static_cast<size_t>(g) * kQ8R16Rows;
        _mm_prefetch(reinterpret_cast<const char*>(ws + kQ8R16Rows * static_cast<size_t>(groups)), _MM_HINT_T0);
        q8r16_tiles<kQ8R16F32Tile>(count, [&]<int NV>(int32_t v0) {
          __m256 partial[NV][2];
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) partial[v][0] = partial[v][1] = _mm256_setzero_ps();
          for (size_t c = begin; c < end; c += 4) {
            const std::int8_t* chunk = block + c * kQ8R16Rows;
            if (v0 == 0) _mm_prefetch(reinterpret_cast<const char*>(chunk + kQ8R16Prefetch), _MM_HINT_T0);
            const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk));
            const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32));
            auto column = [&]<int J>() {
              const __m256 c0 = q8r16_column<J>(w0), c1 = q8r16_column<J>(w1);
#pragma GCC unroll 4
              for (int v = 0; v < NV; ++v) {
                const __m256 xv = _mm256_set1_ps(xs[v0 + v][c + J]);
                partial[v][0] = _mm256_fmadd_ps(c0, xv, partial[v][0]);
                partial[v][1] = _mm256_fmadd_ps(c1, xv, partial[v][1]);
              }
            };
            const size_t len = min_size(4, end - c);
            column.template operator()<0>();
            if (len > 1) column.template operator()<1>();
            if (len > 2) column.template operator()<2>();
            if (len > 3) column.template operator()<3>();
          }
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v)
            for (int h = 0; h < 2; ++h)
              acc[v0 + v].half[h] = _mm256_fmadd_ps(partial[v][h], _mm256_loadu_ps(ws + 8 * h), acc[v0 + v].half[h]);
        });
      }
      for (int32_t v = 0; v < count; ++v) q8r16_store(y[first + v], r0, row_begin, row_end, acc[v]);
    }
  }
}

// ---- Q4R16 weights --------------------------------------------------------------------
//
// Q8R16's walk over 4-bit codes. A 64-byte chunk holds 8 columns of a 16-row
// block, rows 0-7 in bytes 0-31 and rows 8-15 in 32-63; the low nibbles of a
// row's dword are columns c..c+3, the high nibbles c+4..c+7 (weight_format.h).
// An AND and a shift give two maddubs operands, the codes (0..15) as the
// unsigned side against 4 activations broadcast to every dword, so no sign
// trick is needed. An int16 lane of maddubs is two products (|.| <= 2 * 15 *
// 127), so the lanes of up to 4 chunks (32 columns: |.| <= 16 * 15 * 127 =
// 30480) add exactly in int16 before one madd widens them to the row's int32:
// 8 columns of 8 rows cost two maddubs and two adds (Q8R16: two each of sign,
// maddubs, madd and add; measured, madd per chunk here was 10-25 % slower).
// Scales and minimums are f16, widened by vcvtph2ps (exact). Each lane runs
// the portable definition (kernels_scalar.cpp "Q4R16") in its order, so
// every split and tiling gives its bits. f32 activations go to the portable
// kernel, as on AVX-512.
//
// A group is walked once per half block (the second half reads the group's
// lines from L1), so a tile holds one int32 and one int16 register per
// vector and plane: tiles of 4 vectors, 2 with the residual plane (3 and 3
// measured slower).
constexpr int32_t kQ4R16Int8Tile = 4;
constexpr int32_t kQ4R16ResidualTile = 2;
constexpr size_t kQ4R16Prefetch = 1024;  // bytes ahead in the block stream (half Q8R16's, as on AVX-512)
constexpr size_t kQ4R16Int16Columns = 32;  // columns summed in int16 before madd

struct Q4R16Block {
  const std::uint8_t* values;   // the block's first byte
  const std::uint16_t* scales;  // its group 0: 16 f16 values per group
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

// pairs += the int16 pair sums of 8 columns of 8 rows (codes low: columns
// c..c+3, high: c+4..c+7) with the activations at x (column c).
__m256i q4r16_pairs8(__m256i pairs, __m256i low, __m256i high, const std::int8_t* x) {
  pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(low, broadcast4(x)));
  return _mm256_add_epi16(pairs, _mm256_maddubs_epi16(high, broadcast4(x + 4)));
}

// 8 f16 values widened (exactly).
__m256 load_f16x8(const std::uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Group g (columns [begin, end)) of S blocks with NV vectors, added to
// sums[k * NV + v] (block k, vector v). Columns past `cols` up to the chunk's
// end hold code 0 and activation 0 (q is zero-padded to 128), so whole
// chunks are exact. With `prefetch` the first half asks for the line
// kQ4R16Prefetch bytes ahead of each chunk.
template <bool Residual, int NV, int S>
void q4r16_group(const Q4R16Block* blocks, size_t begin, size_t end, int32_t g, const ActivationView* const* xs,
                 Q8R16Sums* sums, bool prefetch) {
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  const size_t slot = static_cast<size_t>(g) * kQ4R16Rows;
  for (int h = 0; h < 2; ++h) {
    __m256i dot[S][NV], lo[S][NV];
#pragma GCC unroll 4
    for (int k = 0; k < S; ++k)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) dot[k][v] = lo[k][v] = _mm256_setzero_si256();
    for (size_t c = begin; c < end;) {
      const size_t stop = min_size(end, c + kQ4R16Int16Columns);
      __m256i pairs[S][NV], pairs_lo[S][NV];
#pragma GCC unroll 4
      for (int k = 0; k < S; ++k)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) pairs[k][v] = pairs_lo[k][v] = _mm256_setzero_si256();
      for (; c < stop; c += 8) {
#pragma GCC unroll 4
        for (int k = 0; k < S; ++k) {
          const std::uint8_t* chunk = blocks[k].values + c * (kQ4R16Rows / 2);
          if (prefetch && h == 0) _mm_prefetch(reinterpret_cast<const char*>(chunk + kQ4R16Prefetch), _MM_HINT_T0);
          const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32 * h));
          const __m256i low = _mm256_and_si256(wv, nibble);
          const __m256i high = _mm256_and_si256(_mm256_srli_epi16(wv, 4), nibble);
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) {
            pairs[k][v] = q4r16_pairs8(pairs[k][v], low, high, xs[v]->q + c);
            if constexpr (Residual) pairs_lo[k][v] = q4r16_pairs8(pairs_lo[k][v], low, high, xs[v]->residual_q + c);
          }
        }
      }
#pragma GCC unroll 4
      for (int k = 0; k < S; ++k)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          dot[k][v] = _mm256_add_epi32(dot[k][v], _mm256_madd_epi16(pairs[k][v], ones));
          if constexpr (Residual) lo[k][v] = _mm256_add_epi32(lo[k][v], _mm256_madd_epi16(pairs_lo[k][v], ones));
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < S; ++k) {
      const __m256 w_scale = load_f16x8(blocks[k].scales + slot + 8 * h);
      const __m256 w_min = load_f16x8(blocks[k].mins + slot + 8 * h);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        const ActivationView& a = *xs[v];
        __m256& s = sums[k * NV + v].half[h];
        // fma(d, ws * xs, acc), then fma(w_min, xs * sum(x), acc); the residual plane's two right after.
        s = q8r16_scale_step(s, dot[k][v], w_scale, a.scales[g]);
        s = _mm256_fmadd_ps(w_min, _mm256_set1_ps(a.scales[g] * static_cast<float>(a.sums[g])), s);
        if constexpr (Residual) {
          s = q8r16_scale_step(s, lo[k][v], w_scale, a.residual_scales[g]);
          s = _mm256_fmadd_ps(w_min, _mm256_set1_ps(a.residual_scales[g] * static_cast<float>(a.residual_sums[g])), s);
        }
      }
    }
  }
}

// Tiles of vectors per block and group, as q8r16_int8.
template <bool Residual>
void q4r16_int8(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y, int32_t row_begin,
                int32_t row_end) {
  constexpr int32_t kTile = Residual ? kQ4R16ResidualTile : kQ4R16Int8Tile;
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const Q4R16Blocks at(w, groups);
  Q8R16Sums acc[kQ8R16Chunk];
  for (int32_t first = 0; first < n; first += kQ8R16Chunk) {
    const int32_t count = n - first < kQ8R16Chunk ? n - first : kQ8R16Chunk;
    const ActivationView* const* xs = xq + first;
    for (int32_t b = row_begin / kQ4R16Rows; b * kQ4R16Rows < row_end; ++b) {
      const Q4R16Block block = at[b];
      for (int32_t v = 0; v < count; ++v) acc[v].half[0] = acc[v].half[1] = _mm256_setzero_ps();
      for (int32_t g = 0; g < groups; ++g) {
        const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
        // The scale and minimum planes are streams too: this group's line in the next block.
        const size_t next = (static_cast<size_t>(groups) + static_cast<size_t>(g)) * kQ4R16Rows;
        _mm_prefetch(reinterpret_cast<const char*>(block.scales + next), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(block.mins + next), _MM_HINT_T0);
        q8r16_tiles<kTile>(count, [&]<int NV>(int32_t v0) {
          q4r16_group<Residual, NV, 1>(&block, begin, end, g, xs + v0, acc + v0, v0 == 0);
        });
      }
      for (int32_t v = 0; v < count; ++v) q8r16_store(y[first + v], b * kQ4R16Rows, row_begin, row_end, acc[v]);
    }
  }
}

// One vector (decode): two distant runs of blocks side by side, as
// q8r16_int8_streams; blocks left over go through q4r16_int8.
template <bool Residual>
void q4r16_int8_streams(const Matrix& w, const ActivationView* xq, float* y, int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const Q4R16Blocks at(w, groups);
  const int32_t first = row_begin / kQ4R16Rows, blocks = (row_end - 1) / kQ4R16Rows - first + 1;
  const int32_t run = blocks / 2;
  for (int32_t i = 0; i < run; ++i) {
    const int32_t b[2] = {first + i, first + run + i};
    const Q4R16Block block[2] = {at[b[0]], at[b[1]]};
    Q8R16Sums acc[2];
    for (int k = 0; k < 2; ++k) acc[k].half[0] = acc[k].half[1] = _mm256_setzero_ps();
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
      for (int k = 0; k < 2; ++k) {
        const size_t ahead = (static_cast<size_t>(g) + 16) * kQ4R16Rows;
        _mm_prefetch(reinterpret_cast<const char*>(block[k].scales + ahead), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(block[k].mins + ahead), _MM_HINT_T0);
      }
      q4r16_group<Residual, 1, 2>(block, begin, end, g, &xq, acc, true);
    }
    for (int k = 0; k < 2; ++k) q8r16_store(y, b[k] * kQ4R16Rows, row_begin, row_end, acc[k]);
  }
  const int32_t rest_begin = (first + 2 * run) * kQ4R16Rows;
  if (rest_begin < row_end)
    q4r16_int8<Residual>(w, 1, &xq, &y, rest_begin > row_begin ? rest_begin : row_begin, row_end);
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
      if (xq != nullptr && xq->residual_q != nullptr) return q8r16_int8_streams<true>(w, xq, y, row_begin, row_end);
      if (xq != nullptr) return q8r16_int8_streams<false>(w, xq, y, row_begin, row_end);
      return q8r16_f32(w, 1, &x, &y, row_begin, row_end);
    case WeightFormat::Q4R16:  // f32 activations: the portable kernel
      if (xq != nullptr && xq->residual_q != nullptr) return q4r16_int8_streams<true>(w, xq, y, row_begin, row_end);
      if (xq != nullptr) return q4r16_int8_streams<false>(w, xq, y, row_begin, row_end);
      break;
    case WeightFormat::Q4:
      if (xq != nullptr && q4_int8_supported(w.group)) {
        if (xq->residual_q != nullptr) return q4_int8_matvec<true>(w, *xq, y, row_begin, row_end);
        return q4_int8_matvec<false>(w, *xq, y, row_begin, row_end);
      }
      if (xq == nullptr && w.group % 2 == 0) return q4_f32_matvec(w, x, y, row_begin, row_end);
      break;
  }
  scalar_kernel_table()->matvec(w, x, xq, y, row_begin, row_end);
}

// ---- matrix x several vectors (matmat) ------------------------------------------------
//
// Each kernel mirrors the matvec above it with a second tile dimension: NR
// rows x NV vectors, a row's weights loaded (and sign-split or converted)
// once per chunk for all NV vectors. Every (row, vector) pair keeps its own
// accumulator and runs exactly matvec's instruction sequence for that row,
// so each result is bit-identical to matvec's. With 16 registers the tile is
// 4 rows x 2 vectors. Row blocks are the outer loop, so a block's weights
// stay in L1 while every vector tile goes through them; only the first tile
// prefetches the next block.
constexpr int kVectorTile = 2;

template <int NR, int NV, class Kernel>
void vector_rest(const Kernel& kernel, int32_t r0, int32_t v0, int32_t rest) {
  if constexpr (NV > 1) {
    if (rest == NV - 1) return kernel.template operator()<NR, NV - 1>(r0, v0);
    vector_rest<NR, NV - 1>(kernel, r0, v0, rest);
  }
}

template <class Kernel>
void for_tiles(int32_t begin, int32_t end, int32_t n, const Kernel& kernel) {
  auto row_block = [&]<int NR>(int32_t r0) {
    int32_t v = 0;
    for (; v + kVectorTile <= n; v += kVectorTile) kernel.template operator()<NR, kVectorTile>(r0, v);
    if (v < n) vector_rest<NR, kVectorTile>(kernel, r0, v, n - v);
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
  for_tiles(row_begin, row_end, n, [&]<int NR, int NV>(int32_t r0, int32_t v0) {
    const bool prefetch = v0 == 0;
    const void* rows[NR];
    __m256 acc[NR][NV];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols * element;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
    }
    for (size_t c = 0; c < cols; c += 8) {
      const size_t len = min_size(8, cols - c);
      __m256 xv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) xv[v] = len == 8 ? _mm256_loadu_ps(x[v0 + v] + c) : _mm256_maskload_ps(x[v0 + v] + c, mask8(len));
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        if (prefetch && c % 16 == 0) prefetch_next_block(rows[r], c * element, cols * element);
        const __m256 wv = load_weights8<F>(rows[r], c, len);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(wv, xv[v], acc[r][v]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) y[v0 + v][r0 + r] = hsum(acc[r][v]);
  });
}

// Rows one at a time within a group, NV running dot products each; |w| is
// taken once per chunk for all vectors.
template <bool Residual>
void q8_int8_matmat(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y,
                    int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const auto* base = static_cast<const std::int8_t*>(w.data);
  const __m256i ones = _mm256_set1_epi16(1);
  for_tiles(row_begin, row_end, n, [&]<int NR, int NV>(int32_t r0, int32_t v0) {
    const bool prefetch = v0 == 0;
    const std::int8_t* rows[NR];
    const float* scales[NR];
    const ActivationView* xs[NV];
    __m256 acc[NR][NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) xs[v] = xq[v0 + v];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
    }
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
      if (prefetch && (g & 15) == 0)
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) prefetch_next_block(scales[r], 4 * static_cast<size_t>(g), 4 * static_cast<size_t>(groups));
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        __m256i dot[NV], lo[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) dot[v] = lo[v] = _mm256_setzero_si256();
        for (size_t c = begin; c < end; c += 32) {
          const size_t len = min_size(32, end - c);
          if (prefetch) prefetch_next_block(rows[r], c, cols);
          const __m256i wv = len == 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r] + c))
                                       : load_bytes_partial(rows[r] + c, len);
          const __m256i magnitude = _mm256_abs_epi8(wv);
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) {
            const __m256i xv = len == 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[v]->q + c))
                                         : load_bytes_partial(xs[v]->q + c, len);
            dot[v] = _mm256_add_epi32(dot[v], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xv, wv)), ones));
            if constexpr (Residual) {
              const __m256i xl = len == 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[v]->residual_q + c))
                                           : load_bytes_partial(xs[v]->residual_q + c, len);
              lo[v] = _mm256_add_epi32(lo[v], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xl, wv)), ones));
            }
          }
        }
        const float w_scale = scales[r][g];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[v]), _mm256_set1_ps(w_scale * xs[v]->scales[g]), acc[r][v]);
          if constexpr (Residual)
            acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[v]), _mm256_set1_ps(w_scale * xs[v]->residual_scales[g]),
                                        acc[r][v]);
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) y[v0 + v][r0 + r] = hsum(acc[r][v]);
  });
}

void q8_f32_matmat(const Matrix& w, int32_t n, const float* const* x, float* const* y, int32_t row_begin,
                   int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const auto* base = static_cast<const std::int8_t*>(w.data);
  for_tiles(row_begin, row_end, n, [&]<int NR, int NV>(int32_t r0, int32_t v0) {
    const std::int8_t* rows[NR];
    const float* scales[NR];
    __m256 acc[NR][NV];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
    }
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        __m256 partial[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) partial[v] = _mm256_setzero_ps();
        for (size_t c = begin; c < end; c += 8) {
          const size_t len = min_size(8, end - c);
          std::int64_t bytes = 0;
          std::memcpy(&bytes, rows[r] + c, len);
          const __m256 wv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(bytes)));
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) {
            const __m256 xv = len == 8 ? _mm256_loadu_ps(x[v0 + v] + c) : _mm256_maskload_ps(x[v0 + v] + c, mask8(len));
            partial[v] = _mm256_fmadd_ps(wv, xv, partial[v]);
          }
        }
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(partial[v], _mm256_set1_ps(scales[r][g]), acc[r][v]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) y[v0 + v][r0 + r] = hsum(acc[r][v]);
  });
}

// Per block the nibbles of a row are split once for all vectors.
template <bool Residual>
void q4_int8_matmat(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y,
                    int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const size_t row_bytes = (cols + 1) / 2;
  const size_t blocks = cols / 128;
  const auto* base = static_cast<const std::uint8_t*>(w.data);
  const size_t per_block = group >= 128 ? 1 : 128 / group;
  const __m128i scale_mask = _mm_castps_si128(_mm256_castps256_ps128(_mm256_castsi256_ps(mask8(per_block))));
  alignas(32) int32_t lane_group[2][8];
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 8; ++j)
      lane_group[h][j] = group >= 128 ? 0 : static_cast<int32_t>((64 * h + 8 * j) / group);
  const __m256i spread0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lane_group[0]));
  const __m256i spread1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lane_group[1]));
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);

  for_tiles(row_begin, row_end, n, [&]<int NR, int NV>(int32_t r0, int32_t v0) {
    const bool prefetch = v0 == 0;
    const std::uint8_t* rows[NR];
    const float* scales[NR];
    const ActivationView* xs[NV];
    __m256 acc[NR][NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) xs[v] = xq[v0 + v];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * row_bytes;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
    }
    for (size_t b = 0; b < blocks; ++b) {
      const size_t g0 = 128 * b / group;
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        if (prefetch) {
          prefetch_next_block(rows[r], 64 * b, row_bytes);
          if ((b & 3) == 0) {
            prefetch_next_block(scales[r], 4 * g0, 4 * static_cast<size_t>(groups));
            prefetch_next_block(w.mins + (static_cast<size_t>(r0) + r) * groups, 4 * g0, 4 * static_cast<size_t>(groups));
          }
        }
        __m256i lo[2], hi[2];
        for (int h = 0; h < 2; ++h) {
          const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[r] + 64 * b + 32 * h));
          lo[h] = _mm256_and_si256(packed, low4);
          hi[h] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
        }
        const __m128 w_scales = _mm_maskload_ps(scales[r] + g0, scale_mask);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          const std::int8_t* xb = xs[v]->q4 + 128 * b;
          const std::int8_t* rb = Residual ? xs[v]->residual_q4 + 128 * b : xb;
          __m256i dot[2], dot_r[2];
          for (int h = 0; h < 2; ++h) {
            const __m256i x_even = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 32 * h));
            const __m256i x_odd = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 64 + 32 * h));
            dot[h] = _mm256_madd_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], x_even), _mm256_maddubs_epi16(hi[h], x_odd)), ones);
            if constexpr (Residual) {
              const __m256i r_even = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rb + 32 * h));
              const __m256i r_odd = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rb + 64 + 32 * h));
              dot_r[h] = _mm256_madd_epi16(
                  _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], r_even), _mm256_maddubs_epi16(hi[h], r_odd)), ones);
            }
          }
          const __m128 x_scales = _mm_maskload_ps(xs[v]->scales + g0, scale_mask);
          const __m256 s256 = _mm256_castps128_ps256(_mm_mul_ps(w_scales, x_scales));
          acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[0]), _mm256_permutevar8x32_ps(s256, spread0), acc[r][v]);
          acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[1]), _mm256_permutevar8x32_ps(s256, spread1), acc[r][v]);
          if constexpr (Residual) {
            const __m128 r_scales = _mm_maskload_ps(xs[v]->residual_scales + g0, scale_mask);
            const __m256 r256 = _mm256_castps128_ps256(_mm_mul_ps(w_scales, r_scales));
            acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_r[0]), _mm256_permutevar8x32_ps(r256, spread0), acc[r][v]);
            acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_r[1]), _mm256_permutevar8x32_ps(r256, spread1), acc[r][v]);
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
        y[v0 + v][r0 + r] = hsum(acc[r][v]) + end.tail + end.mins;
      }
    }
  });
}

// Even group sizes; the group's sum of x is computed once per vector, in
// matvec's order, before the rows.
void q4_f32_matmat(const Matrix& w, int32_t n, const float* const* x, float* const* y, int32_t row_begin,
                   int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const size_t row_bytes = (cols + 1) / 2;
  const auto* base = static_cast<const std::uint8_t*>(w.data);
  const __m128i low4 = _mm_set1_epi8(0x0f);
  auto load_x = [](const float* p, size_t len, __m256& x0, __m256& x1) {
    x0 = len >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask8(len));
    x1 = len >= 16 ? _mm256_loadu_ps(p + 8) : _mm256_maskload_ps(p + 8, mask8(len > 8 ? len - 8 : 0));
  };
  for_tiles(row_begin, row_end, n, [&]<int NR, int NV>(int32_t r0, int32_t v0) {
    const std::uint8_t* rows[NR];
    const float* scales[NR];
    const float* mins[NR];
    __m256 acc[NR][NV];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * row_bytes;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
      mins[r] = w.mins + (static_cast<size_t>(r0) + r) * groups;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
    }
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
      __m256 x_sum[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        x_sum[v] = _mm256_setzero_ps();
        for (size_t c = begin; c < end; c += 16) {
          __m256 x0, x1;
          load_x(x[v0 + v] + c, min_size(16, end - c), x0, x1);
          x_sum[v] = _mm256_add_ps(x_sum[v], _mm256_add_ps(x0, x1));
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        __m256 partial[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) partial[v] = _mm256_setzero_ps();
        for (size_t c = begin; c < end; c += 16) {
          const size_t len = min_size(16, end - c);
          std::int64_t bytes = 0;
          std::memcpy(&bytes, rows[r] + c / 2, (len + 1) / 2);
          const __m128i packed = _mm_cvtsi64_si128(bytes);
          const __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(packed, low4), _mm_and_si128(_mm_srli_epi16(packed, 4), low4));
          const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes));
          const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8)));
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) {
            __m256 x0, x1;
            load_x(x[v0 + v] + c, len, x0, x1);
            partial[v] = _mm256_fmadd_ps(w1, x1, _mm256_fmadd_ps(w0, x0, partial[v]));
          }
        }
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          acc[r][v] = _mm256_fmadd_ps(partial[v], _mm256_set1_ps(scales[r][g]), acc[r][v]);
          acc[r][v] = _mm256_fmadd_ps(x_sum[v], _mm256_set1_ps(mins[r][g]), acc[r][v]);
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) y[v0 + v][r0 + r] = hsum(acc[r][v]);
  });
}

// xq is null (f32 activations) or n views usable with w; see kernels_avx512.cpp.
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
    case WeightFormat::Q8R16:
      if (xq != nullptr && residual && w.group <= kQ8R16CombinedMaxGroup)
        return q8r16_combined(w, n, xq, y, row_begin, row_end);
      if (xq != nullptr && residual) return q8r16_int8<true>(w, n, xq, y, row_begin, row_end);
      if (xq != nullptr) return q8r16_int8<false>(w, n, xq, y, row_begin, row_end);
      return q8r16_f32(w, n, x, y, row_begin, row_end);
    case WeightFormat::Q4R16:  // f32 activations: the portable kernel
      if (xq != nullptr && residual) return q4r16_int8<true>(w, n, xq, y, row_begin, row_end);
      if (xq != nullptr) return q4r16_int8<false>(w, n, xq, y, row_begin, row_end);
      break;
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

// ---- activation quantization ----------------------------------------------------------

// Zeros q from n to a multiple of 128 and writes q4, q's complete 128-column
// blocks in the Q4 kernels' order (ActivationQ8).
void pad_and_rearrange(std::int8_t* q, std::int8_t* q4, int32_t n) {
  const size_t padded = (static_cast<size_t>(n) + 127) / 128 * 128;
  std::memset(q + n, 0, padded - static_cast<size_t>(n));
  for (size_t block = 0; block + 128 <= static_cast<size_t>(n); block += 128)
    for (size_t i = 0; i < 64; ++i) {
      q4[block + i] = q[block + 2 * i];
      q4[block + 64 + i] = q[block + 2 * i + 1];
    }
}

void quantize_activation(const float* x, int32_t n, int32_t group, std::int8_t* q, std::int8_t* q4,
                         float* scales, int32_t* sums, float* residual) {
  const int32_t groups = group_count(n, group);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  const __m256i gather = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
  for (int32_t g = 0; g < groups; ++g) {
    const size_t begin = static_cast<size_t>(g) * group;
    const size_t end = min_size(static_cast<size_t>(n), begin + static_cast<size_t>(group));
    __m256 amax = _mm256_setzero_ps();
    for (size_t c = begin; c < end; c += 8)
      // The NaN operand first: max_ps then returns amax, skipping it as std::max does.
      amax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_maskload_ps(x + c, mask8(end - c))), amax);
    const float m = hmax(amax);
    const float inverse = m >= kSmallestActivationAmax ? 127.0f / m : 0.0f;
    const __m256 inv = _mm256_set1_ps(inverse);
    __m256i sum = _mm256_setzero_si256();
    const float scale = m / 127.0f;
    for (size_t c = begin; c < end; c += 8) {
      const size_t len = min_size(8, end - c);
      const __m256i mask = mask8(len);
      const __m256 xv = _mm256_maskload_ps(x + c, mask);
      const __m256 scaled = _mm256_mul_ps(xv, inv);
      __m256i v = _mm256_and_si256(_mm256_cvtps_epi32(scaled),  // NaN gives 0
                                   _mm256_castps_si256(_mm256_cmp_ps(scaled, scaled, _CMP_ORD_Q)));
      v = _mm256_min_epi32(_mm256_max_epi32(v, lo), hi);
      sum = _mm256_add_epi32(sum, v);
      // Saturating packs are exact on [-127, 127]; then gather the two lanes' 4 bytes.
      const __m256i words = _mm256_packs_epi32(v, v);
      const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(words, words), gather);
      const std::int64_t packed = _mm_cvtsi128_si64(_mm256_castsi256_si128(bytes));
      std::memcpy(q + c, &packed, len);
      if (residual != nullptr)  // multiply, then subtract: the scalar path's two roundings
        _mm256_maskstore_ps(residual + c, mask,
                            _mm256_sub_ps(xv, _mm256_mul_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(v))));
    }
    scales[g] = scale;
    sums[g] = hsum_epi32(sum);
  }
  pad_and_rearrange(q, q4, n);
}

// The scalar path's quantize_residual: cvtps rounds to nearest even as its
// rounding does, after the same clamp, so the bytes are the same.
void quantize_residual(const float* r, int32_t n, int32_t group, const float* first_scales, std::int8_t* q,
                       std::int8_t* q4, float* scales, int32_t* sums) {
  const int32_t groups = group_count(n, group);
  const __m256 limit = _mm256_set1_ps(static_cast<float>(kResidualLimit));
  const __m256 minus_limit = _mm256_set1_ps(-static_cast<float>(kResidualLimit));
  const __m256i gather = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
  for (int32_t g = 0; g < groups; ++g) {
    const size_t begin = static_cast<size_t>(g) * group;
    const size_t end = min_size(static_cast<size_t>(n), begin + static_cast<size_t>(group));
    const float scale = first_scales[g] / static_cast<float>(kResidualRatio);
    const __m256 inv = _mm256_set1_ps(scale >= FLT_MIN ? 1.0f / scale : 0.0f);
    __m256i sum = _mm256_setzero_si256();
    for (size_t c = begin; c < end; c += 8) {
      const size_t len = min_size(8, end - c);
      const __m256 v = _mm256_mul_ps(_mm256_maskload_ps(r + c, mask8(len)), inv);
      const __m256 held = _mm256_max_ps(_mm256_min_ps(v, limit), minus_limit);
      const __m256i codes = _mm256_and_si256(_mm256_cvtps_epi32(held),  // NaN: 0
                                             _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_ORD_Q)));
      sum = _mm256_add_epi32(sum, codes);
      const __m256i words = _mm256_packs_epi32(codes, codes);
      const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(words, words), gather);
      const std::int64_t packed = _mm_cvtsi128_si64(_mm256_castsi256_si128(bytes));
      std::memcpy(q + c, &packed, len);
    }
    scales[g] = scale;
    sums[g] = hsum_epi32(sum);
  }
  pad_and_rearrange(q, q4, n);
}

// ---- elementwise and attention kernels --------------------------------------------------

// exp as in kernels_avx512.cpp, with 2^n built in the exponent field; the
// upper clamp keeps n <= 127.
__m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(pow2));
}

__m256 load8(const float* p, size_t len) { return len >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask8(len)); }

void store8(float* p, size_t len, __m256 v) {
  if (len >= 8)
    _mm256_storeu_ps(p, v);
  else
    _mm256_maskstore_ps(p, mask8(len), v);
}

float dot(const float* a, const float* b, int32_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const size_t len = static_cast<size_t>(n);
  size_t i = 0;
  for (; i + 16 <= len; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i < len; i += 8) acc0 = _mm256_fmadd_ps(load8(a + i, len - i), load8(b + i, len - i), acc0);
  return hsum(_mm256_add_ps(acc0, acc1));
}

void rmsnorm(const float* x, const float* weight, int32_t n, float eps, float* out) {
  const float sum_sq = dot(x, x, n);
  const __m256 scale = _mm256_set1_ps(static_cast<float>(1.0 / __builtin_sqrt(static_cast<double>(sum_sq) / n + eps)));
  const size_t len = static_cast<size_t>(n);
  for (size_t i = 0; i < len; i += 8)
    store8(out + i, len - i, _mm256_mul_ps(_mm256_mul_ps(load8(x + i, len - i), scale), load8(weight + i, len - i)));
}

void softmax(float* x, int32_t n) {
  const size_t len = static_cast<size_t>(n);
  __m256 max = _mm256_set1_ps(x[0]);
  for (size_t i = 0; i < len; i += 8) {
    const __m256 v = load8(x + i, len - i);
    // Masked-off lanes load 0; blend x[0] there so they cannot win.
    max = _mm256_max_ps(max, _mm256_blendv_ps(_mm256_set1_ps(x[0]), v, _mm256_castsi256_ps(mask8(len - i))));
  }
  const __m256 top = _mm256_set1_ps(hmax(max));
  __m256 sum = _mm256_setzero_ps();
  for (size_t i = 0; i < len; i += 8) {
    const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(load8(x + i, len - i), top)),
                                   _mm256_castsi256_ps(mask8(len - i)));
    sum = _mm256_add_ps(sum, e);
    store8(x + i, len - i, e);
  }
  const __m256 inverse = _mm256_set1_ps(1.0f / hsum(sum));
  for (size_t i = 0; i < len; i += 8) store8(x + i, len - i, _mm256_mul_ps(load8(x + i, len - i), inverse));
}

void swiglu(const float* gate, const float* up, int32_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const size_t len = static_cast<size_t>(n);
  for (size_t i = 0; i < len; i += 8) {
    const __m256 g = load8(gate + i, len - i);
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    store8(out + i, len - i, _mm256_mul_ps(silu, load8(up + i, len - i)));
  }
}

// Up to 8 cached keys or values as f32, zero past len: an f32 cache as
// stored, an f16 cache widened by vcvtph2ps (exact), so both caches share one
// kernel. AVX2 has no masked 16-bit load, so a ragged tail (odd head sizes)
// is gathered element by element: a memcpy call here would sit in the
// kernels' position loops and push their accumulators out to the stack
// (measured: attention_values twice as slow).
__m256 load_kv8(const float* p, size_t len) { return load8(p, len); }
__m256 load_kv8(const std::uint16_t* p, size_t len) {
  if (len >= 8) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  alignas(16) std::uint16_t buffer[8];
  for (size_t j = 0; j < 8; ++j) buffer[j] = j < len ? p[j] : std::uint16_t{0};
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(buffer)));
}

// A head's cached rows are `stride` elements apart (all KV heads of a
// position are one row), too far apart for the hardware prefetcher: each
// row's lines are requested kPositionsAhead positions early, as on AVX-512.
// Rows closer than kPrefetchMinRowBytes (small models: a few heads of 16-32)
// the hardware follows itself: prefetching them, with every slice 8
// registers wide, made both kernels up to 2x slower on a cache in L2 (head_dim
// 16 and 32, measured); without both, as fast as before.
constexpr int32_t kPositionsAhead = 8;
constexpr size_t kPrefetchMinRowBytes = 1024;

template <class T>
inline void prefetch_row(const T* row, size_t dim) {
  for (size_t b = 0; b < dim * sizeof(T); b += 64) _mm_prefetch(reinterpret_cast<const char*>(row) + b, _MM_HINT_T0);
}

// Positions before this one prefetch the row kPositionsAhead after them.
template <class T>
int32_t prefetching_positions(size_t stride, int32_t n_positions) {
  return stride * sizeof(T) >= kPrefetchMinRowBytes ? n_positions - kPositionsAhead : 0;
}

template <class T>
void attention_scores(const float* q, const T* keys, size_t stride, int32_t n_positions, int32_t head_dim,
                      float scale, float* scores) {
  const size_t dim = static_cast<size_t>(head_dim);
  const int32_t prefetch_end = prefetching_positions<T>(stride, n_positions);
  auto block = [&]<int NP>(int32_t p0) {
    __m256 acc[NP];
#pragma GCC unroll 4
    for (int k = 0; k < NP; ++k) {
      acc[k] = _mm256_setzero_ps();
      if (p0 + k < prefetch_end) prefetch_row(keys + (static_cast<size_t>(p0) + k + kPositionsAhead) * stride, dim);
    }
    for (size_t i = 0; i < dim; i += 8) {
      const __m256 qv = load8(q + i, dim - i);
#pragma GCC unroll 4
      for (int k = 0; k < NP; ++k)
        acc[k] = _mm256_fmadd_ps(qv, load_kv8(keys + (static_cast<size_t>(p0) + k) * stride + i, dim - i), acc[k]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < NP; ++k) scores[p0 + k] = hsum(acc[k]) * scale;
  };
  int32_t p = 0;
  for (; p + 4 <= n_positions; p += 4) block.template operator()<4>(p);
  for (; p < n_positions; ++p) block.template operator()<1>(p);
}

// Output in slices of up to 64 floats held in eight registers while all
// positions stream through (a 128-wide head reads each row twice); 32 in
// four for what is left of a head after them.
template <class T>
void attention_values(const float* weights, const T* values, size_t stride, int32_t n_positions, int32_t head_dim,
                      float* out) {
  const size_t dim = static_cast<size_t>(head_dim);
  const int32_t prefetch_end = prefetching_positions<T>(stride, n_positions);
  auto slice = [&]<int NS>(size_t i) {
    size_t len[NS];
    __m256 acc[NS];
    for (int k = 0; k < NS; ++k) {
      const size_t at = i + 8 * static_cast<size_t>(k);
      len[k] = at < dim ? dim - at : 0;
      acc[k] = _mm256_setzero_ps();
    }
    for (int32_t p = 0; p < n_positions; ++p) {
      const __m256 wp = _mm256_set1_ps(weights[p]);
      const T* v = values + static_cast<size_t>(p) * stride + i;
      if (p < prefetch_end) prefetch_row(v + kPositionsAhead * stride, min_size(8 * NS, dim - i));
#pragma GCC unroll 8
      for (int k = 0; k < NS; ++k)
        if (len[k] > 0) acc[k] = _mm256_fmadd_ps(wp, load_kv8(v + 8 * k, len[k]), acc[k]);
    }
    for (int k = 0; k < NS; ++k)
      if (len[k] > 0) store8(out + i + 8 * k, len[k], acc[k]);
  };
  for (size_t i = 0; i < dim; i += 64) {
    if (dim - i > 32)
      slice.template operator()<8>(i);
    else
      slice.template operator()<4>(i);
  }
}

// vcvtps2ph with round-to-nearest-even in the instruction, not MXCSR's mode:
// the same bits as f32_to_f16.
void convert_f32_to_f16(const float* x, int32_t n, std::uint16_t* out) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const size_t len = static_cast<size_t>(n);
  size_t i = 0;
  for (; i + 8 <= len; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), kRound));
  if (i < len) {
    alignas(16) std::uint16_t buffer[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(buffer), _mm256_cvtps_ph(load8(x + i, len - i), kRound));
    std::memcpy(out + i, buffer, 2 * (len - i));
  }
}

constexpr KernelTable kTable{
    .isa = Isa::Avx2,
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
};

}  // namespace

const KernelTable* avx2_kernel_table() { return &kTable; }

}  // namespace colibri::kernels

#endif  // __x86_64__
