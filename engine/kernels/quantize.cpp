#include "kernels/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace colibri {
namespace {

// The step search of fit_q4_group: the range divided into 15 + kQ4FitFirst +
// kQ4FitDelta * k steps, k = 0..kQ4FitSteps. On the fixtures, steps of 0.1 or
// 0.05 measured no better than 0.2 and cost two to four times the time.
constexpr float kQ4FitFirst = -1.0f, kQ4FitDelta = 0.2f;
constexpr int kQ4FitSteps = 10;

std::uint16_t f32_to_bf16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40);  // NaN stays NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<std::uint16_t>(bits >> 16);
}

// 1 / scale, or 0 where it would overflow (a group of values below about
// 1e-36: its codes become 0 rather than -127 whatever their sign).
float inverse_of(float scale) { return scale >= std::numeric_limits<float>::min() ? 1.0f / scale : 0.0f; }

// lround for a code: NaN (a NaN weight; lround's result is unspecified) is 0.
long code_of(float value) { return std::isnan(value) ? 0L : std::lround(value); }

// Q8 of one row: per group, scale = amax / 127 and values rounded to nearest.
void quantize_q8_row(const float* row, std::int32_t cols, std::int32_t group, std::int8_t* q, float* scales) {
  const std::int32_t groups = (cols + group - 1) / group;
  for (std::int32_t g = 0; g < groups; ++g) {
    const std::int32_t begin = g * group;
    const std::int32_t end = std::min(cols, begin + group);
    float amax = 0.0f;
    for (std::int32_t c = begin; c < end; ++c) amax = std::max(amax, std::fabs(row[c]));
    const float scale = amax / 127.0f;
    const float inverse = inverse_of(scale);
    for (std::int32_t c = begin; c < end; ++c)
      q[c] = static_cast<std::int8_t>(std::clamp(code_of(row[c] * inverse), -127L, 127L));
    scales[g] = scale;
  }
}

// The same numbers as Q8, interleaved by 16 rows (weight_format.h).
void quantize_q8r16(std::int32_t rows, std::int32_t cols, std::int32_t group, const float* src,
                    std::uint8_t* out, const WeightLayout& layout) {
  const std::int32_t groups = (cols + group - 1) / group;
  std::vector<std::int8_t> q(static_cast<std::size_t>(cols));
  std::vector<float> row_scales(static_cast<std::size_t>(groups));
  auto* values = reinterpret_cast<std::int8_t*>(out);
  auto* scales = reinterpret_cast<float*>(out + layout.scales_offset);
  for (std::int32_t r = 0; r < rows; ++r) {
    quantize_q8_row(src + static_cast<std::size_t>(r) * cols, cols, group, q.data(), row_scales.data());
    std::int8_t* row_values = values + q8r16_row_offset(static_cast<std::size_t>(cols), static_cast<std::size_t>(r));
    for (std::size_t c = 0; c < static_cast<std::size_t>(cols); ++c) row_values[q8r16_column_offset(c)] = q[c];
    for (std::int32_t g = 0; g < groups; ++g)
      scales[q8r16_scale_index(static_cast<std::size_t>(groups), static_cast<std::size_t>(r), static_cast<std::size_t>(g))] =
          row_scales[static_cast<std::size_t>(g)];
  }
}

// Smallest and largest of row[begin, end) (begin < end): a Q4 group's min
// and, with the min, its step. NaN weights are left out (they store code 0);
// a group of nothing else has the range [0, 0].
std::pair<float, float> value_range(const float* row, std::int32_t begin, std::int32_t end) {
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  for (std::int32_t c = begin; c < end; ++c) {
    if (std::isnan(row[c])) continue;
    lo = std::min(lo, row[c]);
    hi = std::max(hi, row[c]);
  }
  return lo <= hi ? std::pair{lo, hi} : std::pair{0.0f, 0.0f};
}

