// The aarch64 path: NEON with the dot-product extension (compiled with
// -march=armv8.2-a+dotprod on aarch64 only, see engine/CMakeLists.txt; reached
// after getauxval reported HWCAP_ASIMDDP). It covers the kernels decode time
// depends on: int8-activation Q8/Q4/Q4R16 products (sdot), Q8R16 products
// (int8 and f32 activations), f32/f16/bf16 products and attention. The rest
// (activation quantization, norms, softmax, and the f32-activation
// Q8/Q4/Q4R16 fallbacks) forwards to the portable path, which keeps the
// quantized bytes identical by construction. Everything here has internal
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

// ---- Q8R16 --------------------------------------------------------------------------
//
// Lanes are rows: a 64-byte chunk (4 columns of a 16-row block) is 4 registers
// of 4 rows each, and sdot by element multiplies each row's 4 bytes by one
// 4-byte lane of x, so one 16-byte load of x serves 4 chunks and 4 int32x4
// accumulators hold the block's 16 row sums with no horizontal adds. The
// per-group integer dots are exact (their order is free); the float steps are
// the portable definition's, lane by lane: the scale product rounded on its
// own (vmulq), then one fused multiply-add into the row's sum, the residual
// plane's right after. So matvec and matmat give kernels_scalar.cpp's bits.

size_t q8r16_cols4(const Matrix& w) { return (static_cast<size_t>(w.cols) + 3) / 4 * 4; }

// Chunks [k0, k1) of group g: a group is whole chunks (group % 4 == 0), and
// the last one's padding columns hold zero weights (and zero int8 activations).
void q8r16_group_chunks(const Matrix& w, int32_t g, size_t& k0, size_t& k1) {
  const size_t begin = static_cast<size_t>(g) * static_cast<size_t>(w.group);
  k0 = begin / 4;
  k1 = (min_size(static_cast<size_t>(w.cols), begin + static_cast<size_t>(w.group)) + 3) / 4;
}

// 4 activation bytes (one chunk's columns) in every 32-bit lane. A 16-byte
// load there could pass the end of the activation buffer.
int8x16_t load_s8x4(const std::int8_t* p) {
  std::int32_t bytes;
  std::memcpy(&bytes, p, 4);
  return vreinterpretq_s8_s32(vdupq_n_s32(bytes));
}

// One chunk of the block into the int32 dots: lane Lane of xv (and rv) holds
// the chunk's 4 activation bytes. The Q8R16 helpers are forced inline: GCC
// (at -O3 too) otherwise keeps q8r16_dots a call per group in matvec, its
// accumulators passed through memory.
template <int Lane, bool Residual, int NV>
[[gnu::always_inline]] inline void q8r16_dot_chunk(const std::int8_t* chunk, const int8x16_t (&xv)[NV],
                                                   const int8x16_t (&rv)[NV], int32x4_t (&dot)[NV][4],
                                                   int32x4_t (&lo)[NV][4]) {
  int8x16_t wv[4];
  for (int i = 0; i < 4; ++i) wv[i] = vld1q_s8(chunk + 16 * static_cast<size_t>(i));
  for (int v = 0; v < NV; ++v)
    for (int i = 0; i < 4; ++i) {
      dot[v][i] = vdotq_laneq_s32(dot[v][i], wv[i], xv[v], Lane);
      if constexpr (Residual) lo[v][i] = vdotq_laneq_s32(lo[v][i], wv[i], rv[v], Lane);
    }
}

