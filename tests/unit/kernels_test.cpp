// Every kernel on every instruction-set path this machine can run, against the
// scalar reference (kernels/reference.h) or an exact integer model of the int8
// arithmetic, on random shapes with ragged tails. Tolerances follow from the
// arithmetic: a float sum of k terms in any order is within about k * 2^-24
// times the sum of the terms' magnitudes of the exact value, so each bound is
// (terms + slack) * 2^-23 * sum|terms|; integer parts are compared exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernel_checks.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/quantize.h"
#include "kernels/reference.h"

namespace colibri::kernels {
namespace {

using checks::exact_int8_row;
using checks::kUlp;
using checks::make_weights;
using checks::random_vector;
using checks::Weights;

class KernelPaths : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    previous_ = active_isa();
    ASSERT_TRUE(force_isa(GetParam()));
    ASSERT_EQ(active_isa(), GetParam());
  }
  void TearDown() override { force_isa(previous_); }
  Isa previous_ = Isa::Scalar;
};

struct Shape {
  std::int32_t rows, cols, group;
};

std::vector<Shape> shapes(WeightFormat format, std::mt19937& rng) {
  std::vector<Shape> out;
  const std::int32_t cols_list[] = {1, 7, 16, 31, 33, 48, 63, 64, 65, 100, 127, 128, 129, 200, 255, 256, 257, 384, 1000, 2048};
  std::uniform_int_distribution<std::int32_t> rows(1, 67);
  for (std::int32_t cols : cols_list) {
    if (!is_quantized(format)) {
      out.push_back({rows(rng), cols, 0});
      continue;
    }
    // The defaults, the other common sizes, group > cols, and odd sizes.
    for (std::int32_t group : {32, 64, 128, 256, cols + 5, 3, 17, 40, 96})
      out.push_back({rows(rng), cols, group});
  }
  return out;
}

TEST_P(KernelPaths, MatvecWithF32ActivationsMatchesReference) {
  std::mt19937 rng(1234);
  for (WeightFormat format : {WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16, WeightFormat::Q8, WeightFormat::Q4}) {
    for (const Shape& s : shapes(format, rng)) {
      SCOPED_TRACE(testing::Message() << weight_format_name(format) << " " << s.rows << "x" << s.cols << " group " << s.group);
      Weights w = make_weights(format, s.rows, s.cols, s.group, rng);
      std::vector<float> x = random_vector(s.cols, rng);
      std::vector<float> want(static_cast<std::size_t>(s.rows)), got(want.size(), NAN);
      ref::matvec(w.m, x.data(), want.data());
      matvec(w.m, x.data(), nullptr, got.data());
      std::vector<float> row(static_cast<std::size_t>(s.cols));
      for (std::int32_t r = 0; r < s.rows; ++r) {
        dequantize_row(w.m, r, row.data());
        double magnitude = 0.0;
        for (std::int32_t c = 0; c < s.cols; ++c) magnitude += std::fabs(static_cast<double>(row[c]) * x[c]);
        // Both sides sum cols products (plus per-group rescaling) in f32.
        const double tolerance = (s.cols + 64) * kUlp * magnitude + 1e-30;
        ASSERT_NEAR(got[r], want[r], tolerance) << "row " << r;
      }
    }
  }
}

