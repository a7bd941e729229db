// Checks of the matrix kernels on the active instruction-set path, written
// without GoogleTest so that the same code runs in tests/unit/kernels_test.cpp
// and in the plain aarch64 program tests/unit/kernel_checks_main.cpp, which
// tests/scripts/neon_qemu.sh cross-compiles and runs under qemu. Each check
// returns the number of failures and prints the first few to stderr.
//
// Tolerances follow from the arithmetic: a float sum of k terms in any order
// is within about k * 2^-24 times the sum of the terms' magnitudes of the
// exact value, so each bound is (terms + slack) * 2^-23 * sum|terms|; integer
// parts are compared exactly. matmat is compared with matvec bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/quantize.h"
#include "kernels/reference.h"

namespace colibri::kernels::checks {

constexpr double kUlp = 1.0 / (1 << 23);  // 2 * 2^-24: both sides round

struct Weights {
  std::vector<std::uint8_t> bytes;
  Matrix m;
};

inline Weights make_weights(WeightFormat format, std::int32_t rows, std::int32_t cols, std::int32_t group,
                            std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<std::size_t>(rows) * cols);
  for (float& v : values) v = normal(rng) * 0.1f + 0.02f;  // asymmetric, like trained weights
  if (!is_quantized(format)) group = 0;
  Weights w;
  w.bytes.resize(weight_layout(format, rows, cols, static_cast<std::uint32_t>(group))->total_bytes);
  quantize_weights(format, rows, cols, group, values.data(), w.bytes.data());
  w.m = matrix_view(format, rows, cols, group, w.bytes.data());
  return w;
}

inline std::vector<float> random_vector(std::int32_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x) v = normal(rng);
  // Outliers, as real activations have: they set a group's scale.
  if (n > 3) x[static_cast<std::size_t>(n) / 3] *= 8.0f;
  return x;
}

inline int code_at(const Matrix& m, std::int32_t r, std::int32_t c) {
  const auto* bytes = static_cast<const std::uint8_t*>(m.data);
  if (m.format == WeightFormat::Q8)
    return reinterpret_cast<const std::int8_t*>(bytes)[static_cast<std::size_t>(r) * m.cols + c];
  const std::uint8_t byte = bytes[static_cast<std::size_t>(r) * ((m.cols + 1) / 2) + c / 2];
  return c % 2 == 0 ? (byte & 0x0f) : (byte >> 4);
}

// The int8 product in exact arithmetic (double holds every term exactly
// enough) and the magnitude sum the tolerance scales with.
inline void exact_int8_row(const Matrix& w, std::int32_t r, const ActivationQ8& xq, double& value,
                           double& magnitude) {
  const std::int32_t groups = (w.cols + w.group - 1) / w.group;
  value = magnitude = 0.0;
  for (int plane = 0; plane < (xq.residual ? 2 : 1); ++plane) {
    const std::vector<std::int8_t>& q = plane == 0 ? xq.q : xq.residual_q;
    const std::vector<float>& x_scales = plane == 0 ? xq.scales : xq.residual_scales;
    const std::vector<std::int32_t>& sums = plane == 0 ? xq.sums : xq.residual_sums;
    for (std::int32_t g = 0; g < groups; ++g) {
      const std::int32_t begin = g * w.group, end = std::min(w.cols, begin + w.group);
      std::int64_t dot = 0, abs_dot = 0;
      for (std::int32_t c = begin; c < end; ++c) {
        const std::int64_t p = static_cast<std::int64_t>(code_at(w, r, c)) * q[static_cast<std::size_t>(c)];
        dot += p;
        abs_dot += p < 0 ? -p : p;
      }
      const double scale = static_cast<double>(w.scales[static_cast<std::size_t>(r) * groups + g]) * x_scales[g];
      value += scale * static_cast<double>(dot);
      magnitude += std::fabs(scale) * static_cast<double>(abs_dot);
      if (w.format == WeightFormat::Q4) {
        const double min_term =
            static_cast<double>(w.mins[static_cast<std::size_t>(r) * groups + g]) * x_scales[g] * sums[g];
        value += min_term;
        magnitude += std::fabs(min_term);
      }
    }
  }
}

// Collects failures; prints the first few with their context.
class Report {
 public:
  explicit Report(std::string name) : name_(std::move(name)) {}
  template <class... Args>
  void fail(const char* format, Args... args) {
    if (failures_++ < 10) {
      std::fprintf(stderr, "%s [%s]: ", name_.c_str(), std::string(isa_name(active_isa())).c_str());
      std::fprintf(stderr, format, args...);
      std::fputc('\n', stderr);
    }
  }
  int failures() const { return failures_; }

