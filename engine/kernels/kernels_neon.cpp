// The aarch64 path: NEON with the dot-product extension (compiled with
// -march=armv8.2-a+dotprod on aarch64 only, see engine/CMakeLists.txt; reached
// after getauxval reported HWCAP_ASIMDDP). It covers the kernels decode time
// depends on: int8-activation Q8/Q4 products (sdot), f32/f16/bf16 products
// and attention. The rest (activation quantization, norms, softmax, and the
// f32-activation Q8/Q4 fallbacks) forwards to the portable path, which keeps
// the quantized bytes identical by construction. Everything here has internal
// linkage; see kernel_table.h. Rows go 4 at a time with the same per-row
// instruction sequence as the 1-row remainder, as in the x86 paths.
#if defined(__aarch64__)

#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/kernel_table.h"

namespace colibri::kernels {
namespace {

using std::int32_t;
using std::size_t;

constexpr int kRowBlock = 4;

size_t min_size(size_t a, size_t b) { return a < b ? a : b; }
int32_t group_count(int32_t cols, int32_t group) { return (cols + group - 1) / group; }

template <class Kernel>
void for_row_blocks(int32_t begin, int32_t end, const Kernel& kernel) {
  int32_t r = begin;
  for (; r + kRowBlock <= end; r += kRowBlock) kernel.template operator()<kRowBlock>(r);
  for (; r < end; ++r) kernel.template operator()<1>(r);
}

// Up to 4 floats, zero-filled past len.
float32x4_t load4(const float* p, size_t len) {
  if (len >= 4) return vld1q_f32(p);
  float buffer[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  std::memcpy(buffer, p, 4 * len);
  return vld1q_f32(buffer);
}

int8x16_t load16_s8(const std::int8_t* p, size_t len) {
  if (len >= 16) return vld1q_s8(p);
  std::int8_t buffer[16] = {};
  std::memcpy(buffer, p, len);
  return vld1q_s8(buffer);
}

template <WeightFormat F>
float32x4_t load_weights4(const void* row, size_t c, size_t len) {
  if constexpr (F == WeightFormat::F32) {
    return load4(static_cast<const float*>(row) + c, len);
  } else {
    std::uint16_t buffer[4] = {0, 0, 0, 0};
    std::memcpy(buffer, static_cast<const std::uint16_t*>(row) + c, 2 * min_size(len, 4));
    const uint16x4_t half = vld1_u16(buffer);
    if constexpr (F == WeightFormat::F16) return vcvt_f32_f16(vreinterpret_f16_u16(half));
    return vreinterpretq_f32_u32(vshll_n_u16(half, 16));
  }
}

template <WeightFormat F>
void float_matvec(const Matrix& w, const float* x, float* y, int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t element = F == WeightFormat::F32 ? 4 : 2;
  const auto* base = static_cast<const std::uint8_t*>(w.data);
  for_row_blocks(row_begin, row_end, [&]<int NR>(int32_t r0) {
    const void* rows[NR];
    float32x4_t acc[NR];
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols * element;
      acc[r] = vdupq_n_f32(0.0f);
    }
    for (size_t c = 0; c < cols; c += 4) {
      const size_t len = min_size(4, cols - c);
      const float32x4_t xv = load4(x + c, len);
      for (int r = 0; r < NR; ++r) acc[r] = vfmaq_f32(acc[r], load_weights4<F>(rows[r], c, len), xv);
    }
    for (int r = 0; r < NR; ++r) y[r0 + r] = vaddvq_f32(acc[r]);
  });
}

// sdot multiplies signed by signed bytes: no operand trick needed. With the
// residual plane each weight load feeds a second sdot.
template <bool Residual>
void q8_int8_matvec(const Matrix& w, const ActivationView& xq, float* y, int32_t row_begin,
                    int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const auto* base = static_cast<const std::int8_t*>(w.data);
  for_row_blocks(row_begin, row_end, [&]<int NR>(int32_t r0) {
    const std::int8_t* rows[NR];
    const float* scales[NR];
    float32x4_t acc[NR];
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
      acc[r] = vdupq_n_f32(0.0f);
    }
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
      int32x4_t dot[NR], lo[NR];
      for (int r = 0; r < NR; ++r) dot[r] = lo[r] = vdupq_n_s32(0);
      for (size_t c = begin; c < end; c += 16) {
        const size_t len = min_size(16, end - c);
        const int8x16_t xv = load16_s8(xq.q + c, len);
        const int8x16_t xl = Residual ? load16_s8(xq.residual_q + c, len) : xv;
        for (int r = 0; r < NR; ++r) {
          const int8x16_t wv = load16_s8(rows[r] + c, len);
          dot[r] = vdotq_s32(dot[r], wv, xv);
          if constexpr (Residual) lo[r] = vdotq_s32(lo[r], wv, xl);
        }
      }
      const float x_scale = xq.scales[g];
      for (int r = 0; r < NR; ++r) {
        acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(dot[r]), scales[r][g] * x_scale);
        if constexpr (Residual)
          acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(lo[r]), scales[r][g] * xq.residual_scales[g]);
      }
    }
    for (int r = 0; r < NR; ++r) y[r0 + r] = vaddvq_f32(acc[r]);
  });
}

