// Checks of the matrix and attention kernels on the active instruction-set path, written
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
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
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
  if (m.format == WeightFormat::Q8R16)
    return reinterpret_cast<const std::int8_t*>(bytes)[q8r16_row_offset(static_cast<std::size_t>(m.cols), static_cast<std::size_t>(r)) +
                                                       q8r16_column_offset(static_cast<std::size_t>(c))];
  if (m.format == WeightFormat::Q8)
    return reinterpret_cast<const std::int8_t*>(bytes)[static_cast<std::size_t>(r) * m.cols + c];
  if (m.format == WeightFormat::Q4R16) {
    const std::uint8_t byte = bytes[q4r16_row_offset(static_cast<std::size_t>(m.cols), static_cast<std::size_t>(r)) +
                                    q4r16_column_offset(static_cast<std::size_t>(c))];
    return q4r16_high_nibble(static_cast<std::size_t>(c)) ? byte >> 4 : byte & 0x0f;
  }
  const std::uint8_t byte = bytes[static_cast<std::size_t>(r) * ((m.cols + 1) / 2) + c / 2];
  return c % 2 == 0 ? (byte & 0x0f) : (byte >> 4);
}

// The scale (or min) of row r, group g, in the matrix's layout.
enum class Plane { Scales, Mins };
inline float scale_at(const Matrix& m, Plane plane, std::int32_t r, std::int32_t g) {
  const std::size_t groups = static_cast<std::size_t>((m.cols + m.group - 1) / m.group);
  const std::size_t interleaved = q8r16_scale_index(groups, static_cast<std::size_t>(r), static_cast<std::size_t>(g));
  if (m.format == WeightFormat::Q4R16)
    return f16_to_f32((plane == Plane::Scales ? m.half_scales : m.half_mins)[interleaved]);
  const float* values = plane == Plane::Scales ? m.scales : m.mins;
  if (m.format == WeightFormat::Q8R16) return values[interleaved];
  return values[static_cast<std::size_t>(r) * groups + static_cast<std::size_t>(g)];
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
      const double scale = static_cast<double>(scale_at(w, Plane::Scales, r, g)) * x_scales[g];
      value += scale * static_cast<double>(dot);
      magnitude += std::fabs(scale) * static_cast<double>(abs_dot);
      if (is_q4(w.format)) {
        const double min_term =
            static_cast<double>(scale_at(w, Plane::Mins, r, g)) * x_scales[g] * sums[g];
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

constexpr WeightFormat kFormats[] = {WeightFormat::F32, WeightFormat::F16,   WeightFormat::BF16, WeightFormat::Q8,
                                     WeightFormat::Q4,  WeightFormat::Q8R16, WeightFormat::Q4R16};

// A random shape with ragged tails: cols rarely a multiple of 128, rows
// rarely of 4, and the group sizes models use next to odd ones.
struct Shape {
  std::int32_t rows, cols, group;
};
inline Shape random_shape(WeightFormat format, std::mt19937& rng, std::int32_t max_rows) {
  static constexpr std::int32_t kCols[] = {1, 7, 16, 31, 33, 63, 64, 65, 100, 127, 128, 129, 200, 255, 256, 257, 300, 384, 520};
  // 1100: above kQ8R16CombinedMaxGroup, where Q8R16 keeps a step per plane.
  static constexpr std::int32_t kGroups[] = {32, 64, 32, 64, 128, 256, 0, 3, 17, 40, 96, 1100};
  Shape s{};
  s.cols = kCols[std::uniform_int_distribution<std::size_t>(0, std::size(kCols) - 1)(rng)];
  s.rows = std::uniform_int_distribution<std::int32_t>(1, max_rows)(rng);
  if (is_quantized(format)) {
    s.group = kGroups[std::uniform_int_distribution<std::size_t>(0, std::size(kGroups) - 1)(rng)];
    if (s.group == 0) s.group = s.cols + 5;  // one group larger than the row
  }
  if (format == WeightFormat::Q8R16) {  // whole 16-row blocks, groups of whole 4-column chunks
    s.rows = kQ8R16Rows * std::uniform_int_distribution<std::int32_t>(1, (max_rows + 15) / 16 + 1)(rng);
    s.group = (s.group + 3) / 4 * 4;
  }
  if (format == WeightFormat::Q4R16) {  // whole 16-row blocks, groups of whole 8-column chunks
    s.rows = kQ4R16Rows * std::uniform_int_distribution<std::int32_t>(1, (max_rows + 15) / 16 + 1)(rng);
    s.group = (s.group + 7) / 8 * 8;
  }
  return s;
}

// Rows wider than one packed tile holds (4096 columns or 256 groups), which
// the AVX-512 int8 tiles take in column slices: Mixtral's 14336-column down
// projection, and narrow groups on shorter rows.
inline Shape random_wide_shape(WeightFormat format, std::mt19937& rng) {
  static constexpr std::int32_t kCols[] = {1100, 2048, 4097, 4160, 4673, 8192, 14336};
  static constexpr std::int32_t kGroups[] = {4, 20, 32, 40, 64, 96, 128, 256};
  Shape s{};
  s.cols = kCols[std::uniform_int_distribution<std::size_t>(0, std::size(kCols) - 1)(rng)];
  s.rows = std::uniform_int_distribution<std::int32_t>(1, 40)(rng);
  if (is_quantized(format)) s.group = kGroups[std::uniform_int_distribution<std::size_t>(0, std::size(kGroups) - 1)(rng)];
  if (format == WeightFormat::Q8R16) s.rows = (s.rows + kQ8R16Rows - 1) / kQ8R16Rows * kQ8R16Rows;
  if (format == WeightFormat::Q4R16) {
    s.rows = (s.rows + kQ4R16Rows - 1) / kQ4R16Rows * kQ4R16Rows;
    s.group = (s.group + 7) / 8 * 8;
  }
  return s;
}

// n random vectors of s.cols values (every third three times larger), each
// with the activations activations_of(v) chooses (quantized with s.group),
// and the pointer arrays matmat takes.
struct Batch {
  std::vector<std::vector<float>> xs;
  std::vector<ActivationQ8> xqs;
  std::vector<const float*> x_ptrs;
  std::vector<const ActivationQ8*> xq_ptrs;
};
template <class ActivationsOf>
inline Batch random_batch(std::int32_t n, const Shape& s, std::mt19937& rng, ActivationsOf activations_of) {
  Batch b;
  b.xqs.resize(static_cast<std::size_t>(n));
  for (std::int32_t v = 0; v < n; ++v) {
    b.xs.push_back(random_vector(s.cols, rng, v % 3 == 0 ? 3.0f : 1.0f));
    const Activations acts = activations_of(v);
    if (acts != Activations::F32)
      quantize_activation(b.xs.back().data(), s.cols, s.group, b.xqs[static_cast<std::size_t>(v)],
                          acts == Activations::Int8Residual);
  }
  for (std::int32_t v = 0; v < n; ++v) {
    b.x_ptrs.push_back(b.xs[static_cast<std::size_t>(v)].data());
    b.xq_ptrs.push_back(&b.xqs[static_cast<std::size_t>(v)]);
  }
  return b;
}

// Case i's rows: all of them for even i, a random range for odd i.
inline std::pair<std::int32_t, std::int32_t> case_rows(int i, std::int32_t rows, std::mt19937& rng) {
  if (i % 2 == 0) return {0, rows};
  const std::int32_t begin = std::uniform_int_distribution<std::int32_t>(0, rows - 1)(rng);
  return {begin, std::uniform_int_distribution<std::int32_t>(begin + 1, rows)(rng)};
}

// matmat gives, for every vector, exactly matvec's bits, writes only its row
// range, and works for any number of vectors (more than kMatmatChunk too).
// `cases` random shapes per format and activation kind; `wide`: rows wider
// than a packed tile (random_wide_shape) and counts that take the tiles.
inline int check_matmat_matches_matvec(int cases, std::uint32_t seed = 2024, bool wide = false) {
  Report report(wide ? "wide matmat == matvec" : "matmat == matvec");
  std::mt19937 rng(seed);
  constexpr std::int32_t kCounts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 31, 33, 64, 70};
  constexpr std::int32_t kWideCounts[] = {5, 8, 9, 16, 17};
  for (WeightFormat format : kFormats)
    for (Activations acts : {Activations::F32, Activations::Int8, Activations::Int8Residual}) {
      if (acts != Activations::F32 && !is_quantized(format)) continue;
      for (int i = 0; i < cases; ++i) {
        const Shape s = wide ? random_wide_shape(format, rng) : random_shape(format, rng, 11);
        const std::int32_t n =
            wide ? kWideCounts[std::uniform_int_distribution<std::size_t>(0, std::size(kWideCounts) - 1)(rng)]
                 : kCounts[std::uniform_int_distribution<std::size_t>(0, std::size(kCounts) - 1)(rng)];
        Weights w = make_weights(format, s.rows, s.cols, s.group, rng);
        const Batch batch = random_batch(n, s, rng, [&](std::int32_t) { return acts; });
        const auto& x_ptrs = batch.x_ptrs;
        const auto& xq_ptrs = batch.xq_ptrs;
        // Every other case computes a random row range only.
        const auto [begin, end] = case_rows(i, s.rows, rng);
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

// One matmat over vectors of different kinds (f32, one int8 plane, two
// planes: what a batch of sessions in different activation modes hands the
// kernels) gives each vector matvec's bits.
inline int check_mixed_batches_match_matvec(int cases, std::uint32_t seed = 4242) {
  Report report("mixed matmat == matvec");
  std::mt19937 rng(seed);
  for (WeightFormat format : kFormats) {
    if (!is_quantized(format)) continue;
    for (int i = 0; i < cases; ++i) {
      const Shape s = random_shape(format, rng, 20);
      const std::int32_t n = std::uniform_int_distribution<std::int32_t>(2, 70)(rng);
      Weights w = make_weights(format, s.rows, s.cols, s.group, rng);
      std::vector<int> kinds;  // 0 f32, 1 one plane, 2 two planes
      const Batch batch = random_batch(n, s, rng, [&](std::int32_t) {
        kinds.push_back(std::uniform_int_distribution<int>(0, 2)(rng));
        return kinds.back() == 0 ? Activations::F32 : kinds.back() == 1 ? Activations::Int8 : Activations::Int8Residual;
      });
      const auto& x_ptrs = batch.x_ptrs;
      const auto& xq_ptrs = batch.xq_ptrs;
      std::vector<std::vector<float>> got(static_cast<std::size_t>(n), std::vector<float>(static_cast<std::size_t>(s.rows)));
      std::vector<float*> y_ptrs;
      for (auto& y : got) y_ptrs.push_back(y.data());
      matmat(w.m, n, x_ptrs.data(), xq_ptrs.data(), y_ptrs.data(), 0, s.rows);
      std::vector<float> want(static_cast<std::size_t>(s.rows));
      for (std::int32_t v = 0; v < n; ++v) {
        matvec(w.m, x_ptrs[static_cast<std::size_t>(v)], xq_ptrs[static_cast<std::size_t>(v)], want.data(), 0, s.rows);
        for (std::int32_t r = 0; r < s.rows; ++r)
          if (std::memcmp(&got[static_cast<std::size_t>(v)][static_cast<std::size_t>(r)], &want[static_cast<std::size_t>(r)],
                          sizeof(float)) != 0)
            report.fail("%s %dx%d group %d, n %d, vector %d (kind %d) row %d: %.9g, matvec %.9g",
                        std::string(weight_format_name(format)).c_str(), s.rows, s.cols, s.group, n, v,
                        kinds[static_cast<std::size_t>(v)], r,
                        static_cast<double>(got[static_cast<std::size_t>(v)][static_cast<std::size_t>(r)]),
                        static_cast<double>(want[static_cast<std::size_t>(r)]));
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

// Q8R16 and Q4R16 have one definition each (kernels_scalar.cpp), so every path must give the
// portable path's bits exactly: matvec and matmat, one and two activation
// planes and f32 activations, random row ranges (partial 16-row blocks
// included), on the active path against the scalar one.
inline int check_r16_matches_portable(WeightFormat format, int cases, std::uint32_t seed = 1616) {
  Report report(std::string(weight_format_name(format)) + " == portable");
  std::mt19937 rng(seed);
  const Isa path = active_isa();
  constexpr std::int32_t kCounts[] = {1, 2, 3, 5, 8, 9, 16, 17, 33, 70};
  for (Activations acts : {Activations::F32, Activations::Int8, Activations::Int8Residual})
    for (int i = 0; i < cases; ++i) {
      // Every sixth case is tall, with 4 or more vectors: the AVX2 two-plane
      // kernel then walks panels of 8 blocks, so these have several, and a
      // last one cut short.
      const bool tall = i % 6 == 2;
      Shape s = random_shape(format, rng, tall ? 300 : 40);
      if (i == 0) s.cols = 2048;
      std::int32_t n = kCounts[std::uniform_int_distribution<std::size_t>(0, std::size(kCounts) - 1)(rng)];
      if (tall && n < 4) n = 5;
      // The first tall case with one plane: all of 272 rows of 2048 columns,
      // more than one 512 KB panel of blocks, for one tile of vectors in
      // groups every path takes fast (the AMX walk packs such a tile once for
      // all panels).
      if (i == 2 && acts == Activations::Int8) {
        s.rows = 272;
        s.cols = 2048;
        s.group = 64;
        n = 12;
      }
      Weights w = make_weights(format, s.rows, s.cols, s.group, rng);
      const Batch batch = random_batch(n, s, rng, [&](std::int32_t) { return acts; });
      const auto& x_ptrs = batch.x_ptrs;
      const auto& xq_ptrs = batch.xq_ptrs;
      const auto [begin, end] = case_rows(i, s.rows, rng);
      auto run = [&](Isa isa) {
        force_isa(isa);
        std::vector<std::vector<float>> y(static_cast<std::size_t>(n), std::vector<float>(static_cast<std::size_t>(s.rows), -7.25f));
        std::vector<float*> y_ptrs;
        for (auto& row : y) y_ptrs.push_back(row.data());
        matmat(w.m, n, x_ptrs.data(), acts == Activations::F32 ? nullptr : xq_ptrs.data(), y_ptrs.data(), begin, end);
        return y;
      };
      const auto got = run(path);
      const auto want = run(Isa::Scalar);
      force_isa(path);
      for (std::int32_t v = 0; v < n; ++v)
        for (std::int32_t r = 0; r < s.rows; ++r) {
          const float g = got[static_cast<std::size_t>(v)][static_cast<std::size_t>(r)];
          const float e = want[static_cast<std::size_t>(v)][static_cast<std::size_t>(r)];
          if (std::memcmp(&g, &e, sizeof g) != 0)
            report.fail("%dx%d group %d, %s activations, n %d, rows [%d,%d): y[%d][%d] = %.9g, portable %.9g", s.rows,
                        s.cols, s.group, activations_name(acts), n, begin, end, v, r, static_cast<double>(g),
                        static_cast<double>(e));
        }
    }
  return report.failures();
}

// The attention kernels over f32 and f16 caches against the scalar reference
// (ref::attention_scores / attention_values, which widen f16 exactly), on
// random head sizes ragged against every vector width, position counts
// around the 4-position blocks, and odd row strides holding several heads.
// Neither kernel may write past its output. `cases` shapes per cache type.
inline int check_attention_matches_reference(int cases, std::uint32_t seed = 31) {
  Report report("attention ~ reference");
  std::mt19937 rng(seed);
  static constexpr std::int32_t kHeadDims[] = {1, 3, 4, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 48,
                                               63, 64, 65, 80, 96, 100, 127, 128, 130, 256};
  static constexpr std::int32_t kPositions[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 33, 64, 200, 513};
  auto pick = [&rng](const auto& list) { return list[std::uniform_int_distribution<std::size_t>(0, std::size(list) - 1)(rng)]; };
  constexpr float kUntouched = -3.5f;
  for (bool f16 : {false, true}) {
    for (int i = 0; i < cases; ++i) {
      const std::int32_t head_dim = pick(kHeadDims), positions = pick(kPositions);
      const std::int32_t heads = std::uniform_int_distribution<std::int32_t>(1, 4)(rng);
      const std::size_t stride = static_cast<std::size_t>(head_dim) * heads + std::uniform_int_distribution<std::size_t>(0, 9)(rng);
      const std::size_t head = static_cast<std::size_t>(std::uniform_int_distribution<std::int32_t>(0, heads - 1)(rng)) * head_dim;
      // Keys and values of a trained model's size (RoPE'd, often normed),
      // with the outliers random_vector adds.
      const std::int32_t cache_size = static_cast<std::int32_t>(stride * static_cast<std::size_t>(positions));
      std::vector<float> keys = random_vector(cache_size, rng, 2.0f), values = random_vector(cache_size, rng);
      std::vector<std::uint16_t> keys16(keys.size()), values16(values.size());
      for (std::size_t e = 0; e < keys.size(); ++e) {
        keys16[e] = f32_to_f16(keys[e]);
        values16[e] = f32_to_f16(values[e]);
        // The f32 cache then holds exactly the values the f16 one encodes,
        // so the magnitudes below serve both.
        keys[e] = f16_to_f32(keys16[e]);
        values[e] = f16_to_f32(values16[e]);
      }
      const std::vector<float> q = random_vector(head_dim, rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      auto context = [&] {
        return std::string(f16 ? "f16" : "f32") + " head_dim " + std::to_string(head_dim) + " positions " +
               std::to_string(positions) + " stride " + std::to_string(stride);
      };

      std::vector<float> scores(static_cast<std::size_t>(positions) + 1, kUntouched), want(scores.size());
      if (f16) {
        attention_scores_f16(q.data(), keys16.data() + head, stride, positions, head_dim, scale, scores.data());
        ref::attention_scores(q.data(), keys16.data() + head, stride, positions, head_dim, scale, want.data());
      } else {
        attention_scores(q.data(), keys.data() + head, stride, positions, head_dim, scale, scores.data());
        ref::attention_scores(q.data(), keys.data() + head, stride, positions, head_dim, scale, want.data());
      }
      if (scores[static_cast<std::size_t>(positions)] != kUntouched) report.fail("%s: scores written past n_positions", context().c_str());
      for (std::int32_t p = 0; p < positions; ++p) {
        const float* k = keys.data() + static_cast<std::size_t>(p) * stride + head;
        double magnitude = 0.0;
        for (std::int32_t d = 0; d < head_dim; ++d) magnitude += std::fabs(static_cast<double>(q[d]) * k[d]);
        // Both sides sum head_dim products in f32, in different orders.
        const double tolerance = (head_dim + 16) * kUlp * magnitude * scale + 1e-30;
        if (!(std::fabs(static_cast<double>(scores[p]) - want[p]) <= tolerance))
          report.fail("%s: score %d = %.9g, reference %.9g", context().c_str(), p, static_cast<double>(scores[p]),
                      static_cast<double>(want[p]));
      }

      ref::softmax(want.data(), positions);  // the weights, as the forward pass makes them
      // One guard element on each side of the output.
      std::vector<float> out(static_cast<std::size_t>(head_dim) + 2, kUntouched), want_out(static_cast<std::size_t>(head_dim));
      if (f16) {
        attention_values_f16(want.data(), values16.data() + head, stride, positions, head_dim, out.data() + 1);
        ref::attention_values(want.data(), values16.data() + head, stride, positions, head_dim, want_out.data());
      } else {
        attention_values(want.data(), values.data() + head, stride, positions, head_dim, out.data() + 1);
        ref::attention_values(want.data(), values.data() + head, stride, positions, head_dim, want_out.data());
      }
      if (out.front() != kUntouched || out.back() != kUntouched) report.fail("%s: values written outside head_dim", context().c_str());
      for (std::int32_t d = 0; d < head_dim; ++d) {
        double magnitude = 0.0;
        for (std::int32_t p = 0; p < positions; ++p)
          magnitude += std::fabs(static_cast<double>(want[p]) * values[static_cast<std::size_t>(p) * stride + head + d]);
        const double tolerance = (positions + 16) * kUlp * magnitude + 1e-30;
        const double got = out[static_cast<std::size_t>(d) + 1];
        if (!(std::fabs(got - want_out[d]) <= tolerance))
          report.fail("%s: out[%d] = %.9g, reference %.9g", context().c_str(), d, got, static_cast<double>(want_out[d]));
      }
    }
  }
  return report.failures();
}

// convert_f32_to_f16 gives f32_to_f16's bits (its definition: round to
// nearest even, overflow to infinity, subnormals kept) for every length (ragged
// tails), and writes nothing past n. Values: the rounding edge cases, normals
// of every scale an f16 holds and beyond, random bit patterns; NaN stays NaN.
inline int check_f16_conversion(std::uint32_t seed = 5) {
  Report report("convert_f32_to_f16 == f32_to_f16");
  std::mt19937 rng(seed);
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e10f, -1e10f,
                          INFINITY, -INFINITY,
                          std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(3.0f, -25), std::ldexp(5.0f, -25),
                          std::ldexp(1.0f, -26), std::ldexp(1.0f, -14), std::ldexp(1023.0f, -24), std::ldexp(2047.0f, -25),
                          1.0f + std::ldexp(1.0f, -11), 1.0f + std::ldexp(3.0f, -11), 1.0f + std::ldexp(1.0f, -12),
                          2049.0f, 2051.0f, 1e-30f, std::numeric_limits<float>::denorm_min()};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 17);
  for (int i = 0; i < 2000; ++i) x.push_back(std::ldexp(normal(rng), exponent(rng)));
  std::uniform_int_distribution<std::uint32_t> bits;
  while (x.size() < 3000) {
    const std::uint32_t b = bits(rng);
    float f;
    std::memcpy(&f, &b, sizeof f);
    if (!std::isnan(f)) x.push_back(f);
  }
  for (int i = 0; i < 5; ++i) x.push_back(std::numeric_limits<float>::quiet_NaN());
  constexpr std::uint16_t kGuard = 0xabcd;
  std::vector<std::uint16_t> got(x.size() + 1);
  for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{8}, std::size_t{9}, std::size_t{15},
                        std::size_t{16}, std::size_t{17}, std::size_t{31}, std::size_t{33}, x.size()}) {
    std::fill(got.begin(), got.end(), kGuard);
    convert_f32_to_f16(x.data(), static_cast<std::int32_t>(n), got.data());
    if (got[n] != kGuard) report.fail("n %zu: wrote past n", n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t want = f32_to_f16(x[i]);
      const bool nan = std::isnan(x[i]);
      const bool ok = nan ? (got[i] & 0x7c00u) == 0x7c00u && (got[i] & 0x3ffu) != 0 : got[i] == want;
      if (!ok) report.fail("n %zu: %.9g -> 0x%04x, f32_to_f16 0x%04x", n, static_cast<double>(x[i]), got[i], want);
    }
  }
  return report.failures();
}

}  // namespace colibri::kernels::checks