TEST_P(KernelPaths, MatvecWithInt8ActivationsIsTheExactIntegerProduct) {
  std::mt19937 rng(99);
  for (bool residual : {false, true})
  for (WeightFormat format : {WeightFormat::Q8, WeightFormat::Q4}) {
    for (const Shape& s : shapes(format, rng)) {
      SCOPED_TRACE(testing::Message() << weight_format_name(format) << " " << s.rows << "x" << s.cols << " group "
                                      << s.group << (residual ? " residual" : ""));
      Weights w = make_weights(format, s.rows, s.cols, s.group, rng);
      std::vector<float> x = random_vector(s.cols, rng);
      ActivationQ8 xq;
      quantize_activation(x.data(), s.cols, s.group, xq, residual);
      ASSERT_TRUE(uses_int8_activations(w.m, &xq));
      std::vector<float> got(static_cast<std::size_t>(s.rows), NAN), want_f32(got.size());
      matvec(w.m, x.data(), &xq, got.data());
      ref::matvec(w.m, x.data(), want_f32.data());
      const std::int32_t groups = (s.cols + s.group - 1) / s.group;
      std::vector<float> row(static_cast<std::size_t>(s.cols));
      for (std::int32_t r = 0; r < s.rows; ++r) {
        double exact, magnitude;
        exact_int8_row(w.m, r, xq, exact, magnitude);
        // Per-group integer dots are exact; what remains is f32 accumulation of
        // one term per group (and lane) plus the scale product's rounding.
        ASSERT_NEAR(got[r], exact, (groups + 40) * kUlp * magnitude + 1e-30) << "row " << r;
        // And against the f32 reference: each activation is off by at most half
        // its group's step (the residual plane's step with it), so
        // |error| <= sum_c |w_c| * step_g / 2 (plus the residual's own rounding).
        dequantize_row(w.m, r, row.data());
        double bound = 0.0, f32_magnitude = 0.0;
        for (std::int32_t c = 0; c < s.cols; ++c) {
          const double step = residual ? xq.residual_scales[c / s.group] + 4e-7 * std::fabs(x[c]) : xq.scales[c / s.group];
          bound += std::fabs(row[c]) * step * 0.5;
          f32_magnitude += std::fabs(static_cast<double>(row[c]) * x[c]);
        }
        ASSERT_NEAR(got[r], want_f32[r], bound * 1.0001 + (s.cols + 64) * kUlp * (f32_magnitude + magnitude) + 1e-30)
            << "row " << r;
      }
    }
  }
}

TEST_P(KernelPaths, RowRangesComputeTheSameBitsAndTouchNothingElse) {
  std::mt19937 rng(7);
  for (WeightFormat format : {WeightFormat::F32, WeightFormat::BF16, WeightFormat::Q8, WeightFormat::Q4}) {
    const std::int32_t rows = 67, cols = 300, group = is_quantized(format) ? 32 : 0;
    Weights w = make_weights(format, rows, cols, group, rng);
    std::vector<float> x = random_vector(cols, rng);
    ActivationQ8 xq;
    quantize_activation(x.data(), cols, std::max(group, 1), xq);
    ActivationQ8 xq2;
    quantize_activation(x.data(), cols, std::max(group, 1), xq2, true);
    for (const ActivationQ8* q : {static_cast<const ActivationQ8*>(nullptr), static_cast<const ActivationQ8*>(&xq),
                                  static_cast<const ActivationQ8*>(&xq2)}) {
      std::vector<float> whole(rows);
      matvec(w.m, x.data(), q, whole.data());
      for (int trial = 0; trial < 20; ++trial) {
        std::int32_t a = std::uniform_int_distribution<std::int32_t>(0, rows)(rng);
        std::int32_t b = std::uniform_int_distribution<std::int32_t>(0, rows)(rng);
        if (a > b) std::swap(a, b);
        std::vector<float> part(rows, -7.0f);
        matvec(w.m, x.data(), q, part.data(), a, b);
        for (std::int32_t r = 0; r < rows; ++r) {
          if (r >= a && r < b)
            ASSERT_EQ(part[r], whole[r]) << weight_format_name(format) << " row " << r << " of [" << a << "," << b << ")";
          else
            ASSERT_EQ(part[r], -7.0f) << "row " << r << " outside [" << a << "," << b << ") was written";
        }
      }
    }
  }
}

// Random shapes with ragged rows, columns and vector counts, one and two
// activation planes, row ranges (kernel_checks.h).
TEST_P(KernelPaths, MatmatGivesMatvecsBitsForEveryVector) { EXPECT_EQ(checks::check_matmat_matches_matvec(60), 0); }
TEST_P(KernelPaths, MatmatOnWideRowsGivesMatvecsBits) {
  EXPECT_EQ(checks::check_matmat_matches_matvec(6, 77, /*wide=*/true), 0);
}

TEST_P(KernelPaths, MixedBatchesGiveEachVectorMatvecsBits) { EXPECT_EQ(checks::check_mixed_batches_match_matvec(20), 0); }

TEST_P(KernelPaths, Q8R16GivesThePortableDefinitionsBits) {
  EXPECT_EQ(checks::check_r16_matches_portable(WeightFormat::Q8R16, 30), 0);
}