// The exact int32 dots of one 16-row block (`block` is its first byte) with
// NV activation vectors over chunks [k0, k1): dot[v][i] holds rows 4i..4i+3.
// The weights of a chunk are loaded once for all NV vectors.
template <bool Residual, int NV>
[[gnu::always_inline]] inline void q8r16_dots(const std::int8_t* block, size_t k0, size_t k1,
                                              const std::int8_t* const (&q)[NV],
                                              const std::int8_t* const (&residual_q)[NV], int32x4_t (&dot)[NV][4],
                                              int32x4_t (&lo)[NV][4]) {
  for (int v = 0; v < NV; ++v)
    for (int i = 0; i < 4; ++i) dot[v][i] = lo[v][i] = vdupq_n_s32(0);
  int8x16_t xv[NV], rv[NV];
  size_t k = k0;
  for (; k + 4 <= k1; k += 4) {
    for (int v = 0; v < NV; ++v) {
      xv[v] = vld1q_s8(q[v] + 4 * k);
      rv[v] = Residual ? vld1q_s8(residual_q[v] + 4 * k) : xv[v];
    }
    const std::int8_t* chunk = block + 64 * k;
    q8r16_dot_chunk<0, Residual, NV>(chunk, xv, rv, dot, lo);
    q8r16_dot_chunk<1, Residual, NV>(chunk + 64, xv, rv, dot, lo);
    q8r16_dot_chunk<2, Residual, NV>(chunk + 128, xv, rv, dot, lo);
    q8r16_dot_chunk<3, Residual, NV>(chunk + 192, xv, rv, dot, lo);
  }
  for (; k < k1; ++k) {
    for (int v = 0; v < NV; ++v) {
      xv[v] = load_s8x4(q[v] + 4 * k);
      rv[v] = Residual ? load_s8x4(residual_q[v] + 4 * k) : xv[v];
    }
    q8r16_dot_chunk<0, Residual, NV>(block + 64 * k, xv, rv, dot, lo);
  }
}

// acc += dot * (w_scales * x_scale), the product rounded first: std::fma(float(d), ws * xs, acc).
void q8r16_scale_step(float32x4_t (&acc)[4], const int32x4_t (&dot)[4], const float32x4_t (&w_scales)[4],
                      float x_scale) {
  const float32x4_t xs = vdupq_n_f32(x_scale);
  for (int i = 0; i < 4; ++i) acc[i] = vfmaq_f32(acc[i], vcvtq_f32_s32(dot[i]), vmulq_f32(w_scales[i], xs));
}

// Both planes' steps (kernels_scalar.cpp): for groups up to
// kQ8R16CombinedMaxGroup the dots added exactly in int32 and one step.
void q8r16_planes_step(float32x4_t (&acc)[4], const int32x4_t (&dot)[4], const int32x4_t (&lo)[4],
                       const float32x4_t (&w_scales)[4], const ActivationView& a, int32_t g, bool combined) {
  static_assert(kResidualRatio == 1 << 7);
  if (!combined) {
    q8r16_scale_step(acc, dot, w_scales, a.scales[g]);
    q8r16_scale_step(acc, lo, w_scales, a.residual_scales[g]);
    return;
  }
  int32x4_t both[4];
  for (int i = 0; i < 4; ++i) both[i] = vaddq_s32(vshlq_n_s32(dot[i], 7), lo[i]);
  q8r16_scale_step(acc, both, w_scales, a.residual_scales[g]);
}

// Column J's byte of each row (4 rows' 4 bytes per register), sign-extended.
template <int J>
float32x4_t q8r16_column(int32x4_t rows4) {
  if constexpr (J == 3) return vcvtq_f32_s32(vshrq_n_s32(rows4, 24));
  else return vcvtq_f32_s32(vshrq_n_s32(vshlq_n_s32(rows4, 24 - 8 * J), 24));
}

template <int J, int NV>
[[gnu::always_inline]] inline void q8r16_f32_column(const int32x4_t (&rows4)[4], const float32x4_t (&xv)[NV],
                                                    float32x4_t (&partial)[NV][4]) {
  float32x4_t wf[4];
  for (int i = 0; i < 4; ++i) wf[i] = q8r16_column<J>(rows4[i]);
  for (int v = 0; v < NV; ++v)
    for (int i = 0; i < 4; ++i) partial[v][i] = vfmaq_laneq_f32(partial[v][i], wf[i], xv[v], J);
}

