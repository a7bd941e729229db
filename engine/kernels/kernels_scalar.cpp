// The portable path: plain C++ with no instruction-set flags. It is what runs
// on CPUs without AVX2/NEON, the fallback the vector paths call for shapes
// they do not specialise (odd Q4 group sizes), and the definition of the int8
// activation arithmetic the vector paths reproduce: per group an exact int32
// dot product of the int8 weights (or 4-bit codes) with the int8 activations,
// scaled by weight scale x activation scale.
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>

#include "core/dtype.h"
#include "kernels/kernel_table.h"

namespace colibri::kernels {
namespace {

float bf16_value(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return bf16_to_f32(bits);
}

float f16_value(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_to_f32(bits);
}

std::int32_t group_count(std::int32_t cols, std::int32_t group) { return (cols + group - 1) / group; }

// Zeros q from n to a multiple of 128 and writes q4, q's complete 128-column
// blocks in the Q4 kernels' order (ActivationQ8).
void pad_and_rearrange(std::int8_t* q, std::int8_t* q4, std::int32_t n) {
  const std::int32_t padded = (n + 127) / 128 * 128;
  std::memset(q + n, 0, static_cast<std::size_t>(padded - n));
  for (std::int32_t block = 0; block + 128 <= n; block += 128)
    for (std::int32_t i = 0; i < 64; ++i) {
      q4[block + i] = q[block + 2 * i];
      q4[block + 64 + i] = q[block + 2 * i + 1];
    }
}

void quantize_activation(const float* x, std::int32_t n, std::int32_t group, std::int8_t* q,
                         std::int8_t* q4, float* scales, std::int32_t* sums, float* residual) {
  const std::int32_t groups = group_count(n, group);
  for (std::int32_t g = 0; g < groups; ++g) {
    const std::int32_t begin = g * group, end = std::min(n, begin + group);
    float amax = 0.0f;
    for (std::int32_t c = begin; c < end; ++c) amax = std::max(amax, std::fabs(x[c]));  // skips NaN
    // The rule every path implements bit for bit: multiply by 127 / amax and
    // round to nearest even (the vector converts' default mode).
    const float inverse = amax >= kSmallestActivationAmax ? 127.0f / amax : 0.0f;
    std::int32_t sum = 0;
    for (std::int32_t c = begin; c < end; ++c) {
      const float v = std::nearbyint(x[c] * inverse);
      const auto value = std::isnan(v) ? 0 : static_cast<std::int32_t>(std::clamp(v, -127.0f, 127.0f));
      q[c] = static_cast<std::int8_t>(value);
      sum += value;
    }
    scales[g] = amax / 127.0f;
    sums[g] = sum;
    if (residual != nullptr)
      for (std::int32_t c = begin; c < end; ++c) residual[c] = x[c] - scales[g] * static_cast<float>(q[c]);
  }
  pad_and_rearrange(q, q4, n);
}

// |r| is at most half the first plane's step, so only rounding reaches the
// limit. A fixed ratio lets the Q8R16 kernels add the planes' dots in int32.
void quantize_residual(const float* r, std::int32_t n, std::int32_t group, const float* first_scales,
                       std::int8_t* q, std::int8_t* q4, float* scales, std::int32_t* sums) {
  const std::int32_t groups = group_count(n, group);
  for (std::int32_t g = 0; g < groups; ++g) {
    const std::int32_t begin = g * group, end = std::min(n, begin + group);
    const float scale = first_scales[g] / static_cast<float>(kResidualRatio);
    const float inverse = scale >= std::numeric_limits<float>::min() ? 1.0f / scale : 0.0f;
    constexpr auto kLimit = static_cast<float>(kResidualLimit);
    // Adding and taking away 1.5 x 2^23 rounds |v| < 2^22 to nearest even,
    // as nearbyint does, without a library call per value.
    constexpr float kRound = 12582912.0f;
    std::int32_t sum = 0;
    for (std::int32_t c = begin; c < end; ++c) {
      float v = r[c] * inverse;
      v = v == v ? std::clamp(v, -kLimit, kLimit) : 0.0f;  // NaN: 0
      const auto value = static_cast<std::int32_t>((v + kRound) - kRound);
      q[c] = static_cast<std::int8_t>(value);
      sum += value;
    }
    scales[g] = scale;
    sums[g] = sum;
  }
  pad_and_rearrange(q, q4, n);
}

// ---- Q8R16 -----------------------------------------------------------------------
//
// Every path computes Q8R16 products exactly as these functions do, bit for
// bit, so results depend neither on the path nor on batching. Per row, groups
// in order: with int8 activations, the group's exact int32 dot d, then
// acc = fma(float(d), w_scale * x_scale, acc), and the residual plane's term
// the same way right after; with the residual plane and groups up to
// kQ8R16CombinedMaxGroup, one step for both planes instead:
// acc = fma(float(kResidualRatio * d + lo), w_scale * residual_scale, acc), the
// planes' dots added exactly in int32 (the residual scale is the first's
// divided by kResidualRatio); with f32 activations, the group's partial sum
// p = fma(float(w), x, p) over its columns in order, then
// acc = fma(p, w_scale, acc). Vector paths hold 16 rows in 16 lanes and run
// the same operations lane-wise. std::fma, not a*b+c: one rounding is part of
// the definition, and without -mfma a*b+c would round twice.

// The exact int32 dot products of one group's integer weights (value_at(c)
// for c in [begin, end)) with the activation planes: `dot` with q, `lo` with
// the residual plane (left 0 without one).
template <class ValueAt>
void group_dots(const ActivationView& xq, std::size_t begin, std::size_t end, ValueAt value_at, std::int32_t& dot,
                std::int32_t& lo) {
  dot = lo = 0;
  for (std::size_t c = begin; c < end; ++c) {
    const int value = value_at(c);
    dot += value * xq.q[c];
    if (xq.residual_q != nullptr) lo += value * xq.residual_q[c];
  }
}

struct Q8R16Row {
  const std::int8_t* values;  // column c at values[q8r16_column_offset(c)]
  const float* scales;        // group g at scales[g * 16]
};

Q8R16Row q8r16_row(const Matrix& w, std::int32_t r) {
  const std::size_t groups = static_cast<std::size_t>(group_count(w.cols, w.group));
  const auto row = static_cast<std::size_t>(r);
  return {static_cast<const std::int8_t*>(w.data) + q8r16_row_offset(static_cast<std::size_t>(w.cols), row),
          w.scales + q8r16_scale_index(groups, row, 0)};
}

inline int q8r16_value(const Q8R16Row& row, std::size_t c) { return row.values[q8r16_column_offset(c)]; }

float q8r16_row_int8(const Matrix& w, std::int32_t r, const ActivationView& xq) {
  const Q8R16Row row = q8r16_row(w, r);
  const std::size_t cols = static_cast<std::size_t>(w.cols);
  const std::int32_t groups = group_count(w.cols, w.group);
  float acc = 0.0f;
  for (std::int32_t g = 0; g < groups; ++g) {
    const std::size_t begin = static_cast<std::size_t>(g) * w.group;
    const std::size_t end = std::min(cols, begin + static_cast<std::size_t>(w.group));
    std::int32_t dot, lo;
    group_dots(xq, begin, end, [&](std::size_t c) { return q8r16_value(row, c); }, dot, lo);
    const float w_scale = row.scales[static_cast<std::size_t>(g) * kQ8R16Rows];
    if (xq.residual_q != nullptr && w.group <= kQ8R16CombinedMaxGroup) {
      acc = std::fma(static_cast<float>(kResidualRatio * dot + lo), w_scale * xq.residual_scales[g], acc);
      continue;
    }
    acc = std::fma(static_cast<float>(dot), w_scale * xq.scales[g], acc);
    if (xq.residual_q != nullptr) acc = std::fma(static_cast<float>(lo), w_scale * xq.residual_scales[g], acc);
  }
  return acc;
}

float q8r16_row_f32(const Matrix& w, std::int32_t r, const float* x) {
  const Q8R16Row row = q8r16_row(w, r);
  const std::size_t cols = static_cast<std::size_t>(w.cols);
  const std::int32_t groups = group_count(w.cols, w.group);
  float acc = 0.0f;
  for (std::int32_t g = 0; g < groups; ++g) {
    const std::size_t begin = static_cast<std::size_t>(g) * w.group;
    const std::size_t end = std::min(cols, begin + static_cast<std::size_t>(w.group));
    float partial = 0.0f;
    for (std::size_t c = begin; c < end; ++c) partial = std::fma(static_cast<float>(q8r16_value(row, c)), x[c], partial);
    acc = std::fma(partial, row.scales[static_cast<std::size_t>(g) * kQ8R16Rows], acc);
  }
  return acc;
}

// ---- Q4R16 -----------------------------------------------------------------------
//
// The definition every path reproduces bit for bit, in Q8R16's manner. Per
// row, groups in order, w = min + scale * code with scale and min widened
// from f16 (exactly). Int8 activations: the group's exact int32 dot d of the
// codes with the activations, then acc = fma(float(d), w_scale * x_scale, acc)
// and acc = fma(w_min, x_scale * float(sum of the group's activations), acc);
// the residual plane's two terms the same way right after. f32 activations:
// p = fma(float(code), x, p) and s = s + x over the group's columns in order,
// then acc = fma(p, w_scale, acc) and acc = fma(w_min, s, acc).

struct Q4R16Row {
  const std::uint8_t* values;     // column c in byte values[q4r16_column_offset(c)]
  const std::uint16_t* scales;    // group g at scales[g * 16]
  const std::uint16_t* mins;
};

Q4R16Row q4r16_row(const Matrix& w, std::int32_t r) {
  const std::size_t groups = static_cast<std::size_t>(group_count(w.cols, w.group));
  const auto row = static_cast<std::size_t>(r);
  const std::size_t slot = q8r16_scale_index(groups, row, 0);
  return {static_cast<const std::uint8_t*>(w.data) + q4r16_row_offset(static_cast<std::size_t>(w.cols), row),
          w.half_scales + slot, w.half_mins + slot};
}

inline int q4r16_code(const Q4R16Row& row, std::size_t c) {
  const std::uint8_t byte = row.values[q4r16_column_offset(c)];
  return q4r16_high_nibble(c) ? byte >> 4 : byte & 0x0f;
}

float q4r16_row_int8(const Matrix& w, std::int32_t r, const ActivationView& xq) {
  const Q4R16Row row = q4r16_row(w, r);
  const std::size_t cols = static_cast<std::size_t>(w.cols);
  const std::int32_t groups = group_count(w.cols, w.group);
  float acc = 0.0f;
  for (std::int32_t g = 0; g < groups; ++g) {
    const std::size_t begin = static_cast<std::size_t>(g) * w.group;
    const std::size_t end = std::min(cols, begin + static_cast<std::size_t>(w.group));
    std::int32_t dot, lo;
    group_dots(xq, begin, end, [&](std::size_t c) { return q4r16_code(row, c); }, dot, lo);
    const std::size_t slot = static_cast<std::size_t>(g) * kQ4R16Rows;
    const float w_scale = f16_to_f32(row.scales[slot]), w_min = f16_to_f32(row.mins[slot]);
    acc = std::fma(static_cast<float>(dot), w_scale * xq.scales[g], acc);
    acc = std::fma(w_min, xq.scales[g] * static_cast<float>(xq.sums[g]), acc);
    if (xq.residual_q != nullptr) {
      acc = std::fma(static_cast<float>(lo), w_scale * xq.residual_scales[g], acc);
      acc = std::fma(w_min, xq.residual_scales[g] * static_cast<float>(xq.residual_sums[g]), acc);
    }
  }
  return acc;
}

float q4r16_row_f32(const Matrix& w, std::int32_t r, const float* x) {
  const Q4R16Row row = q4r16_row(w, r);
  const std::size_t cols = static_cast<std::size_t>(w.cols);
  const std::int32_t groups = group_count(w.cols, w.group);
  float acc = 0.0f;
  for (std::int32_t g = 0; g < groups; ++g) {
    const std::size_t begin = static_cast<std::size_t>(g) * w.group;
    const std::size_t end = std::min(cols, begin + static_cast<std::size_t>(w.group));
    float partial = 0.0f, x_sum = 0.0f;
    for (std::size_t c = begin; c < end; ++c) {
      partial = std::fma(static_cast<float>(q4r16_code(row, c)), x[c], partial);
      x_sum = x_sum + x[c];
    }
    const std::size_t slot = static_cast<std::size_t>(g) * kQ4R16Rows;
    acc = std::fma(partial, f16_to_f32(row.scales[slot]), acc);
    acc = std::fma(f16_to_f32(row.mins[slot]), x_sum, acc);
  }
  return acc;
}

// One row of an int8-activation product. With the residual plane each group
// adds a second exact dot product with its own scale.
float q8_row_int8(const Matrix& w, std::int32_t r, const ActivationView& xq) {
  const std::size_t cols = static_cast<std::size_t>(w.cols);
  const std::int32_t groups = group_count(w.cols, w.group);
  const auto* q = static_cast<const std::int8_t*>(w.data) + r * cols;
  const float* ws = w.scales + static_cast<std::size_t>(r) * groups;
  float sum = 0.0f;
  for (std::int32_t g = 0; g < groups; ++g) {
    const std::size_t begin = static_cast<std::size_t>(g) * w.group;
    const std::size_t end = std::min(cols, begin + static_cast<std::size_t>(w.group));
    std::int32_t dot = 0;
    for (std::size_t c = begin; c < end; ++c) dot += q[c] * xq.q[c];
    sum += ws[g] * xq.scales[g] * static_cast<float>(dot);
    if (xq.residual_q != nullptr) {
      std::int32_t lo = 0;
      for (std::size_t c = begin; c < end; ++c) lo += q[c] * xq.residual_q[c];
      sum += ws[g] * xq.residual_scales[g] * static_cast<float>(lo);
    }
  }
  return sum;
}

float q4_row_int8(const Matrix& w, std::int32_t r, const ActivationView& xq) {
  const std::size_t cols = static_cast<std::size_t>(w.cols);
  const std::int32_t groups = group_count(w.cols, w.group);
  const auto* packed = static_cast<const std::uint8_t*>(w.data) + r * ((cols + 1) / 2);
  const float* ws = w.scales + static_cast<std::size_t>(r) * groups;
  const float* mins = w.mins + static_cast<std::size_t>(r) * groups;
  float sum = 0.0f;
  for (std::int32_t g = 0; g < groups; ++g) {
    const std::size_t begin = static_cast<std::size_t>(g) * w.group;
    const std::size_t end = std::min(cols, begin + static_cast<std::size_t>(w.group));
    std::int32_t dot, lo;
    group_dots(xq, begin, end, [&](std::size_t c) { return (c % 2 == 0) ? (packed[c / 2] & 0x0f) : (packed[c / 2] >> 4); },
               dot, lo);
    // w = min + scale * code, so the min term needs only the group's sum of x.
    sum += ws[g] * xq.scales[g] * static_cast<float>(dot) +
           mins[g] * (xq.scales[g] * static_cast<float>(xq.sums[g]));
    if (xq.residual_q != nullptr)
      sum += ws[g] * xq.residual_scales[g] * static_cast<float>(lo) +
             mins[g] * (xq.residual_scales[g] * static_cast<float>(xq.residual_sums[g]));
  }
  return sum;
}

// One row with f32 activations: the reference's arithmetic with cheaper
// element conversions.
float row_f32(const Matrix& w, std::int32_t r, const float* x) {
  const std::size_t cols = static_cast<std::size_t>(w.cols);
  const auto* bytes = static_cast<const std::uint8_t*>(w.data);
  float sum = 0.0f;
  switch (w.format) {
    case WeightFormat::F32: {
      const float* row = static_cast<const float*>(w.data) + r * cols;
      for (std::size_t c = 0; c < cols; ++c) sum += row[c] * x[c];
      return sum;
    }
    case WeightFormat::F16: {
      const std::uint8_t* row = bytes + 2 * r * cols;
      for (std::size_t c = 0; c < cols; ++c) sum += f16_value(row + 2 * c) * x[c];
      return sum;
    }
    case WeightFormat::BF16: {
      const std::uint8_t* row = bytes + 2 * r * cols;
      for (std::size_t c = 0; c < cols; ++c) sum += bf16_value(row + 2 * c) * x[c];
      return sum;
    }
    case WeightFormat::Q8R16:
      return q8r16_row_f32(w, r, x);
    case WeightFormat::Q4R16:
      return q4r16_row_f32(w, r, x);
    case WeightFormat::Q8:
    case WeightFormat::Q4:
      break;
  }
  const std::int32_t groups = group_count(w.cols, w.group);
  for (std::int32_t g = 0; g < groups; ++g) {
    const std::size_t begin = static_cast<std::size_t>(g) * w.group;
    const std::size_t end = std::min(cols, begin + static_cast<std::size_t>(w.group));
    const std::size_t slot = static_cast<std::size_t>(r) * groups + g;
    float partial = 0.0f, x_sum = 0.0f;
    if (w.format == WeightFormat::Q8) {
      const auto* q = reinterpret_cast<const std::int8_t*>(bytes) + r * cols;
      for (std::size_t c = begin; c < end; ++c) partial += static_cast<float>(q[c]) * x[c];
      sum += w.scales[slot] * partial;
    } else {
      const std::uint8_t* packed = bytes + r * ((cols + 1) / 2);
      for (std::size_t c = begin; c < end; ++c) {
        const int code = (c % 2 == 0) ? (packed[c / 2] & 0x0f) : (packed[c / 2] >> 4);
        partial += static_cast<float>(code) * x[c];
        x_sum += x[c];
      }
      sum += w.scales[slot] * partial + w.mins[slot] * x_sum;
    }
  }
  return sum;
}

void matvec(const Matrix& w, const float* x, const ActivationView* xq, float* y, std::int32_t row_begin,
            std::int32_t row_end) {
  if (w.format == WeightFormat::Q8R16) {
    for (std::int32_t r = row_begin; r < row_end; ++r)
      y[r] = xq != nullptr ? q8r16_row_int8(w, r, *xq) : q8r16_row_f32(w, r, x);
    return;
  }
  if (w.format == WeightFormat::Q4R16) {
    for (std::int32_t r = row_begin; r < row_end; ++r)
      y[r] = xq != nullptr ? q4r16_row_int8(w, r, *xq) : q4r16_row_f32(w, r, x);
    return;
  }
  for (std::int32_t r = row_begin; r < row_end; ++r) {
    if (xq != nullptr && w.format == WeightFormat::Q8)
      y[r] = q8_row_int8(w, r, *xq);
    else if (xq != nullptr && w.format == WeightFormat::Q4)
      y[r] = q4_row_int8(w, r, *xq);
    else
      y[r] = row_f32(w, r, x);
  }
}

// ---- matrix x several vectors ------------------------------------------------------
//
// Each row is read once per tile of up to kTile vectors: every weight is
// decoded once and multiplied into kTile running sums, each evaluated exactly
// as the single-row functions above evaluate theirs (same expressions, same
// order), so results are bit-identical to matvec's.
constexpr std::int32_t kTile = 4;

void row_f32_tile(const Matrix& w, std::int32_t r, std::int32_t nv, const float* const* x, float* sum) {
  const std::size_t cols = static_cast<std::size_t>(w.cols);
  const auto* bytes = static_cast<const std::uint8_t*>(w.data);
  for (std::int32_t v = 0; v < nv; ++v) sum[v] = 0.0f;
  if (!is_quantized(w.format)) {
    for (std::size_t c = 0; c < cols; ++c) {
      const float value = w.format == WeightFormat::F32 ? static_cast<const float*>(w.data)[r * cols + c]
                          : w.format == WeightFormat::F16 ? f16_value(bytes + 2 * (r * cols + c))
                                                          : bf16_value(bytes + 2 * (r * cols + c));
      for (std::int32_t v = 0; v < nv; ++v) sum[v] += value * x[v][c];
    }
    return;
  }
  const std::int32_t groups = group_count(w.cols, w.group);
  for (std::int32_t g = 0; g < groups; ++g) {
    const std::size_t begin = static_cast<std::size_t>(g) * w.group;
    const std::size_t end = std::min(cols, begin + static_cast<std::size_t>(w.group));
    const std::size_t slot = static_cast<std::size_t>(r) * groups + g;
    float partial[kTile] = {}, x_sum[kTile] = {};
    if (w.format == WeightFormat::Q8) {
      const auto* q = reinterpret_cast<const std::int8_t*>(bytes) + r * cols;
      for (std::size_t c = begin; c < end; ++c) {
        const float value = static_cast<float>(q[c]);
        for (std::int32_t v = 0; v < nv; ++v) partial[v] += value * x[v][c];
      }
      for (std::int32_t v = 0; v < nv; ++v) sum[v] += w.scales[slot] * partial[v];
    } else {
      const std::uint8_t* packed = bytes + r * ((cols + 1) / 2);
      for (std::size_t c = begin; c < end; ++c) {
        const int code = (c % 2 == 0) ? (packed[c / 2] & 0x0f) : (packed[c / 2] >> 4);
        for (std::int32_t v = 0; v < nv; ++v) {
          partial[v] += static_cast<float>(code) * x[v][c];
          x_sum[v] += x[v][c];
        }
      }
      for (std::int32_t v = 0; v < nv; ++v) sum[v] += w.scales[slot] * partial[v] + w.mins[slot] * x_sum[v];
    }
  }
}

void row_int8_tile(const Matrix& w, std::int32_t r, std::int32_t nv, const ActivationView* const* xq, float* sum) {
  const std::size_t cols = static_cast<std::size_t>(w.cols);
  const std::int32_t groups = group_count(w.cols, w.group);
  const bool q8 = w.format == WeightFormat::Q8;
  const auto* q = static_cast<const std::int8_t*>(w.data) + r * cols;
  const auto* packed = static_cast<const std::uint8_t*>(w.data) + r * ((cols + 1) / 2);
  const float* ws = w.scales + static_cast<std::size_t>(r) * groups;
  const float* mins = q8 ? nullptr : w.mins + static_cast<std::size_t>(r) * groups;
  for (std::int32_t v = 0; v < nv; ++v) sum[v] = 0.0f;
  for (std::int32_t g = 0; g < groups; ++g) {
    const std::size_t begin = static_cast<std::size_t>(g) * w.group;
    const std::size_t end = std::min(cols, begin + static_cast<std::size_t>(w.group));
    std::int32_t dot[kTile] = {}, lo[kTile] = {};
    for (std::size_t c = begin; c < end; ++c) {
      const int value = q8 ? q[c] : (c % 2 == 0) ? (packed[c / 2] & 0x0f) : (packed[c / 2] >> 4);
      for (std::int32_t v = 0; v < nv; ++v) {
        dot[v] += value * xq[v]->q[c];
        if (xq[v]->residual_q != nullptr) lo[v] += value * xq[v]->residual_q[c];
      }
    }
    for (std::int32_t v = 0; v < nv; ++v) {
      const ActivationView& a = *xq[v];
      if (q8) {
        sum[v] += ws[g] * a.scales[g] * static_cast<float>(dot[v]);
        if (a.residual_q != nullptr) sum[v] += ws[g] * a.residual_scales[g] * static_cast<float>(lo[v]);
      } else {
        sum[v] += ws[g] * a.scales[g] * static_cast<float>(dot[v]) +
                  mins[g] * (a.scales[g] * static_cast<float>(a.sums[g]));
        if (a.residual_q != nullptr)
          sum[v] += ws[g] * a.residual_scales[g] * static_cast<float>(lo[v]) +
                    mins[g] * (a.residual_scales[g] * static_cast<float>(a.residual_sums[g]));
      }
    }
  }
}

void matmat(const Matrix& w, std::int32_t n, const float* const* x, const ActivationView* const* xq,
            float* const* y, std::int32_t row_begin, std::int32_t row_end) {
  if (w.format == WeightFormat::Q8R16 || w.format == WeightFormat::Q4R16) {  // per vector: the definition is matvec's
    for (std::int32_t v = 0; v < n; ++v) matvec(w, x[v], xq != nullptr ? xq[v] : nullptr, y[v], row_begin, row_end);
    return;
  }
  const bool int8 = xq != nullptr && is_quantized(w.format);
  for (std::int32_t r = row_begin; r < row_end; ++r)
    for (std::int32_t v0 = 0; v0 < n; v0 += kTile) {
      const std::int32_t nv = std::min(kTile, n - v0);
      float sum[kTile];
      if (int8)
        row_int8_tile(w, r, nv, xq + v0, sum);
      else
        row_f32_tile(w, r, nv, x + v0, sum);
      for (std::int32_t v = 0; v < nv; ++v) y[v0 + v][r] = sum[v];
    }
}

float dot(const float* a, const float* b, std::int32_t n) {
  float sum = 0.0f;
  for (std::int32_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void rmsnorm(const float* x, const float* weight, std::int32_t n, float eps, float* out) {
  double sum_sq = 0.0;
  for (std::int32_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(sum_sq / n + eps));
  for (std::int32_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void softmax(float* x, std::int32_t n) {
  float max = x[0];
  for (std::int32_t i = 1; i < n; ++i) max = std::fmax(max, x[i]);
  float sum = 0.0f;
  for (std::int32_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inverse = 1.0f / sum;
  for (std::int32_t i = 0; i < n; ++i) x[i] *= inverse;
}

void swiglu(const float* gate, const float* up, std::int32_t n, float* out) {
  for (std::int32_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void attention_scores(const float* q, const float* keys, std::size_t stride, std::int32_t n_positions,
                      std::int32_t head_dim, float scale, float* scores) {
  for (std::int32_t p = 0; p < n_positions; ++p)
    scores[p] = dot(q, keys + static_cast<std::size_t>(p) * stride, head_dim) * scale;
}

void attention_values(const float* weights, const float* values, std::size_t stride,
                      std::int32_t n_positions, std::int32_t head_dim, float* out) {
  std::fill_n(out, head_dim, 0.0f);
  for (std::int32_t p = 0; p < n_positions; ++p) {
    const float* v = values + static_cast<std::size_t>(p) * stride;
    for (std::int32_t i = 0; i < head_dim; ++i) out[i] += weights[p] * v[i];
  }
}

// The f16 cache variants: each element widened exactly, then the f32
// kernels' arithmetic in the same order.
void attention_scores_f16(const float* q, const std::uint16_t* keys, std::size_t stride, std::int32_t n_positions,
                          std::int32_t head_dim, float scale, float* scores) {
  for (std::int32_t p = 0; p < n_positions; ++p) {
    const std::uint16_t* k = keys + static_cast<std::size_t>(p) * stride;
    float sum = 0.0f;
    for (std::int32_t i = 0; i < head_dim; ++i) sum += q[i] * f16_to_f32(k[i]);
    scores[p] = sum * scale;
  }
}

void attention_values_f16(const float* weights, const std::uint16_t* values, std::size_t stride,
                          std::int32_t n_positions, std::int32_t head_dim, float* out) {
  std::fill_n(out, head_dim, 0.0f);
  for (std::int32_t p = 0; p < n_positions; ++p) {
    const std::uint16_t* v = values + static_cast<std::size_t>(p) * stride;
    for (std::int32_t i = 0; i < head_dim; ++i) out[i] += weights[p] * f16_to_f32(v[i]);
  }
}

void convert_f32_to_f16(const float* x, std::int32_t n, std::uint16_t* out) {
  for (std::int32_t i = 0; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

constexpr KernelTable kTable{
    .isa = Isa::Scalar,
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

const KernelTable* scalar_kernel_table() { return &kTable; }

}  // namespace colibri::kernels