 private:
  std::string name_;
  int failures_ = 0;
};

enum class Activations { F32, Int8, Int8Residual };
inline const char* activations_name(Activations a) {
  return a == Activations::F32 ? "f32" : a == Activations::Int8 ? "int8" : "int8x2";
}

constexpr WeightFormat kFormats[] = {WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16, WeightFormat::Q8,
                                     WeightFormat::Q4};

// A random shape with ragged tails: cols rarely a multiple of 128, rows
// rarely of 4, and the group sizes models use next to odd ones.
struct Shape {
  std::int32_t rows, cols, group;
};
inline Shape random_shape(WeightFormat format, std::mt19937& rng, std::int32_t max_rows) {
  static constexpr std::int32_t kCols[] = {1, 7, 16, 31, 33, 63, 64, 65, 100, 127, 128, 129, 200, 255, 256, 257, 300, 384, 520};
  static constexpr std::int32_t kGroups[] = {32, 64, 32, 64, 128, 256, 0, 3, 17, 40, 96};
  Shape s{};
  s.cols = kCols[std::uniform_int_distribution<std::size_t>(0, std::size(kCols) - 1)(rng)];
  s.rows = std::uniform_int_distribution<std::int32_t>(1, max_rows)(rng);
  if (is_quantized(format)) {
    s.group = kGroups[std::uniform_int_distribution<std::size_t>(0, std::size(kGroups) - 1)(rng)];
    if (s.group == 0) s.group = s.cols + 5;  // one group larger than the row
  }
  return s;
}

// matmat gives, for every vector, exactly matvec's bits, writes only its row
// range, and works for any number of vectors (more than kMatmatChunk too).
// `cases` random shapes per format and activation kind.
inline int check_matmat_matches_matvec(int cases, std::uint32_t seed = 2024) {
  Report report("matmat == matvec");
  std::mt19937 rng(seed);
  constexpr std::int32_t kCounts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 31, 33, 64, 70};
  for (WeightFormat format : kFormats)
    for (Activations acts : {Activations::F32, Activations::Int8, Activations::Int8Residual}) {
      if (acts != Activations::F32 && !is_quantized(format)) continue;
      for (int i = 0; i < cases; ++i) {
        const Shape s = random_shape(format, rng, 11);
        const std::int32_t n = kCounts[std::uniform_int_distribution<std::size_t>(0, std::size(kCounts) - 1)(rng)];
        Weights w = make_weights(format, s.rows, s.cols, s.group, rng);
        std::vector<std::vector<float>> xs;
        std::vector<ActivationQ8> xqs(static_cast<std::size_t>(n));
        std::vector<const float*> x_ptrs;
        std::vector<const ActivationQ8*> xq_ptrs;
        for (std::int32_t v = 0; v < n; ++v) {
          xs.push_back(random_vector(s.cols, rng, v % 3 == 0 ? 3.0f : 1.0f));
          if (acts != Activations::F32)
            quantize_activation(xs.back().data(), s.cols, s.group, xqs[static_cast<std::size_t>(v)],
                                acts == Activations::Int8Residual);
        }
        for (std::int32_t v = 0; v < n; ++v) {
          x_ptrs.push_back(xs[static_cast<std::size_t>(v)].data());
          xq_ptrs.push_back(&xqs[static_cast<std::size_t>(v)]);
        }
        // Every other case computes a random row range only.
        std::int32_t begin = 0, end = s.rows;
        if (i % 2 == 1) {
          begin = std::uniform_int_distribution<std::int32_t>(0, s.rows - 1)(rng);
          end = std::uniform_int_distribution<std::int32_t>(begin + 1, s.rows)(rng);
        }
        constexpr float kUntouched = -7.25f;
        std::vector<std::vector<float>> got(static_cast<std::size_t>(n), std::vector<float>(static_cast<std::size_t>(s.rows), kUntouched));
        std::vector<float*> y_ptrs;
        for (auto& y : got) y_ptrs.push_back(y.data());
        matmat(w.m, n, x_ptrs.data(), acts == Activations::F32 ? nullptr : xq_ptrs.data(), y_ptrs.data(), begin, end);
        std::vector<float> want(static_cast<std::size_t>(s.rows));
        for (std::int32_t v = 0; v < n; ++v) {
          matvec(w.m, x_ptrs[static_cast<std::size_t>(v)],
                 acts == Activations::F32 ? nullptr : xq_ptrs[static_cast<std::size_t>(v)], want.data(), begin, end);
          for (std::int32_t r = 0; r < s.rows; ++r) {
            const float g = got[static_cast<std::size_t>(v)][static_cast<std::size_t>(r)];
            const bool inside = r >= begin && r < end;
            const float expected = inside ? want[static_cast<std::size_t>(r)] : kUntouched;
            if (std::memcmp(&g, &expected, sizeof g) != 0)
              report.fail("%s weights %dx%d group %d, %s activations, n %d, rows [%d,%d): y[%d][%d] = %.9g, %s %.9g",
                          std::string(weight_format_name(format)).c_str(), s.rows, s.cols, s.group,
                          activations_name(acts), n, begin, end, v, r, static_cast<double>(g),
                          inside ? "matvec gives" : "untouched is", static_cast<double>(expected));
          }
        }
      }
    }
  return report.failures();
}