// A Q4 group's (scale, min) by least squares: round-to-nearest over the
// value range wastes codes on the extremes, so try steps a little narrower and
// wider than (hi - lo) / 15, give each the codes it implies, fit scale and min
// to those codes, and keep the pair with the smallest squared error (the
// search llama.cpp's k-quants use). The error of a fit follows from the sums
// it was fitted with, so each candidate is one pass over the group.
struct Q4Fit {
  float scale, min;
};
constexpr std::int32_t kLanes = 8;
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));
typedef std::int32_t IntLanes __attribute__((vector_size(kLanes * sizeof(std::int32_t))));
#if defined(__x86_64__) && defined(__GNUC__)
// The search is most of a 4-bit conversion's time; an AVX2 clone, chosen by
// the loader from CPUID (an ifunc), takes a third of it off where the CPU has
// AVX2. Both clones do the same IEEE operations in the same order (no FMA), so
// a file's bytes do not depend on the machine that wrote it.
__attribute__((target_clones("avx2", "default")))
#endif
Q4Fit fit_q4_group(const float* x, std::int32_t n, float lo, float hi) {
  Q4Fit best{(hi - lo) / 15.0f, lo};
  // A range this narrow would overflow levels / (hi - lo): keep the plain step.
  if (!(hi - lo >= 16.0f * std::numeric_limits<float>::min())) return best;
  double sum_x = 0.0, sum_x2 = 0.0;
  for (std::int32_t i = 0; i < n; ++i) {
    sum_x += x[i];
    sum_x2 += static_cast<double>(x[i]) * x[i];
  }
  // A NaN weight would make every candidate's error NaN (and its code an
  // undefined conversion): keep the plain step over the other values.
  if (std::isnan(sum_x)) return best;
  const double count = n;
  // sum((scale * l + min - x)^2) expanded over the sums; cancellation can
  // take an exact fit a hair below zero, which must not beat another exact one.
  auto error_of = [&](double scale, double min, double sum_l, double sum_l2, double sum_xl) {
    return std::max(0.0, scale * scale * sum_l2 + 2.0 * scale * min * sum_l - 2.0 * scale * sum_xl + count * min * min -
           2.0 * min * sum_x + sum_x2);
  };
  double best_error = std::numeric_limits<double>::infinity();
  for (int step = -1; step <= kQ4FitSteps; ++step) {
    // step -1 is plain round-to-nearest over the range, the fit's floor.
    const float levels = step < 0 ? 15.0f : 15.0f + kQ4FitFirst + kQ4FitDelta * static_cast<float>(step);
    const float inverse = levels / (hi - lo);
    // Eight lanes as a GCC/Clang vector (two SSE or NEON registers): the
    // compiler would not reorder a float sum into lanes by itself.
    Lanes sum_l_lanes{}, sum_l2_lanes{}, sum_xl_lanes{};
    std::int32_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      Lanes value;
      std::memcpy(&value, x + i, sizeof value);
      Lanes scaled = (value - lo) * inverse;
      scaled = scaled < 0.0f ? Lanes{} : scaled;
      scaled = scaled > 15.0f ? Lanes{} + 15.0f : scaled;
      const Lanes code = __builtin_convertvector(__builtin_convertvector(scaled + 0.5f, IntLanes), Lanes);
      sum_l_lanes += code;
      sum_l2_lanes += code * code;
      sum_xl_lanes += code * value;
    }
    double sum_l = 0.0, sum_l2 = 0.0, sum_xl = 0.0;
    for (std::int32_t k = 0; k < kLanes; ++k) {
      sum_l += sum_l_lanes[k];
      sum_l2 += sum_l2_lanes[k];
      sum_xl += sum_xl_lanes[k];
    }
    for (; i < n; ++i) {
      const float code = std::min(std::max((x[i] - lo) * inverse, 0.0f), 15.0f);
      const auto rounded = static_cast<float>(static_cast<std::int32_t>(code + 0.5f));
      sum_l += rounded;
      sum_l2 += rounded * rounded;
      sum_xl += rounded * x[i];
    }
    double scale = 1.0 / inverse, min = lo;
    if (step >= 0) {
      const double det = count * sum_l2 - static_cast<double>(sum_l) * sum_l;
      if (!(det > 0.0)) continue;
      scale = (count * sum_xl - sum_x * sum_l) / det;
      min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (!(scale > 0.0)) continue;
    }
    const double error = error_of(scale, min, sum_l, sum_l2, sum_xl);
    if (error < best_error) {
      best_error = error;
      best = {static_cast<float>(scale), static_cast<float>(min)};
    }
  }
  return best;
}

// f16 of a scale or minimum, saturated: a group beyond f16's range (no
// trained model's weights are) keeps its sign and the largest finite value
// instead of becoming infinite.
std::uint16_t saturated_f16(float value) {
  constexpr float kF16Max = 65504.0f;
  return f32_to_f16(std::clamp(value, -kF16Max, kF16Max));
}

