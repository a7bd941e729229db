// How faithful quantized .colibri files are to the f32 reference, measured as
// the format issue asks: over all prompt positions of all fixture prompts,
// top-1 agreement, mean |dlogit| over the reference's top-64 ids, and mean KL
// over those ids (both distributions renormalised over the 64 ids). Sessions
// use their default KV cache (f16 for int8/int4 files, f32 for f32 ones)
// unless a test says otherwise; the f16 cache's own cost is measured below.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/checkpoint.h"
#include "format/colibri_writer.h"
#include "model/model.h"
#include "runtime/session.h"

namespace colibri {
namespace {

const char* const kFixtures[] = {"mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny", "olmoe-tiny"};

struct Fidelity {
  std::size_t positions = 0;
  std::size_t top1_agree = 0;
  double sum_abs_dlogit = 0.0;  // averaged over positions x 64
  double sum_kl = 0.0;
  double max_abs_dlogit = 0.0;  // over every position's top-64 ids
  std::size_t file_bytes = 0;

  double top1() const { return static_cast<double>(top1_agree) / static_cast<double>(positions); }
  double mean_abs_dlogit() const { return sum_abs_dlogit / static_cast<double>(positions); }
  double mean_kl() const { return sum_kl / static_cast<double>(positions); }
};

std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "fixtures" / name;
}

std::filesystem::path convert(const std::string& fixture, const QuantScheme& scheme) {
  auto dir = std::filesystem::temp_directory_path() / ("colibri-fidelity-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto out = dir / (fixture + "-" + scheme.name + ".colibri");
  auto checkpoint = open_checkpoint(fixture_dir(fixture));
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.error().message;
  ConvertInput input{checkpoint->config, checkpoint->config_json, checkpoint->tokenizer_json,
                     checkpoint->tokenizer_config_json, checkpoint->kind, checkpoint->source.get()};
  auto status = write_colibri(out, input, scheme);
  EXPECT_TRUE(status.ok()) << status.error().message;
  return out;
}

void measure(const std::string& fixture, const std::filesystem::path& model_path, Fidelity& f,
             const ActivationModes& modes, KvCacheType kv_cache) {
  auto model = Model::load(model_path, LoadOptions{.verify_checksums = true});
  ASSERT_TRUE(model.ok()) << model.error().message;
  f.file_bytes += std::filesystem::file_size(model_path);
  std::ifstream in(fixture_dir(fixture) / "reference.json");
  auto reference = nlohmann::json::parse(in);
  for (const auto& prompt : reference["prompts"]) {
    Session session(*model, 0, nullptr, Session::kDefaultPrefillBatch, nullptr, kv_cache);
    session.set_activation_modes(modes);
    const auto tokens = prompt["tokens"].get<std::vector<std::int32_t>>();
    for (std::size_t pos = 0; pos < tokens.size(); ++pos) {
      auto logits = session.decode(tokens[pos]);
      ASSERT_TRUE(logits.ok()) << logits.error().message;
      const auto& want = prompt["positions"][pos];
      std::int32_t argmax = 0;
      for (std::size_t i = 1; i < logits->size(); ++i)
        if ((*logits)[i] > (*logits)[static_cast<std::size_t>(argmax)]) argmax = static_cast<std::int32_t>(i);
      f.top1_agree += argmax == want["argmax"].get<std::int32_t>();
      // KL(reference || ours) over the reference's top-64 ids.
      std::vector<double> ref, ours;
      for (const auto& pair : want["top"]) {
        ref.push_back(pair[1].get<double>());
        ours.push_back((*logits)[pair[0].get<std::size_t>()]);
      }
      auto log_softmax = [](std::vector<double> v) {
        double m = *std::max_element(v.begin(), v.end()), s = 0.0;
        for (double x : v) s += std::exp(x - m);
        for (double& x : v) x = x - m - std::log(s);
        return v;
      };
      auto lp = log_softmax(ref), lq = log_softmax(ours);
      double kl = 0.0, abs_diff = 0.0;
      for (std::size_t i = 0; i < ref.size(); ++i) {
        kl += std::exp(lp[i]) * (lp[i] - lq[i]);
        abs_diff += std::fabs(ref[i] - ours[i]);
        f.max_abs_dlogit = std::max(f.max_abs_dlogit, std::fabs(ref[i] - ours[i]));
      }
      f.sum_kl += kl;
      f.sum_abs_dlogit += abs_diff / static_cast<double>(ref.size());
      ++f.positions;
    }
  }
}

// kv_cache Auto is the sessions' default: f16 for int8/int4 files, f32 for f32 ones.
Fidelity measure_scheme(const QuantScheme& scheme, const ActivationModes& modes = {}, const char* label = "",
                        KvCacheType kv_cache = KvCacheType::Auto) {
  Fidelity total;
  for (const char* fixture : kFixtures) {
    Fidelity one;
    measure(fixture, convert(fixture, scheme), one, modes, kv_cache);
    std::printf("[fidelity] %-6s%s %-14s top1 %.4f  mean|dlogit| %.4f  mean KL %.2e  file %zu bytes\n",
                scheme.name.c_str(), label, fixture, one.top1(), one.mean_abs_dlogit(), one.mean_kl(), one.file_bytes);
    total.positions += one.positions;
    total.top1_agree += one.top1_agree;
    total.sum_abs_dlogit += one.sum_abs_dlogit;
    total.sum_kl += one.sum_kl;
    total.max_abs_dlogit = std::max(total.max_abs_dlogit, one.max_abs_dlogit);
    total.file_bytes += one.file_bytes;
  }
  std::printf("[fidelity] %-6s%s ALL            top1 %.4f  mean|dlogit| %.4f  mean KL %.2e  files %zu bytes\n",
              scheme.name.c_str(), label, total.top1(), total.mean_abs_dlogit(), total.mean_kl(), total.file_bytes);
  std::printf("[fidelity] %-6s%s ALL            (%zu positions: top1 %.6f  mean|dlogit| %.6f  max|dlogit| %.4f  "
              "mean KL %.4e)\n",
              scheme.name.c_str(), label, total.positions, total.top1(), total.mean_abs_dlogit(), total.max_abs_dlogit,
              total.mean_kl());
  return total;
}

class QuantizedFidelity : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                ("colibri-fidelity-" + std::to_string(::getpid())));
  }
};