// matvec (the same as matmat per vector, by the check above) against the
// scalar reference with f32 activations, and against the exact integer
// product (and the f32 reference, within the quantization error) with int8.
inline int check_matvec_matches_reference(int cases, std::uint32_t seed = 99) {
  Report report("matvec ~ reference");
  std::mt19937 rng(seed);
  for (WeightFormat format : kFormats)
    for (Activations acts : {Activations::F32, Activations::Int8, Activations::Int8Residual}) {
      if (acts != Activations::F32 && !is_quantized(format)) continue;
      for (int i = 0; i < cases; ++i) {
        Shape s = random_shape(format, rng, 37);
        if (i == 0) s.cols = 2048;  // long rows: many groups and blocks
        Weights w = make_weights(format, s.rows, s.cols, s.group, rng);
        std::vector<float> x = random_vector(s.cols, rng);
        ActivationQ8 xq;
        const ActivationQ8* xq_ptr = nullptr;
        if (acts != Activations::F32) {
          quantize_activation(x.data(), s.cols, s.group, xq, acts == Activations::Int8Residual);
          xq_ptr = &xq;
        }
        std::vector<float> got(static_cast<std::size_t>(s.rows), NAN), want(got.size());
        matvec(w.m, x.data(), xq_ptr, got.data());
        ref::matvec(w.m, x.data(), want.data());
        const std::int32_t groups = s.group > 0 ? (s.cols + s.group - 1) / s.group : 1;
        std::vector<float> row(static_cast<std::size_t>(s.cols));
        for (std::int32_t r = 0; r < s.rows; ++r) {
          dequantize_row(w.m, r, row.data());
          double f32_magnitude = 0.0;
          for (std::int32_t c = 0; c < s.cols; ++c) f32_magnitude += std::fabs(static_cast<double>(row[c]) * x[c]);
          const double value = got[static_cast<std::size_t>(r)];
          const double reference = want[static_cast<std::size_t>(r)];
          auto context = [&] {
            return std::string(weight_format_name(format)) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                   " group " + std::to_string(s.group) + " " + activations_name(acts) + " row " + std::to_string(r);
          };
          if (acts == Activations::F32) {
            // Both sides sum cols products (plus per-group rescaling) in f32.
            const double tolerance = (s.cols + 64) * kUlp * f32_magnitude + 1e-30;
            if (!(std::fabs(value - reference) <= tolerance))
              report.fail("%s: %.9g, reference %.9g", context().c_str(), value, reference);
            continue;
          }
          double exact, magnitude;
          exact_int8_row(w.m, r, xq, exact, magnitude);
          // Per-group integer dots are exact; what remains is f32 accumulation
          // of one term per group (and lane) plus the scale product's rounding.
          if (!(std::fabs(value - exact) <= (groups + 40) * kUlp * magnitude + 1e-30))
            report.fail("%s: %.9g, exact integer product %.9g", context().c_str(), value, exact);
          // Each activation is off by at most half its group's step (the
          // residual plane's step with it): |error| <= sum_c |w_c| step_g / 2.
          double bound = 0.0;
          for (std::int32_t c = 0; c < s.cols; ++c) {
            const std::size_t g = static_cast<std::size_t>(c / s.group);
            const double step = xq.residual ? xq.residual_scales[g] + 4e-7 * std::fabs(x[c]) : xq.scales[g];
            bound += std::fabs(row[c]) * step * 0.5;
          }
          if (!(std::fabs(value - reference) <= bound * 1.0001 + (s.cols + 64) * kUlp * (f32_magnitude + magnitude) + 1e-30))
            report.fail("%s: %.9g, f32 reference %.9g (quantization bound %.3g)", context().c_str(), value, reference, bound);
        }
      }
    }
  return report.failures();
}

}  // namespace colibri::kernels::checks