TEST_P(KernelPaths, Q4R16GivesThePortableDefinitionsBits) {
  EXPECT_EQ(checks::check_r16_matches_portable(WeightFormat::Q4R16, 30), 0);
}

TEST_P(KernelPaths, MatvecOnRandomShapesMatchesReference) { EXPECT_EQ(checks::check_matvec_matches_reference(40), 0); }

// f32 and f16 KV caches, random head sizes, positions and strides (kernel_checks.h).
TEST_P(KernelPaths, AttentionOnRandomShapesMatchesReference) {
  EXPECT_EQ(checks::check_attention_matches_reference(200), 0);
}

TEST_P(KernelPaths, F16ConversionGivesTheScalarDefinitionsBits) { EXPECT_EQ(checks::check_f16_conversion(), 0); }

// Groups whose maximum is too small to divide 127 by, and NaN values: every
// path gives 0 for them (before, the vector paths gave -127 for every value of
// a tiny group, flipping the positive ones, and the scalar path converted NaN
// to an integer, undefined), and NaN is left out of the group's maximum.
TEST_P(KernelPaths, ActivationQuantizationOfTinyGroupsAndNanIsIdenticalAndZero) {
  const float nan = std::nanf("");
  const std::vector<float> x = {1e-37f, 0.0f, -1e-37f, 5e-38f,  // a tiny group
                                1.0f,   nan,  -0.5f,   0.25f,   // NaN beside ordinary values
                                nan,    nan,  nan,     nan,     // nothing but NaN
                                2.0f,   -2.0f, 1.0f,   -1.0f};
  ActivationQ8 got, want;
  quantize_activation(x.data(), 16, 4, got, true);
  ASSERT_TRUE(force_isa(Isa::Scalar));
  quantize_activation(x.data(), 16, 4, want, true);
  ASSERT_TRUE(force_isa(GetParam()));
  EXPECT_EQ(got.q, want.q);
  EXPECT_EQ(got.scales, want.scales);
  EXPECT_EQ(got.sums, want.sums);
  EXPECT_EQ(got.residual_q, want.residual_q);
  EXPECT_EQ(got.residual_sums, want.residual_sums);
  const std::vector<std::int8_t> expected = {0, 0, 0, 0, 127, 0, -64, 32, 0, 0, 0, 0, 127, -127, 64, -64};
  EXPECT_EQ(std::vector<std::int8_t>(got.q.begin(), got.q.begin() + 16), expected);
  EXPECT_EQ(got.sums[0], 0);
  EXPECT_EQ(got.sums[1], 127 - 64 + 32);
  EXPECT_EQ(got.sums[2], 0);
}