// Partial sums of one chunk's first len columns with NV f32 vectors, columns
// in order: p = fma(float(w), x[c], p). The bytes are widened once for all
// NV vectors; x is never read past the chunk's len columns.
template <int NV>
[[gnu::always_inline]] inline void q8r16_f32_chunk(const std::int8_t* chunk, size_t len, const float* const (&x)[NV],
                                                   size_t c, float32x4_t (&partial)[NV][4]) {
  int32x4_t rows4[4];
  for (int i = 0; i < 4; ++i) rows4[i] = vreinterpretq_s32_s8(vld1q_s8(chunk + 16 * static_cast<size_t>(i)));
  float32x4_t xv[NV];
  for (int v = 0; v < NV; ++v) xv[v] = load4(x[v] + c, len);
  q8r16_f32_column<0, NV>(rows4, xv, partial);
  if (len > 1) q8r16_f32_column<1, NV>(rows4, xv, partial);
  if (len > 2) q8r16_f32_column<2, NV>(rows4, xv, partial);
  if (len > 3) q8r16_f32_column<3, NV>(rows4, xv, partial);
}

// The group's partial sums for NV vectors: whole chunks, then the ragged one.
template <int NV>
[[gnu::always_inline]] inline void q8r16_f32_group(const std::int8_t* block, size_t begin, size_t end,
                                                   const float* const (&x)[NV], float32x4_t (&partial)[NV][4]) {
  for (int v = 0; v < NV; ++v)
    for (int i = 0; i < 4; ++i) partial[v][i] = vdupq_n_f32(0.0f);
  size_t c = begin;
  for (; c + 4 <= end; c += 4) q8r16_f32_chunk<NV>(block + 16 * c, 4, x, c, partial);
  if (c < end) q8r16_f32_chunk<NV>(block + 16 * c, end - c, x, c, partial);
}

// Writes the block's rows that lie in [row_begin, row_end).
void q8r16_store(const float32x4_t (&acc)[4], float* y, int32_t r0, int32_t row_begin, int32_t row_end) {
  if (r0 >= row_begin && r0 + kQ8R16Rows <= row_end) {
    for (int i = 0; i < 4; ++i) vst1q_f32(y + r0 + 4 * i, acc[i]);
    return;
  }
  float buffer[kQ8R16Rows];
  for (int i = 0; i < 4; ++i) vst1q_f32(buffer + 4 * i, acc[i]);
  const int32_t first = r0 > row_begin ? r0 : row_begin;
  const int32_t last = r0 + kQ8R16Rows < row_end ? r0 + kQ8R16Rows : row_end;
  for (int32_t r = first; r < last; ++r) y[r] = buffer[r - r0];
}

template <bool Residual>
void q8r16_int8_matvec(const Matrix& w, const ActivationView& xq, float* y, int32_t row_begin, int32_t row_end) {
  const size_t cols4 = q8r16_cols4(w);
  const int32_t groups = group_count(w.cols, w.group);
  const std::int8_t* const q[1] = {xq.q};
  const std::int8_t* const residual_q[1] = {xq.residual_q};
  for (int32_t b = row_begin / kQ8R16Rows; b * kQ8R16Rows < row_end; ++b) {
    const std::int8_t* block = static_cast<const std::int8_t*>(w.data) + static_cast<size_t>(b) * kQ8R16Rows * cols4;
    const float* block_scales = w.scales + static_cast<size_t>(b) * groups * kQ8R16Rows;
    float32x4_t acc[4];
    for (int i = 0; i < 4; ++i) acc[i] = vdupq_n_f32(0.0f);
    for (int32_t g = 0; g < groups; ++g) {
      size_t k0, k1;
      q8r16_group_chunks(w, g, k0, k1);
      int32x4_t dot[1][4], lo[1][4];
      q8r16_dots<Residual, 1>(block, k0, k1, q, residual_q, dot, lo);
      float32x4_t w_scales[4];
      for (int i = 0; i < 4; ++i) w_scales[i] = vld1q_f32(block_scales + static_cast<size_t>(g) * kQ8R16Rows + 4 * i);
      if constexpr (Residual)
        q8r16_planes_step(acc, dot[0], lo[0], w_scales, xq, g, w.group <= kQ8R16CombinedMaxGroup);
      else
        q8r16_scale_step(acc, dot[0], w_scales, xq.scales[g]);
    }
    q8r16_store(acc, y, b * kQ8R16Rows, row_begin, row_end);
  }
}