// See kernels_avx512.cpp for the Q4 layout. 16 packed bytes cover 32 columns
// and one sdot pair gives 4 lanes of 8 columns each, all in one group for the
// supported sizes (32, 64, multiples of 128).
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
  float32x4_t min_acc = vdupq_n_f32(0.0f);
  for (int32_t g = 0; g < groups; g += 4) {
    const size_t len = min_size(4, static_cast<size_t>(groups - g));
    int32_t sums[4] = {0, 0, 0, 0};
    std::memcpy(sums, a.sums + g, 4 * len);
    const float32x4_t group_mins = load4(mins + g, len);
    const float32x4_t x_sum = vmulq_f32(load4(a.scales + g, len), vcvtq_f32_s32(vld1q_s32(sums)));
    min_acc = vfmaq_f32(min_acc, group_mins, x_sum);
    if constexpr (Residual) {
      std::memcpy(sums, a.residual_sums + g, 4 * len);
      const float32x4_t r_sum = vmulq_f32(load4(a.residual_scales + g, len), vcvtq_f32_s32(vld1q_s32(sums)));
      min_acc = vfmaq_f32(min_acc, group_mins, r_sum);
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
  return {tail, vaddvq_f32(min_acc)};
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
  const uint8x16_t low4 = vdupq_n_u8(0x0f);
  for_row_blocks(row_begin, row_end, [&]<int NR>(int32_t r0) {
    const std::uint8_t* rows[NR];
    const float* scales[NR];
    float32x4_t acc[NR];
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * row_bytes;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
      acc[r] = vdupq_n_f32(0.0f);
    }
    for (size_t b = 0; b < blocks; ++b) {
      for (size_t k = 0; k < 4; ++k) {
        const size_t g = (128 * b + 32 * k) / group;
        const int8x16_t x_even = vld1q_s8(xq.q4 + 128 * b + 16 * k);
        const int8x16_t x_odd = vld1q_s8(xq.q4 + 128 * b + 64 + 16 * k);
        const float x_scale = xq.scales[g];
        int8x16_t r_even = x_even, r_odd = x_odd;
        if constexpr (Residual) {
          r_even = vld1q_s8(xq.residual_q4 + 128 * b + 16 * k);
          r_odd = vld1q_s8(xq.residual_q4 + 128 * b + 64 + 16 * k);
        }
        for (int r = 0; r < NR; ++r) {
          const uint8x16_t packed = vld1q_u8(rows[r] + 64 * b + 16 * k);
          const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(packed, low4));
          const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(packed, 4));
          const int32x4_t dot = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, x_even), hi, x_odd);
          acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(dot), scales[r][g] * x_scale);
          if constexpr (Residual) {
            const int32x4_t dot_r = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, r_even), hi, r_odd);
            acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(dot_r), scales[r][g] * xq.residual_scales[g]);
          }
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      const Q4RowEnd end = q4_row_end<Residual>(rows[r], scales[r], w.mins + (static_cast<size_t>(r0) + r) * groups,
                                                xq, groups, group, cols, blocks);
      y[r0 + r] = vaddvq_f32(acc[r]) + end.tail + end.mins;
    }
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
      break;
    case WeightFormat::Q4:
      if (xq != nullptr && q4_int8_supported(w.group)) {
        if (xq->residual_q != nullptr) return q4_int8_matvec<true>(w, *xq, y, row_begin, row_end);
        return q4_int8_matvec<false>(w, *xq, y, row_begin, row_end);
      }
      break;
  }
  scalar_kernel_table()->matvec(w, x, xq, y, row_begin, row_end);
}