TEST_F(QuantizedFidelity, F32FileMatchesTheReference) {
  auto f = measure_scheme(*quant_scheme("f32"));
  EXPECT_EQ(f.top1_agree, f.positions);
  EXPECT_LT(f.mean_abs_dlogit(), 1e-4);
}

// With the session defaults: int8 weights and activations, f16 KV cache.
TEST_F(QuantizedFidelity, Int8BeatsTheReferenceEnginesEightBitFormat) {
  auto f = measure_scheme(*quant_scheme("int8"));
  EXPECT_GE(f.top1(), 0.97);
  EXPECT_LE(f.mean_abs_dlogit(), 0.05);
  EXPECT_LE(f.mean_kl(), 3e-3);
}

// The f16 KV cache alone, on the f32 files: K and V rounded to f16 (relative
// error <= 2^-11) and nothing else. Measured (980 positions, AVX-512): top-1
// 0.99898 (one position of 980, a near-tie, flips), mean |dlogit| 4.4e-4, max
// |dlogit| 4.9e-3, mean KL 1.3e-7. The golden tests hold f32 files to 1e-3 of
// the reference logits, which is why f32 files default to an f32 cache.
TEST_F(QuantizedFidelity, F16KvCacheAloneCostsLittle) {
  auto f = measure_scheme(*quant_scheme("f32"), {}, " f16-kv", KvCacheType::F16);
  EXPECT_GE(f.top1(), 0.997);
  EXPECT_LE(f.mean_abs_dlogit(), 2e-3);
  EXPECT_LE(f.mean_kl(), 1e-6);
}