void q8r16_f32_matvec(const Matrix& w, const float* x, float* y, int32_t row_begin, int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols), group = static_cast<size_t>(w.group);
  const size_t cols4 = q8r16_cols4(w);
  const int32_t groups = group_count(w.cols, w.group);
  const float* const xs[1] = {x};
  for (int32_t b = row_begin / kQ8R16Rows; b * kQ8R16Rows < row_end; ++b) {
    const std::int8_t* block = static_cast<const std::int8_t*>(w.data) + static_cast<size_t>(b) * kQ8R16Rows * cols4;
    const float* block_scales = w.scales + static_cast<size_t>(b) * groups * kQ8R16Rows;
    float32x4_t acc[4];
    for (int i = 0; i < 4; ++i) acc[i] = vdupq_n_f32(0.0f);
    for (int32_t g = 0; g < groups; ++g) {
      const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
      float32x4_t partial[1][4];
      q8r16_f32_group<1>(block, begin, end, xs, partial);
      const float* group_scales = block_scales + static_cast<size_t>(g) * kQ8R16Rows;
      for (int i = 0; i < 4; ++i) acc[i] = vfmaq_f32(acc[i], partial[0][i], vld1q_f32(group_scales + 4 * i));
    }
    q8r16_store(acc, y, b * kQ8R16Rows, row_begin, row_end);
  }
}

// ---- Q4R16 --------------------------------------------------------------------------
//
// Q8R16's walk over 4-bit codes: a 64-byte chunk (8 columns of a 16-row block)
// is 4 registers of 4 rows. vand 0x0f keeps columns c..c+3 of each row's
// dword, ushr 4 columns c+4..c+7 (weight_format.h); codes 0..15 are valid
// signed bytes, so sdot by element takes both as they are, and one 16-byte
// load of x serves 2 chunks (lanes 0-1, then 2-3). Scales and minimums are
// f16, widened by fcvtl (exact). The float steps are the portable
// definition's, lane by lane (kernels_scalar.cpp "Q4R16"). f32 activations go
// to the portable kernel, as on the x86 paths.

struct Q4R16Block {
  const std::uint8_t* values;   // the block's first byte
  const std::uint16_t* scales;  // its group 0: 16 f16 values per group
  const std::uint16_t* mins;
};

Q4R16Block q4r16_block(const Matrix& w, int32_t groups, int32_t b) {
  const size_t i = static_cast<size_t>(b);
  const size_t block_bytes = kQ4R16Rows * ((static_cast<size_t>(w.cols) + 7) / 8 * 4);
  const size_t block_scales = static_cast<size_t>(groups) * kQ4R16Rows;
  return {static_cast<const std::uint8_t*>(w.data) + i * block_bytes, w.half_scales + i * block_scales,
          w.half_mins + i * block_scales};
}

// 8-column chunks [k0, k1) of group g (group % 8 == 0; the last chunk's
// padding columns hold code 0 and zero int8 activations).
void q4r16_group_chunks(const Matrix& w, int32_t g, size_t& k0, size_t& k1) {
  const size_t begin = static_cast<size_t>(g) * static_cast<size_t>(w.group);
  k0 = begin / 8;
  k1 = (min_size(static_cast<size_t>(w.cols), begin + static_cast<size_t>(w.group)) + 7) / 8;
}