// ---- matrix x several vectors (matmat) ------------------------------------------------
//
// Each kernel mirrors the matvec above it with a second tile dimension: NR
// rows x NV vectors, a row's weights loaded once per chunk for all NV
// vectors. Every (row, vector) pair keeps its own accumulator and runs
// exactly matvec's instruction sequence for that row, so each result is
// bit-identical to matvec's. Row blocks are the outer loop, so a block's
// weights stay in L1 while every vector tile goes through them.
constexpr int kVectorTile = 4;

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
    const void* rows[NR];
    float32x4_t acc[NR][NV];
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols * element;
      for (int v = 0; v < NV; ++v) acc[r][v] = vdupq_n_f32(0.0f);
    }
    for (size_t c = 0; c < cols; c += 4) {
      const size_t len = min_size(4, cols - c);
      float32x4_t xv[NV];
      for (int v = 0; v < NV; ++v) xv[v] = load4(x[v0 + v] + c, len);
      for (int r = 0; r < NR; ++r) {
        const float32x4_t wv = load_weights4<F>(rows[r], c, len);
        for (int v = 0; v < NV; ++v) acc[r][v] = vfmaq_f32(acc[r][v], wv, xv[v]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int v = 0; v < NV; ++v) y[v0 + v][r0 + r] = vaddvq_f32(acc[r][v]);
  });
}

// Rows one at a time within a group, NV running dot products each.
template <bool Residual>
void q8_int8_matmat(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y,
                    int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const auto* base = static_cast<const std::int8_t*>(w.data);
  for_tiles(row_begin, row_end, n, [&]<int NR, int NV>(int32_t r0, int32_t v0) {
    const std::int8_t* rows[NR];
    const float* scales[NR];
    const ActivationView* xs[NV];
    float32x4_t acc[NR][NV];
    for (int v = 0; v < NV; ++v) xs[v] = xq[v0 + v];
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * cols;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
      for (int v = 0; v < NV; ++v) acc[r][v] = vdupq_n_f32(0.0f);
    }
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
      for (int r = 0; r < NR; ++r) {
        int32x4_t dot[NV], lo[NV];
        for (int v = 0; v < NV; ++v) dot[v] = lo[v] = vdupq_n_s32(0);
        for (size_t c = begin; c < end; c += 16) {
          const size_t len = min_size(16, end - c);
          const int8x16_t wv = load16_s8(rows[r] + c, len);
          for (int v = 0; v < NV; ++v) {
            dot[v] = vdotq_s32(dot[v], wv, load16_s8(xs[v]->q + c, len));
            if constexpr (Residual) lo[v] = vdotq_s32(lo[v], wv, load16_s8(xs[v]->residual_q + c, len));
          }
        }
        for (int v = 0; v < NV; ++v) {
          acc[r][v] = vfmaq_n_f32(acc[r][v], vcvtq_f32_s32(dot[v]), scales[r][g] * xs[v]->scales[g]);
          if constexpr (Residual)
            acc[r][v] = vfmaq_n_f32(acc[r][v], vcvtq_f32_s32(lo[v]), scales[r][g] * xs[v]->residual_scales[g]);
        }
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int v = 0; v < NV; ++v) y[v0 + v][r0 + r] = vaddvq_f32(acc[r][v]);
  });
}