// Rows [first, last) of Q4R16: Q4's numbers per group, with the fitted scale
// and minimum rounded to f16 first and the codes chosen against the rounded
// pair, so that what is stored reconstructs as closely as f16 allows.
void quantize_q4r16_rows(std::int32_t first, std::int32_t last, std::int32_t cols, std::int32_t group,
                         const float* src, std::uint8_t* out, const WeightLayout& layout) {
  const std::size_t groups = static_cast<std::size_t>((cols + group - 1) / group);
  auto* scales = reinterpret_cast<std::uint16_t*>(out + layout.scales_offset);
  auto* mins = reinterpret_cast<std::uint16_t*>(out + layout.mins_offset);
  for (std::int32_t r = first; r < last; ++r) {
    const float* row = src + static_cast<std::size_t>(r) * cols;
    std::uint8_t* row_values = out + q4r16_row_offset(static_cast<std::size_t>(cols), static_cast<std::size_t>(r));
    for (std::size_t g = 0; g < groups; ++g) {
      const std::int32_t begin = static_cast<std::int32_t>(g) * group;
      const std::int32_t end = std::min(cols, begin + group);
      const auto [lo, hi] = value_range(row, begin, end);
      const Q4Fit fit = fit_q4_group(row + begin, end - begin, lo, hi);
      const std::uint16_t scale_bits = saturated_f16(fit.scale), min_bits = saturated_f16(fit.min);
      const float scale = f16_to_f32(scale_bits), min = f16_to_f32(min_bits);
      const float inverse = inverse_of(scale);
      for (std::int32_t c = begin; c < end; ++c) {
        const auto code = static_cast<std::uint8_t>(std::clamp(code_of((row[c] - min) * inverse), 0L, 15L));
        const auto column = static_cast<std::size_t>(c);
        row_values[q4r16_column_offset(column)] |= q4r16_high_nibble(column) ? static_cast<std::uint8_t>(code << 4) : code;
      }
      const std::size_t slot = q8r16_scale_index(groups, static_cast<std::size_t>(r), g);
      scales[slot] = scale_bits;
      mins[slot] = min_bits;
    }
  }
}

// Rows [first, last) of row-major Q4, f32 scales and minimums.
void quantize_q4_rows(std::int32_t first, std::int32_t last, std::int32_t cols, std::int32_t group, const float* src,
                      std::uint8_t* out, const WeightLayout& layout) {
  const std::int32_t groups = (cols + group - 1) / group;
  auto* scales = reinterpret_cast<float*>(out + layout.scales_offset);
  auto* mins = reinterpret_cast<float*>(out + layout.mins_offset);
  for (std::int32_t r = first; r < last; ++r) {
    const float* row = src + static_cast<std::size_t>(r) * cols;
    std::uint8_t* packed = out + static_cast<std::size_t>(r) * ((cols + 1) / 2);
    for (std::int32_t g = 0; g < groups; ++g) {
      const std::int32_t begin = g * group;
      const std::int32_t end = std::min(cols, begin + group);
      const auto [lo, hi] = value_range(row, begin, end);
      const Q4Fit fit = fit_q4_group(row + begin, end - begin, lo, hi);
      const float inverse = inverse_of(fit.scale);
      for (std::int32_t c = begin; c < end; ++c) {
        auto q = static_cast<std::uint8_t>(std::clamp(code_of((row[c] - fit.min) * inverse), 0L, 15L));
        packed[c / 2] |= (c % 2 == 0) ? q : static_cast<std::uint8_t>(q << 4);
      }
      const std::size_t slot = static_cast<std::size_t>(r) * groups + g;
      scales[slot] = fit.scale;
      mins[slot] = fit.min;
    }
  }
}

// The 4-bit fit costs about 400 operations per weight, so a large matrix is
// split by rows over the machine's cores (every row writes bytes of its own
// in both layouts). Conversion runs once per model, never beside serving.
template <typename RowsFn>
void quantize_rows_in_parallel(std::int32_t rows, std::int32_t cols, RowsFn quantize_rows) {
  constexpr std::size_t kWeightsPerThread = std::size_t{1} << 20;
  const std::size_t weights = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  const std::size_t threads = std::min<std::size_t>(
      {std::max(1u, std::thread::hardware_concurrency()), weights / kWeightsPerThread + 1,
       static_cast<std::size_t>(rows)});
  if (threads <= 1) {
    quantize_rows(0, rows);
    return;
  }
  std::vector<std::thread> team;
  for (std::size_t t = 1; t < threads; ++t)
    team.emplace_back([&, t] {
      quantize_rows(static_cast<std::int32_t>(rows * t / threads), static_cast<std::int32_t>(rows * (t + 1) / threads));
    });
  quantize_rows(0, static_cast<std::int32_t>(rows / threads));
  for (auto& thread : team) thread.join();
}

}  // namespace