// On int8 files the f16 cache is the default; next to the weights' and
// activations' own error it adds almost nothing. Measured (980 positions,
// AVX-512), f32 cache -> f16 cache: top-1 0.979592 -> 0.979592, mean |dlogit|
// 0.044476 -> 0.044492, mean KL 1.8760e-3 -> 1.8776e-3. The bounds allow ten
// times those differences and one position's top-1.
TEST_F(QuantizedFidelity, F16KvCacheAddsAlmostNothingToInt8) {
  auto f32_kv = measure_scheme(*quant_scheme("int8"), {}, " f32-kv", KvCacheType::F32);
  auto f16_kv = measure_scheme(*quant_scheme("int8"), {}, " f16-kv", KvCacheType::F16);
  EXPECT_GE(f32_kv.top1(), 0.97);
  EXPECT_LE(f32_kv.mean_abs_dlogit(), 0.05);
  EXPECT_LE(f32_kv.mean_kl(), 3e-3);
  EXPECT_GE(f16_kv.top1(), f32_kv.top1() - 1.5 / static_cast<double>(f32_kv.positions));
  EXPECT_LE(f16_kv.mean_abs_dlogit() - f32_kv.mean_abs_dlogit(), 2e-4);
  EXPECT_LE(f16_kv.mean_kl() - f32_kv.mean_kl(), 2e-5);
}

// Session::set_prefill_activation_modes(kPrefillInt8Ffn) computes every
// prompt position's logits (and K/V) exactly as a session decoding with those
// modes does, so measuring them token by token is measuring such a prefill.
// The presets are offered because they stay within the int8 bounds above.
TEST_F(QuantizedFidelity, PrefillInt8FfnPresetStaysWithinTheInt8Bounds) {
  auto f = measure_scheme(*quant_scheme("int8"), kPrefillInt8Ffn, " (int8-ffn prefill)");
  EXPECT_GE(f.top1(), 0.97);
  EXPECT_LE(f.mean_abs_dlogit(), 0.05);
  EXPECT_LE(f.mean_kl(), 3e-3);
}

// The prompt default: the attention output at one plane too.
TEST_F(QuantizedFidelity, PrefillInt8FfnOutPresetStaysWithinTheInt8Bounds) {
  auto f = measure_scheme(*quant_scheme("int8"), kPrefillInt8FfnOut, " (int8-ffn-out prefill)");
  EXPECT_GE(f.top1(), 0.97);
  EXPECT_LE(f.mean_abs_dlogit(), 0.05);
  EXPECT_LE(f.mean_kl(), 3e-3);
}

// The same scheme with row-major Q8 and Q4 (--plain-layout).
QuantScheme plain_layout(QuantScheme scheme) {
  scheme.interleave = false;
  scheme.name += "-plain";
  return scheme;
}

// int8 files store the multiplied matrices as Q8R16 (the same numbers as Q8,
// 16 rows interleaved; only the f32 order of the per-group sums differs from
// the row-major kernels), the embedding as Q8; --plain-q8 keeps Q8 everywhere.
// Both measure the same against the reference.
TEST_F(QuantizedFidelity, Q8R16FilesMatchPlainQ8Files) {
  const QuantScheme interleaved = *quant_scheme("int8"), plain = plain_layout(interleaved);
  for (const char* fixture : kFixtures) {
    auto a = Model::load(convert(fixture, interleaved));
    auto b = Model::load(convert(fixture, plain));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ((*a)->weights().embed.format, WeightFormat::Q8) << fixture;
    EXPECT_EQ((*b)->weights().layers[0].q.format, WeightFormat::Q8) << fixture;
    EXPECT_EQ((*a)->weights().layers[0].q.format, WeightFormat::Q8R16) << fixture;
    EXPECT_EQ((*a)->weights().lm_head.format, (*a)->weights().lm_head.rows % 16 == 0 ? WeightFormat::Q8R16 : WeightFormat::Q8)
        << fixture;
  }
  auto f = measure_scheme(interleaved), g = measure_scheme(plain);
  EXPECT_LE(std::fabs(f.top1() - g.top1()), 1.5 / static_cast<double>(f.positions));
  EXPECT_LE(std::fabs(f.mean_abs_dlogit() - g.mean_abs_dlogit()), 2e-4);
  EXPECT_LE(std::fabs(f.mean_kl() - g.mean_kl()), 2e-5);
}