// One chunk into the int32 dots: lanes Lane and Lane + 1 of xv (and rv) hold
// its 8 activation bytes.
template <int Lane, bool Residual, int NV>
[[gnu::always_inline]] inline void q4r16_dot_chunk(const std::uint8_t* chunk, const int8x16_t (&xv)[NV],
                                                   const int8x16_t (&rv)[NV], int32x4_t (&dot)[NV][4],
                                                   int32x4_t (&lo)[NV][4]) {
  int8x16_t low[4], high[4];
  for (int i = 0; i < 4; ++i) {
    const uint8x16_t wv = vld1q_u8(chunk + 16 * static_cast<size_t>(i));
    low[i] = vreinterpretq_s8_u8(vandq_u8(wv, vdupq_n_u8(0x0f)));
    high[i] = vreinterpretq_s8_u8(vshrq_n_u8(wv, 4));
  }
  for (int v = 0; v < NV; ++v)
    for (int i = 0; i < 4; ++i) {
      dot[v][i] = vdotq_laneq_s32(dot[v][i], low[i], xv[v], Lane);
      dot[v][i] = vdotq_laneq_s32(dot[v][i], high[i], xv[v], Lane + 1);
      if constexpr (Residual) {
        lo[v][i] = vdotq_laneq_s32(lo[v][i], low[i], rv[v], Lane);
        lo[v][i] = vdotq_laneq_s32(lo[v][i], high[i], rv[v], Lane + 1);
      }
    }
}

// The exact int32 dots of one block with NV vectors over chunks [k0, k1):
// dot[v][i] holds rows 4i..4i+3. A chunk's codes are unpacked once for all NV.
template <bool Residual, int NV>
[[gnu::always_inline]] inline void q4r16_dots(const std::uint8_t* block, size_t k0, size_t k1,
                                              const std::int8_t* const (&q)[NV],
                                              const std::int8_t* const (&residual_q)[NV], int32x4_t (&dot)[NV][4],
                                              int32x4_t (&lo)[NV][4]) {
  for (int v = 0; v < NV; ++v)
    for (int i = 0; i < 4; ++i) dot[v][i] = lo[v][i] = vdupq_n_s32(0);
  int8x16_t xv[NV], rv[NV];
  size_t k = k0;
  for (; k + 2 <= k1; k += 2) {
    for (int v = 0; v < NV; ++v) {
      xv[v] = vld1q_s8(q[v] + 8 * k);
      rv[v] = Residual ? vld1q_s8(residual_q[v] + 8 * k) : xv[v];
    }
    const std::uint8_t* chunk = block + 64 * k;
    q4r16_dot_chunk<0, Residual, NV>(chunk, xv, rv, dot, lo);
    q4r16_dot_chunk<2, Residual, NV>(chunk + 64, xv, rv, dot, lo);
  }
  if (k < k1) {  // an odd chunk: 8 bytes of x (16 could pass the buffer's end)
    for (int v = 0; v < NV; ++v) {
      xv[v] = vcombine_s8(vld1_s8(q[v] + 8 * k), vdup_n_s8(0));
      rv[v] = Residual ? vcombine_s8(vld1_s8(residual_q[v] + 8 * k), vdup_n_s8(0)) : xv[v];
    }
    q4r16_dot_chunk<0, Residual, NV>(block + 64 * k, xv, rv, dot, lo);
  }
}

// 16 f16 values of group g widened: 4 registers of 4 rows.
void q4r16_load_f16x16(const std::uint16_t* plane, int32_t g, float32x4_t (&out)[4]) {
  const std::uint16_t* p = plane + static_cast<size_t>(g) * kQ4R16Rows;
  for (int i = 0; i < 4; ++i) out[i] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * i)));
}

// One vector's float steps for group g: fma(d, ws * xs, acc), then
// fma(w_min, xs * sum(x), acc); the residual plane's two right after.
template <bool Residual>
void q4r16_scale_step(float32x4_t (&acc)[4], const int32x4_t (&dot)[4], const int32x4_t (&lo)[4],
                      const float32x4_t (&w_scales)[4], const float32x4_t (&w_mins)[4], const ActivationView& a,
                      int32_t g) {
  q8r16_scale_step(acc, dot, w_scales, a.scales[g]);
  const float32x4_t x_sum = vdupq_n_f32(a.scales[g] * static_cast<float>(a.sums[g]));
  for (int i = 0; i < 4; ++i) acc[i] = vfmaq_f32(acc[i], w_mins[i], x_sum);
  if constexpr (Residual) {
    q8r16_scale_step(acc, lo, w_scales, a.residual_scales[g]);
    const float32x4_t r_sum = vdupq_n_f32(a.residual_scales[g] * static_cast<float>(a.residual_sums[g]));
    for (int i = 0; i < 4; ++i) acc[i] = vfmaq_f32(acc[i], w_mins[i], r_sum);
  }
}