void quantize_weights(WeightFormat format, std::int32_t rows, std::int32_t cols, std::int32_t group,
                      const float* src, std::uint8_t* out) {
  const WeightLayout layout = *weight_layout(format, static_cast<std::uint64_t>(rows),
                                             static_cast<std::uint64_t>(cols),
                                             static_cast<std::uint32_t>(group));
  std::memset(out, 0, layout.total_bytes);
  const std::size_t count = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  switch (format) {
    case WeightFormat::F32:
      std::memcpy(out, src, count * 4);
      return;
    case WeightFormat::F16:
      for (std::size_t i = 0; i < count; ++i) {
        std::uint16_t h = f32_to_f16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case WeightFormat::BF16:
      for (std::size_t i = 0; i < count; ++i) {
        std::uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case WeightFormat::Q8R16:
      quantize_q8r16(rows, cols, group, src, out, layout);
      return;
    case WeightFormat::Q4R16:
      quantize_rows_in_parallel(rows, cols, [&](std::int32_t first, std::int32_t last) {
        quantize_q4r16_rows(first, last, cols, group, src, out, layout);
      });
      return;
    case WeightFormat::Q8: {
      const std::int32_t groups = (cols + group - 1) / group;
      for (std::int32_t r = 0; r < rows; ++r)
        quantize_q8_row(src + static_cast<std::size_t>(r) * cols, cols, group,
                        reinterpret_cast<std::int8_t*>(out) + static_cast<std::size_t>(r) * cols,
                        reinterpret_cast<float*>(out + layout.scales_offset) + static_cast<std::size_t>(r) * groups);
      return;
    }
    case WeightFormat::Q4:
      quantize_rows_in_parallel(rows, cols, [&](std::int32_t first, std::int32_t last) {
        quantize_q4_rows(first, last, cols, group, src, out, layout);
      });
      return;
  }
}

Matrix matrix_view(WeightFormat format, std::int32_t rows, std::int32_t cols, std::int32_t group,
                   const std::uint8_t* bytes) {
  const WeightLayout layout = *weight_layout(format, static_cast<std::uint64_t>(rows),
                                             static_cast<std::uint64_t>(cols),
                                             static_cast<std::uint32_t>(group));
  Matrix m;
  m.format = format;
  m.rows = rows;
  m.cols = cols;
  m.group = group;
  m.data = bytes;
  if (format == WeightFormat::Q4R16) {
    m.half_scales = reinterpret_cast<const std::uint16_t*>(bytes + layout.scales_offset);
    m.half_mins = reinterpret_cast<const std::uint16_t*>(bytes + layout.mins_offset);
  } else if (is_quantized(format)) {
    m.scales = reinterpret_cast<const float*>(bytes + layout.scales_offset);
  }
  if (format == WeightFormat::Q4) m.mins = reinterpret_cast<const float*>(bytes + layout.mins_offset);
  return m;
}

void dequantize_row(const Matrix& m, std::int32_t row, float* out) {
  const std::size_t cols = static_cast<std::size_t>(m.cols);
  const auto* bytes = static_cast<const std::uint8_t*>(m.data);
  switch (m.format) {
    case WeightFormat::F32:
      std::memcpy(out, bytes + row * cols * 4, cols * 4);
      return;
    case WeightFormat::F16:
      convert_to_f32(DType::F16, bytes + row * cols * 2, cols, out);
      return;
    case WeightFormat::BF16:
      convert_to_f32(DType::BF16, bytes + row * cols * 2, cols, out);
      return;
    case WeightFormat::Q8: {
      const std::size_t groups = (cols + m.group - 1) / m.group;
      const auto* q = reinterpret_cast<const std::int8_t*>(bytes) + row * cols;
      for (std::size_t c = 0; c < cols; ++c) out[c] = m.scales[row * groups + c / m.group] * q[c];
      return;
    }
    case WeightFormat::Q8R16: {
      const std::size_t groups = (cols + m.group - 1) / m.group;
      const auto* values = reinterpret_cast<const std::int8_t*>(bytes) + q8r16_row_offset(cols, static_cast<std::size_t>(row));
      for (std::size_t c = 0; c < cols; ++c)
        out[c] = m.scales[q8r16_scale_index(groups, static_cast<std::size_t>(row), c / m.group)] *
                 values[q8r16_column_offset(c)];
      return;
    }
    case WeightFormat::Q4R16: {
      const std::size_t groups = (cols + m.group - 1) / m.group;
      const std::uint8_t* values = bytes + q4r16_row_offset(cols, static_cast<std::size_t>(row));
      for (std::size_t c = 0; c < cols; ++c) {
        const std::uint8_t byte = values[q4r16_column_offset(c)];
        const int code = q4r16_high_nibble(c) ? byte >> 4 : byte & 0x0f;
        const std::size_t slot = q8r16_scale_index(groups, static_cast<std::size_t>(row), c / m.group);
        out[c] = f16_to_f32(m.half_mins[slot]) + f16_to_f32(m.half_scales[slot]) * static_cast<float>(code);
      }
      return;
    }
    case WeightFormat::Q4: {
      const std::size_t groups = (cols + m.group - 1) / m.group;
      const std::uint8_t* packed = bytes + row * ((cols + 1) / 2);
      for (std::size_t c = 0; c < cols; ++c) {
        const std::uint8_t q = (c % 2 == 0) ? (packed[c / 2] & 0x0f) : (packed[c / 2] >> 4);
        const std::size_t slot = row * groups + c / m.group;
        out[c] = m.mins[slot] + m.scales[slot] * q;
      }
      return;
    }
  }
}

}  // namespace colibri