// int4 files store the 4-bit experts as Q4R16: Q4's codes chosen against
// scales and minimums rounded to f16. That rounding is a few parts in 10^4 of
// a step, so the fidelity must match plain Q4's closely (the bounds are about
// a tenth of int4's own distance from the reference).
TEST_F(QuantizedFidelity, Q4R16FilesMatchPlainQ4Files) {
  const QuantScheme interleaved = *quant_scheme("int4"), plain = plain_layout(interleaved);
  for (const char* fixture : kFixtures) {
    auto a = Model::load(convert(fixture, interleaved));
    auto b = Model::load(convert(fixture, plain));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ((*a)->weights().layers[0].experts[0].gate.format, WeightFormat::Q4R16) << fixture;
    EXPECT_EQ((*b)->weights().layers[0].experts[0].gate.format, WeightFormat::Q4) << fixture;
  }
  auto f = measure_scheme(interleaved), g = measure_scheme(plain);
  EXPECT_LE(std::fabs(f.top1() - g.top1()), 0.01);
  EXPECT_LE(std::fabs(f.mean_abs_dlogit() - g.mean_abs_dlogit()), 0.02);
  EXPECT_LE(std::fabs(f.mean_kl() - g.mean_kl()), 3e-3);
}

TEST_F(QuantizedFidelity, Int4AllIsMeasured) {
  auto f = measure_scheme(*quant_scheme("int4-all"));
  EXPECT_GE(f.top1(), 0.70);
  EXPECT_LE(f.mean_kl(), 0.15);
}

// Measured (980 positions, AVX-512) with each group's scale and minimum fitted
// by least squares (kernels/quantize.cpp) and one activation plane on the
// 4-bit experts: top-1 0.9051, mean |dlogit| 0.2065, mean KL 2.55e-2 (two
// planes: 0.9051, 0.2051, 2.52e-2). Round-to-nearest over the group's range,
// the rule before the fit, measured 0.8898, 0.2338 and 3.24e-2, outside these bounds.
TEST_F(QuantizedFidelity, Int4IsMeasured) {
  auto f = measure_scheme(*quant_scheme("int4"));
  EXPECT_GE(f.top1(), 0.88);
  EXPECT_LE(f.mean_abs_dlogit(), 0.22);
  EXPECT_LE(f.mean_kl(), 2.9e-2);
}

// The prompt default on int4 files, whose attention and lm_head stay 8-bit:
// one plane for the attention output on top of the 4-bit experts' own.
// Measured (session 20) against the decode modes above, and held near them.
TEST_F(QuantizedFidelity, Int4PromptsInThePrefillDefaultAreMeasured) {
  auto decode = measure_scheme(*quant_scheme("int4"));
  auto prompt = measure_scheme(*quant_scheme("int4"), kPrefillInt8FfnOut, " (int8-ffn-out prefill)");
  EXPECT_GE(prompt.top1(), decode.top1() - 0.01);
  EXPECT_LE(prompt.mean_abs_dlogit(), decode.mean_abs_dlogit() * 1.05);
  EXPECT_LE(prompt.mean_kl(), decode.mean_kl() * 1.05);
}

}  // namespace
}  // namespace colibri