TEST_P(KernelPaths, ActivationQuantizationIsIdenticalToTheScalarPath) {
  std::mt19937 rng(5);
  for (std::int32_t n : {1, 5, 64, 100, 128, 129, 256, 383, 2048}) {
    for (std::int32_t group : {1, 3, 32, 64, 128, 1000}) {
      std::vector<float> x = random_vector(n, rng, 3.0f);
      if (n > 10) std::fill(x.begin() + 2, x.begin() + 9, 0.0f);  // an all-zero group for small groups
      ActivationQ8 got, want;
      quantize_activation(x.data(), n, group, got, true);
      ASSERT_TRUE(force_isa(Isa::Scalar));
      quantize_activation(x.data(), n, group, want, true);
      ASSERT_TRUE(force_isa(GetParam()));
      SCOPED_TRACE(testing::Message() << "n " << n << " group " << group);
      EXPECT_EQ(got.q, want.q);
      EXPECT_EQ(got.scales, want.scales);
      EXPECT_EQ(got.sums, want.sums);
      EXPECT_EQ(got.residual_q, want.residual_q);
      EXPECT_EQ(got.residual_scales, want.residual_scales);
      EXPECT_EQ(got.residual_sums, want.residual_sums);
      const std::size_t blocks = static_cast<std::size_t>(n) / 128 * 128;
      EXPECT_TRUE(std::equal(got.q4.begin(), got.q4.begin() + static_cast<std::ptrdiff_t>(blocks), want.q4.begin()));
      EXPECT_TRUE(std::equal(got.residual_q4.begin(), got.residual_q4.begin() + static_cast<std::ptrdiff_t>(blocks),
                             want.residual_q4.begin()));
      // The residual plane quantizes what the first missed, at exactly
      // 1/kResidualRatio of its step (the Q8R16 kernels add the planes'
      // dots in int32), its codes within [-kResidualLimit, kResidualLimit].
      for (std::size_t g = 0; g < got.scales.size(); ++g)
        ASSERT_EQ(got.residual_scales[g], got.scales[g] / static_cast<float>(kResidualRatio));
      for (std::int32_t c = 0; c < n; ++c) ASSERT_LE(std::abs(got.residual_q[static_cast<std::size_t>(c)]), kResidualLimit);
      // The definition: round(x * 127 / max|x|) per group, padding zero.
      for (std::int32_t c = 0; c < n; ++c) {
        const float amax = [&] {
          float m = 0.0f;
          for (std::int32_t i = c / group * group; i < std::min(n, (c / group + 1) * group); ++i) m = std::max(m, std::fabs(x[i]));
          return m;
        }();
        const float expected = amax > 0.0f ? std::nearbyint(x[c] * (127.0f / amax)) : 0.0f;
        ASSERT_EQ(got.q[static_cast<std::size_t>(c)], static_cast<std::int8_t>(expected)) << "column " << c;
      }
      for (std::size_t c = static_cast<std::size_t>(n); c < got.q.size(); ++c) ASSERT_EQ(got.q[c], 0);
    }
  }
}

TEST_P(KernelPaths, ElementwiseKernelsMatchReference) {
  std::mt19937 rng(11);
  for (std::int32_t n : {1, 3, 8, 15, 16, 17, 64, 100, 1000, 2051}) {
    SCOPED_TRACE(testing::Message() << "n " << n);
    std::vector<float> a = random_vector(n, rng, 2.0f), b = random_vector(n, rng), w = random_vector(n, rng);

    double magnitude = 0.0;
    for (std::int32_t i = 0; i < n; ++i) magnitude += std::fabs(static_cast<double>(a[i]) * b[i]);
    EXPECT_NEAR(dot(a.data(), b.data(), n), ref::dot(a.data(), b.data(), n), (n + 16) * kUlp * magnitude);

    std::vector<float> got(a.size()), want(a.size());
    rmsnorm(a.data(), w.data(), n, 1e-5f, got.data());
    ref::rmsnorm(a.data(), w.data(), n, 1e-5f, want.data());
    // The sum of squares may be accumulated in f32 (n terms), then a few roundings per element.
    for (std::int32_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], (n / 2.0 + 8) * kUlp * std::fabs(want[i]) + 1e-30) << i;

    got = a;
    want = a;
    softmax(got.data(), n);
    ref::softmax(want.data(), n);
    // exp to a few ulp, then the normalising sum of n positive terms.
    for (std::int32_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], (n + 16) * kUlp * want[i] + 1e-38) << i;

    swiglu(a.data(), b.data(), n, got.data());
    for (std::int32_t i = 0; i < n; ++i) {
      const float expected = ref::silu(a[i]) * b[i];
      ASSERT_NEAR(got[i], expected, 16 * kUlp * std::fabs(expected) + 1e-30) << i;
    }
  }
  // Softmax of very spread logits: tiny probabilities underflow gracefully.
  std::vector<float> spread = {0.0f, -50.0f, -100.0f, -200.0f, 3.0f};
  softmax(spread.data(), 5);
  EXPECT_NEAR(spread[4], 1.0f / (1.0f + std::exp(-3.0f)), 1e-6);
  for (float p : spread) EXPECT_TRUE(p >= 0.0f && p <= 1.0f);
}