// Per 32 columns the nibbles of a row are split once for all vectors.
template <bool Residual>
void q4_int8_matmat(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y,
                    int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t group = static_cast<size_t>(w.group);
  const int32_t groups = group_count(w.cols, w.group);
  const size_t row_bytes = (cols + 1) / 2;
  const size_t blocks = cols / 128;
  const auto* base = static_cast<const std::uint8_t*>(w.data);
  const uint8x16_t low4 = vdupq_n_u8(0x0f);
  for_tiles(row_begin, row_end, n, [&]<int NR, int NV>(int32_t r0, int32_t v0) {
    const std::uint8_t* rows[NR];
    const float* scales[NR];
    const ActivationView* xs[NV];
    float32x4_t acc[NR][NV];
    for (int v = 0; v < NV; ++v) xs[v] = xq[v0 + v];
    for (int r = 0; r < NR; ++r) {
      rows[r] = base + (static_cast<size_t>(r0) + r) * row_bytes;
      scales[r] = w.scales + (static_cast<size_t>(r0) + r) * groups;
      for (int v = 0; v < NV; ++v) acc[r][v] = vdupq_n_f32(0.0f);
    }
    for (size_t b = 0; b < blocks; ++b) {
      for (size_t k = 0; k < 4; ++k) {
        const size_t g = (128 * b + 32 * k) / group;
        for (int r = 0; r < NR; ++r) {
          const uint8x16_t packed = vld1q_u8(rows[r] + 64 * b + 16 * k);
          const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(packed, low4));
          const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(packed, 4));
          for (int v = 0; v < NV; ++v) {
            const std::int8_t* xb = xs[v]->q4 + 128 * b + 16 * k;
            const int32x4_t dot = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(xb)), hi, vld1q_s8(xb + 64));
            acc[r][v] = vfmaq_n_f32(acc[r][v], vcvtq_f32_s32(dot), scales[r][g] * xs[v]->scales[g]);
            if constexpr (Residual) {
              const std::int8_t* rb = xs[v]->residual_q4 + 128 * b + 16 * k;
              const int32x4_t dot_r = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(rb)), hi, vld1q_s8(rb + 64));
              acc[r][v] = vfmaq_n_f32(acc[r][v], vcvtq_f32_s32(dot_r), scales[r][g] * xs[v]->residual_scales[g]);
            }
          }
        }
      }
    }
    // The min term and the columns past the last block, as in matvec.
    for (int r = 0; r < NR; ++r) {
      const float* mins = w.mins + (static_cast<size_t>(r0) + r) * groups;
      for (int v = 0; v < NV; ++v) {
        const Q4RowEnd end = q4_row_end<Residual>(rows[r], scales[r], mins, *xs[v], groups, group, cols, blocks);
        y[v0 + v][r0 + r] = vaddvq_f32(acc[r][v]) + end.tail + end.mins;
      }
    }
  });
}

// xq is null (f32 activations) or n views usable with w. What matvec sends to
// the portable kernel goes to the portable matmat, which matches it.
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
      break;
    case WeightFormat::Q4:
      if (xq != nullptr && q4_int8_supported(w.group)) {
        if (residual) return q4_int8_matmat<true>(w, n, xq, y, row_begin, row_end);
        return q4_int8_matmat<false>(w, n, xq, y, row_begin, row_end);
      }
      break;
  }
  scalar_kernel_table()->matmat(w, n, x, xq, y, row_begin, row_end);
}

float dot(const float* a, const float* b, int32_t n) {
  const size_t len = static_cast<size_t>(n);
  float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    acc0 = vfmaq_f32(acc0, vld1q_f32(a + i), vld1q_f32(b + i));
    acc1 = vfmaq_f32(acc1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
  }
  for (; i < len; i += 4) acc0 = vfmaq_f32(acc0, load4(a + i, len - i), load4(b + i, len - i));
  return vaddvq_f32(vaddq_f32(acc0, acc1));
}

void attention_scores(const float* q, const float* keys, size_t stride, int32_t n_positions,
                      int32_t head_dim, float scale, float* scores) {
  for (int32_t p = 0; p < n_positions; ++p)
    scores[p] = dot(q, keys + static_cast<size_t>(p) * stride, head_dim) * scale;
}

void attention_values(const float* weights, const float* values, size_t stride, int32_t n_positions,
                      int32_t head_dim, float* out) {
  const size_t dim = static_cast<size_t>(head_dim);
  size_t i = 0;
  for (; i + 4 <= dim; i += 4) {
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int32_t p = 0; p < n_positions; ++p)
      acc = vfmaq_n_f32(acc, vld1q_f32(values + static_cast<size_t>(p) * stride + i), weights[p]);
    vst1q_f32(out + i, acc);
  }
  for (; i < dim; ++i) {
    float acc = 0.0f;
    for (int32_t p = 0; p < n_positions; ++p) acc += weights[p] * values[static_cast<size_t>(p) * stride + i];
    out[i] = acc;
  }
}

// Up to 4 f16 cache elements widened to f32 (exact), zero past len. A ragged
// tail is gathered element by element: a memcpy call would sit in the
// attention kernels' position loops and push their accumulators to the stack.
float32x4_t load4(const std::uint16_t* p, size_t len) {
  if (len >= 4) return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
  std::uint16_t buffer[4];
  for (size_t j = 0; j < 4; ++j) buffer[j] = j < len ? p[j] : std::uint16_t{0};
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(buffer)));
}