template <bool Residual>
void q4r16_int8_matvec(const Matrix& w, const ActivationView& xq, float* y, int32_t row_begin, int32_t row_end) {
  const int32_t groups = group_count(w.cols, w.group);
  const std::int8_t* const q[1] = {xq.q};
  const std::int8_t* const residual_q[1] = {xq.residual_q};
  for (int32_t b = row_begin / kQ4R16Rows; b * kQ4R16Rows < row_end; ++b) {
    const Q4R16Block block = q4r16_block(w, groups, b);
    float32x4_t acc[4];
    for (int i = 0; i < 4; ++i) acc[i] = vdupq_n_f32(0.0f);
    for (int32_t g = 0; g < groups; ++g) {
      size_t k0, k1;
      q4r16_group_chunks(w, g, k0, k1);
      int32x4_t dot[1][4], lo[1][4];
      q4r16_dots<Residual, 1>(block.values, k0, k1, q, residual_q, dot, lo);
      float32x4_t w_scales[4], w_mins[4];
      q4r16_load_f16x16(block.scales, g, w_scales);
      q4r16_load_f16x16(block.mins, g, w_mins);
      q4r16_scale_step<Residual>(acc, dot[0], lo[0], w_scales, w_mins, xq, g);
    }
    q8r16_store(acc, y, b * kQ4R16Rows, row_begin, row_end);
  }
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
    case WeightFormat::Q8R16:
      if (xq != nullptr && xq->residual_q != nullptr) return q8r16_int8_matvec<true>(w, *xq, y, row_begin, row_end);
      if (xq != nullptr) return q8r16_int8_matvec<false>(w, *xq, y, row_begin, row_end);
      return q8r16_f32_matvec(w, x, y, row_begin, row_end);
    case WeightFormat::Q4R16:  // f32 activations: the portable kernel
      if (xq != nullptr && xq->residual_q != nullptr) return q4r16_int8_matvec<true>(w, *xq, y, row_begin, row_end);
      if (xq != nullptr) return q4r16_int8_matvec<false>(w, *xq, y, row_begin, row_end);
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

// Q8R16: per 16-row block and group, the group's weights (16 x group bytes,
// in L1 after the first tile) go through every vector tile; each vector's 16
// row sums wait in memory between groups, which leaves the registers to the
// tile's integer or partial accumulators. Every (row, vector) runs matvec's
// float steps in matvec's order, so the bits are matvec's.
constexpr int32_t kQ8R16Vectors = 64;

template <int NV, class Tile>
void vector_tile_rest(int32_t rest, int32_t v, const Tile& tile) {
  if (rest == NV) return tile.template operator()<NV>(v);
  if constexpr (NV > 1) vector_tile_rest<NV - 1>(rest, v, tile);
}

template <int NV, class Tile>
void for_vector_tiles(int32_t n, const Tile& tile) {
  int32_t v = 0;
  for (; v + NV <= n; v += NV) tile.template operator()<NV>(v);
  if constexpr (NV > 1)
    if (v < n) vector_tile_rest<NV - 1>(n - v, v, tile);
}

// Blocks of 16 rows (Q8R16 and Q4R16), each through every vector in slices
// of kQ8R16Vectors; `group_step(b, g, v0, count, acc)` adds group g of block
// b to the sums acc[v][16] of vectors [v0, v0 + count).
template <class GroupStep>
void r16_matmat_blocks(int32_t n, int32_t groups, float* const* y, int32_t row_begin, int32_t row_end,
                       const GroupStep& group_step) {
  alignas(16) float acc[kQ8R16Vectors][kQ8R16Rows];
  for (int32_t b = row_begin / kQ8R16Rows; b * kQ8R16Rows < row_end; ++b) {
    for (int32_t v0 = 0; v0 < n; v0 += kQ8R16Vectors) {
      const int32_t count = n - v0 < kQ8R16Vectors ? n - v0 : kQ8R16Vectors;
      std::memset(acc, 0, sizeof(float) * kQ8R16Rows * static_cast<size_t>(count));
      for (int32_t g = 0; g < groups; ++g) group_step(b, g, v0, count, acc);
      for (int32_t v = 0; v < count; ++v) {
        float32x4_t sums[4];
        for (int i = 0; i < 4; ++i) sums[i] = vld1q_f32(acc[v] + 4 * i);
        q8r16_store(sums, y[v0 + v], b * kQ8R16Rows, row_begin, row_end);
      }
    }
  }
}

// Q8R16's blocks: `group_step(block, block_scales, g, v0, count, acc)`.
template <class GroupStep>
void q8r16_matmat_blocks(const Matrix& w, int32_t n, float* const* y, int32_t row_begin, int32_t row_end,
                         const GroupStep& group_step) {
  const size_t cols4 = q8r16_cols4(w);
  const int32_t groups = group_count(w.cols, w.group);
  r16_matmat_blocks(n, groups, y, row_begin, row_end,
                    [&](int32_t b, int32_t g, int32_t v0, int32_t count, float (*acc)[kQ8R16Rows]) {
    const std::int8_t* block = static_cast<const std::int8_t*>(w.data) + static_cast<size_t>(b) * kQ8R16Rows * cols4;
    const float* block_scales = w.scales + static_cast<size_t>(b) * groups * kQ8R16Rows;
    group_step(block, block_scales, g, v0, count, acc);
  });
}

// Tiles of 4 vectors (2 with the residual plane): 16 (or 2 x 8) integer
// accumulators, 4 weight and 4 activation registers.
template <bool Residual>
void q8r16_int8_matmat(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y,
                       int32_t row_begin, int32_t row_end) {
  constexpr int kTile = Residual ? 2 : 4;
  q8r16_matmat_blocks(w, n, y, row_begin, row_end,
                      [&](const std::int8_t* block, const float* block_scales, int32_t g, int32_t v0, int32_t count,
                          float (*acc)[kQ8R16Rows]) {
    size_t k0, k1;
    q8r16_group_chunks(w, g, k0, k1);
    float32x4_t w_scales[4];
    for (int i = 0; i < 4; ++i) w_scales[i] = vld1q_f32(block_scales + static_cast<size_t>(g) * kQ8R16Rows + 4 * i);
    for_vector_tiles<kTile>(count, [&]<int NV>(int32_t t0) {
      const std::int8_t* q[NV];
      const std::int8_t* residual_q[NV];
      for (int v = 0; v < NV; ++v) {
        q[v] = xq[v0 + t0 + v]->q;
        residual_q[v] = xq[v0 + t0 + v]->residual_q;
      }
      int32x4_t dot[NV][4], lo[NV][4];
      q8r16_dots<Residual, NV>(block, k0, k1, q, residual_q, dot, lo);
      for (int v = 0; v < NV; ++v) {
        const ActivationView& a = *xq[v0 + t0 + v];
        float* sums = acc[t0 + v];
        float32x4_t s[4];
        for (int i = 0; i < 4; ++i) s[i] = vld1q_f32(sums + 4 * i);
        if constexpr (Residual)
          q8r16_planes_step(s, dot[v], lo[v], w_scales, a, g, w.group <= kQ8R16CombinedMaxGroup);
        else
          q8r16_scale_step(s, dot[v], w_scales, a.scales[g]);
        for (int i = 0; i < 4; ++i) vst1q_f32(sums + 4 * i, s[i]);
      }
    });
  });
}

// Tiles of 4 vectors: 16 partial accumulators, each chunk's bytes widened
// once for the tile.
void q8r16_f32_matmat(const Matrix& w, int32_t n, const float* const* x, float* const* y, int32_t row_begin,
                      int32_t row_end) {
  const size_t cols = static_cast<size_t>(w.cols), group = static_cast<size_t>(w.group);
  q8r16_matmat_blocks(w, n, y, row_begin, row_end,
                      [&](const std::int8_t* block, const float* block_scales, int32_t g, int32_t v0, int32_t count,
                          float (*acc)[kQ8R16Rows]) {
    const size_t begin = static_cast<size_t>(g) * group, end = min_size(cols, begin + group);
    float32x4_t w_scales[4];
    for (int i = 0; i < 4; ++i) w_scales[i] = vld1q_f32(block_scales + static_cast<size_t>(g) * kQ8R16Rows + 4 * i);
    for_vector_tiles<4>(count, [&]<int NV>(int32_t t0) {
      const float* xs[NV];
      for (int v = 0; v < NV; ++v) xs[v] = x[v0 + t0 + v];
      float32x4_t partial[NV][4];
      q8r16_f32_group<NV>(block, begin, end, xs, partial);
      for (int v = 0; v < NV; ++v) {
        float* sums = acc[t0 + v];
        for (int i = 0; i < 4; ++i)
          vst1q_f32(sums + 4 * i, vfmaq_f32(vld1q_f32(sums + 4 * i), partial[v][i], w_scales[i]));
      }
    });
  });
}

// Q4R16: q8r16_int8_matmat's tiles over q4r16_dots (4 vectors, 2 with the
// residual plane: 16 or 2 x 8 accumulators, 8 code and 4 activation registers).
template <bool Residual>
void q4r16_int8_matmat(const Matrix& w, int32_t n, const ActivationView* const* xq, float* const* y,
                       int32_t row_begin, int32_t row_end) {
  constexpr int kTile = Residual ? 2 : 4;
  const int32_t groups = group_count(w.cols, w.group);
  r16_matmat_blocks(n, groups, y, row_begin, row_end,
                    [&](int32_t b, int32_t g, int32_t v0, int32_t count, float (*acc)[kQ8R16Rows]) {
    const Q4R16Block block = q4r16_block(w, groups, b);
    size_t k0, k1;
    q4r16_group_chunks(w, g, k0, k1);
    float32x4_t w_scales[4], w_mins[4];
    q4r16_load_f16x16(block.scales, g, w_scales);
    q4r16_load_f16x16(block.mins, g, w_mins);
    for_vector_tiles<kTile>(count, [&]<int NV>(int32_t t0) {
      const std::int8_t* q[NV];
      const std::int8_t* residual_q[NV];
      for (int v = 0; v < NV; ++v) {
        q[v] = xq[v0 + t0 + v]->q;
        residual_q[v] = xq[v0 + t0 + v]->residual_q;
      }
      int32x4_t dot[NV][4], lo[NV][4];
      q4r16_dots<Residual, NV>(block.values, k0, k1, q, residual_q, dot, lo);
      for (int v = 0; v < NV; ++v) {
        float* sums = acc[t0 + v];
        float32x4_t s[4];
        for (int i = 0; i < 4; ++i) s[i] = vld1q_f32(sums + 4 * i);
        q4r16_scale_step<Residual>(s, dot[v], lo[v], w_scales, w_mins, *xq[v0 + t0 + v], g);
        for (int i = 0; i < 4; ++i) vst1q_f32(sums + 4 * i, s[i]);
      }
    });
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
    case WeightFormat::Q8R16:
      if (xq != nullptr && residual) return q8r16_int8_matmat<true>(w, n, xq, y, row_begin, row_end);
      if (xq != nullptr) return q8r16_int8_matmat<false>(w, n, xq, y, row_begin, row_end);
      return q8r16_f32_matmat(w, n, x, y, row_begin, row_end);
    case WeightFormat::Q4R16:  // f32 activations: the portable kernel
      if (xq != nullptr && residual) return q4r16_int8_matmat<true>(w, n, xq, y, row_begin, row_end);
      if (xq != nullptr) return q4r16_int8_matmat<false>(w, n, xq, y, row_begin, row_end);
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

void quantize_residual(const float* r, int32_t n, int32_t group, const float* first_scales, std::int8_t* q,
                       std::int8_t* q4, float* scales, int32_t* sums) {
  scalar_kernel_table()->quantize_residual(r, n, group, first_scales, q, q4, scales, sums);
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
    .quantize_residual = quantize_residual,
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