TEST_P(KernelPaths, AttentionKernelsMatchReference) {
  std::mt19937 rng(3);
  for (std::int32_t head_dim : {16, 24, 64, 80, 128, 130}) {
    for (std::int32_t positions : {1, 3, 4, 5, 33, 200}) {
      SCOPED_TRACE(testing::Message() << "head_dim " << head_dim << " positions " << positions);
      const std::size_t stride = static_cast<std::size_t>(head_dim) * 3 + 5;  // several heads per row, odd stride
      std::vector<float> cache = random_vector(static_cast<std::int32_t>(stride * positions), rng);
      std::vector<float> q = random_vector(head_dim, rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      std::vector<float> scores(static_cast<std::size_t>(positions));
      attention_scores(q.data(), cache.data() + head_dim, stride, positions, head_dim, scale, scores.data());
      for (std::int32_t p = 0; p < positions; ++p) {
        const float* k = cache.data() + static_cast<std::size_t>(p) * stride + head_dim;
        double magnitude = 0.0;
        for (std::int32_t i = 0; i < head_dim; ++i) magnitude += std::fabs(static_cast<double>(q[i]) * k[i]);
        ASSERT_NEAR(scores[p], ref::dot(q.data(), k, head_dim) * scale, (head_dim + 16) * kUlp * magnitude * scale) << p;
      }
      ref::softmax(scores.data(), positions);
      std::vector<float> out(static_cast<std::size_t>(head_dim) + 1, -3.0f);
      attention_values(scores.data(), cache.data() + 2 * head_dim, stride, positions, head_dim, out.data());
      ASSERT_EQ(out[static_cast<std::size_t>(head_dim)], -3.0f) << "wrote past head_dim";
      for (std::int32_t i = 0; i < head_dim; ++i) {
        double want = 0.0, magnitude = 0.0;
        for (std::int32_t p = 0; p < positions; ++p) {
          const double term = static_cast<double>(scores[p]) * cache[static_cast<std::size_t>(p) * stride + 2 * head_dim + i];
          want += term;
          magnitude += std::fabs(term);
        }
        ASSERT_NEAR(out[i], want, (positions + 16) * kUlp * magnitude + 1e-30) << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, KernelPaths, ::testing::ValuesIn(supported_isas()),
                         [](const auto& param_info) { return std::string(isa_name(param_info.param)); });

// f32_to_f16 (core/dtype.h), the definition every path's conversion is
// checked against: the nearest f16, ties to an even mantissa, overflow from
// 65520 (half-way to the next power of two) to infinity.
TEST(F16Conversion, RoundsToTheNearestHalfTiesToEven) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    if ((h & 0x7c00u) == 0x7c00u) continue;  // inf / NaN
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<std::uint16_t>(h))), h) << std::hex << h;
  }
  // The magnitude encoded by a positive pattern; 0x7c00 stands for 2^16,
  // where rounding to infinity starts.
  auto magnitude = [](std::uint32_t h) { return h == 0x7c00u ? 65536.0 : static_cast<double>(f16_to_f32(static_cast<std::uint16_t>(h))); };
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-27, 17);
  for (int i = 0; i < 200000; ++i) {
    // Half of them exactly half-way between two halves (or close to it).
    float x = std::ldexp(normal(rng), exponent(rng));
    if (i % 2 == 1) {
      const std::uint16_t h = f32_to_f16(x);
      if ((h & 0x7fffu) >= 0x7bffu) continue;
      x = static_cast<float>((static_cast<double>(f16_to_f32(h)) + f16_to_f32(static_cast<std::uint16_t>(h + 1))) / 2);
    }
    const std::uint16_t h = f32_to_f16(x);
    ASSERT_EQ(h >> 15, std::signbit(x) ? 1u : 0u) << x;
    const std::uint32_t m = h & 0x7fffu;
    const double ax = std::fabs(static_cast<double>(x));
    const double mine = std::fabs(ax - magnitude(m));
    for (std::uint32_t other : {m - 1, m + 1}) {
      if (other > 0x7c00u) continue;  // below zero (wrapped) or past infinity
      const double theirs = std::fabs(ax - magnitude(other));
      ASSERT_LE(mine, theirs) << x << " -> 0x" << std::hex << h;
      if (mine == theirs) {
        ASSERT_EQ(m & 1u, 0u) << "tie not to even: " << x;
      }
    }
  }
}