// dot()'s order (two accumulators over 8 columns, then 4 at a time) over f16 keys.
void attention_scores_f16(const float* q, const std::uint16_t* keys, size_t stride, int32_t n_positions,
                          int32_t head_dim, float scale, float* scores) {
  const size_t len = static_cast<size_t>(head_dim);
  for (int32_t p = 0; p < n_positions; ++p) {
    const std::uint16_t* k = keys + static_cast<size_t>(p) * stride;
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
      const float16x8_t half = vreinterpretq_f16_u16(vld1q_u16(k + i));
      acc0 = vfmaq_f32(acc0, vld1q_f32(q + i), vcvt_f32_f16(vget_low_f16(half)));
      acc1 = vfmaq_f32(acc1, vld1q_f32(q + i + 4), vcvt_high_f32_f16(half));
    }
    for (; i < len; i += 4) acc0 = vfmaq_f32(acc0, load4(q + i, len - i), load4(k + i, len - i));
    scores[p] = vaddvq_f32(vaddq_f32(acc0, acc1)) * scale;
  }
}

// Output in slices of 16 floats in four registers (four independent FMA
// chains) while all positions stream through.
void attention_values_f16(const float* weights, const std::uint16_t* values, size_t stride, int32_t n_positions,
                          int32_t head_dim, float* out) {
  const size_t dim = static_cast<size_t>(head_dim);
  for (size_t i = 0; i < dim; i += 16) {
    size_t len[4];
    float32x4_t acc[4];
    for (int k = 0; k < 4; ++k) {
      const size_t at = i + 4 * static_cast<size_t>(k);
      len[k] = at < dim ? dim - at : 0;
      acc[k] = vdupq_n_f32(0.0f);
    }
    for (int32_t p = 0; p < n_positions; ++p) {
      const std::uint16_t* v = values + static_cast<size_t>(p) * stride + i;
      for (int k = 0; k < 4; ++k)
        if (len[k] > 0) acc[k] = vfmaq_n_f32(acc[k], load4(v + 4 * k, len[k]), weights[p]);
    }
    for (int k = 0; k < 4; ++k) {
      if (len[k] >= 4) {
        vst1q_f32(out + i + 4 * static_cast<size_t>(k), acc[k]);
      } else if (len[k] > 0) {
        float buffer[4];
        vst1q_f32(buffer, acc[k]);
        std::memcpy(out + i + 4 * static_cast<size_t>(k), buffer, 4 * len[k]);
      }
    }
  }
}

// vcvt_f16_f32 rounds in the FPCR's mode, round-to-nearest-even unless a
// program changed it: the same bits as f32_to_f16.
void convert_f32_to_f16(const float* x, int32_t n, std::uint16_t* out) {
  const size_t len = static_cast<size_t>(n);
  for (size_t i = 0; i < len; i += 4) {
    const uint16x4_t half = vreinterpret_u16_f16(vcvt_f16_f32(load4(x + i, len - i)));
    if (len - i >= 4) {
      vst1_u16(out + i, half);
    } else {
      std::uint16_t buffer[4];
      vst1_u16(buffer, half);
      std::memcpy(out + i, buffer, 2 * (len - i));
    }
  }
}

void quantize_activation(const float* x, int32_t n, int32_t group, std::int8_t* q, std::int8_t* q4,
                         float* scales, int32_t* sums, float* residual) {
  scalar_kernel_table()->quantize_activation(x, n, group, q, q4, scales, sums, residual);
}
void rmsnorm(const float* x, const float* weight, int32_t n, float eps, float* out) {
  scalar_kernel_table()->rmsnorm(x, weight, n, eps, out);
}
void softmax(float* x, int32_t n) { scalar_kernel_table()->softmax(x, n); }
void swiglu(const float* gate, const float* up, int32_t n, float* out) {
  scalar_kernel_table()->swiglu(gate, up, n, out);
}

constexpr KernelTable kTable{
    .isa = Isa::Neon,
    .quantize_activation = quantize_activation,
    .matvec = matvec,
    .matmat = matmat,
    .dot = dot,
    .rmsnorm = rmsnorm,
    .softmax = softmax,
    .swiglu = swiglu,
    .attention_scores = attention_scores,
    .attention_values = attention_values,
    .attention_scores_f16 = attention_scores_f16,
    .attention_values_f16 = attention_values_f16,
    .convert_f32_to_f16 = convert_f32_to_f16,
};

}  // namespace

const KernelTable* neon_kernel_table() { return &kTable; }

}  // namespace colibri::kernels

#endif  // __aarch64__