// RoPE as the engine computed it in one call per q or k until session 9,
// each angle recomputed where it is used.
void rope_in_one_call(float* x, std::int32_t n_heads, std::int32_t head_dim, std::int32_t position, float theta) {
  const std::int32_t half = head_dim / 2;
  for (std::int32_t i = 0; i < half; ++i) {
    double inv_freq = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
    double angle = position * inv_freq;
    float c = static_cast<float>(std::cos(angle));
    float s = static_cast<float>(std::sin(angle));
    for (std::int32_t h = 0; h < n_heads; ++h) {
      float* head = x + static_cast<std::size_t>(h) * head_dim;
      float a = head[i];
      float b = head[i + half];
      head[i] = a * c - b * s;
      head[i + half] = b * c + a * s;
    }
  }
}

// The batched forward pass computes a position's rotary angles once per step
// and rotates q and k of every layer with them: the bits must be those of the
// one-call rotation.
TEST(RopeAngles, SplitRotationGivesTheOneCallBits) {
  std::mt19937 rng(5);
  for (std::int32_t head_dim : {2, 64, 128, 256}) {
    for (std::int32_t position : {0, 1, 7, 4095, 131071}) {
      for (float theta : {10000.0f, 1000000.0f}) {
        SCOPED_TRACE(testing::Message() << "head_dim " << head_dim << " position " << position << " theta " << theta);
        const std::int32_t heads = 3;
        std::vector<float> want = random_vector(heads * head_dim, rng, 2.0f);
        std::vector<float> got = want;
        rope_in_one_call(want.data(), heads, head_dim, position, theta);
        std::vector<float> cos(static_cast<std::size_t>(head_dim / 2)), sin(cos.size());
        ref::rope_angles(head_dim, position, theta, cos.data(), sin.data());
        ref::rope_rotate_half(got.data(), heads, head_dim, cos.data(), sin.data());
        for (std::size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want[i])) << i;
      }
    }
  }
}

TEST(KernelDispatch, PathsAreNamedAndUnsupportedOnesAreRefused) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx, Isa::Neon}) EXPECT_EQ(isa_from_name(isa_name(isa)), isa);
  EXPECT_FALSE(isa_from_name("sse9").has_value());
  EXPECT_TRUE(isa_supported(Isa::Scalar));
  const Isa before = active_isa();
#if defined(__x86_64__)
  EXPECT_FALSE(isa_supported(Isa::Neon));
  EXPECT_FALSE(force_isa(Isa::Neon));
  EXPECT_EQ(active_isa(), before);
  // The default is the best path the CPU has.
  if (std::getenv("COLIBRI_ISA") == nullptr) {
    EXPECT_EQ(before, supported_isas().back());
  }
#endif
  ASSERT_TRUE(force_isa(Isa::Scalar));
  EXPECT_EQ(active_isa(), Isa::Scalar);
  ASSERT_TRUE(force_isa(before));
}

// COLIBRI_ISA caps the path: any spelling of a path's name takes it, and a
// name that is not a path takes the lowest, never the best (it did: "AVX2" or
// "sse" on an AVX-512 machine ran AVX-512). Each case runs in a fresh process,
// where the variable is read when the first kernel is chosen.
TEST(KernelDispatch, IsaVariableCapsThePathWhateverItsSpelling) {
  EXPECT_EQ(isa_from_name(" AVX2\n"), Isa::Avx2);
  EXPECT_EQ(isa_from_name("Scalar"), Isa::Scalar);
  if (!isa_supported(Isa::Avx2)) GTEST_SKIP() << "the capped path must exist here";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto chosen_with = [](const char* value, Isa expected) {
    setenv("COLIBRI_ISA", value, 1);
    std::exit(active_isa() == expected ? 0 : 1);
  };
  EXPECT_EXIT(chosen_with("AVX2", Isa::Avx2), testing::ExitedWithCode(0), "");
  EXPECT_EXIT(chosen_with("sse", Isa::Scalar), testing::ExitedWithCode(0), "not a path of this build");
  // avx512 caps an AMX machine below its tiles; amx where the CPU (or Linux)
  // has none takes the best path below it.
  if (isa_supported(Isa::Avx512)) EXPECT_EXIT(chosen_with("avx512", Isa::Avx512), testing::ExitedWithCode(0), "");
  if (!isa_supported(Isa::Amx))
    EXPECT_EXIT(chosen_with("amx", supported_isas().back()), testing::ExitedWithCode(0), "not supported by this CPU");
}

}  // namespace
}  // namespace colibri::kernels
