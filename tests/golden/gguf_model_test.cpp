// A fixture loaded from its model.gguf must behave exactly like the same
// fixture loaded from its Hugging Face directory: same logits at every
// position of every reference prompt, and the tokenizer synthesized from GGUF
// metadata must produce the reference token ids. A copy with Q8_0 weights
// (quantized here as ggml does) must stay close.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../format/gguf_test_writer.h"
#include "format/checkpoint.h"
#include "format/colibri_writer.h"
#include "format/gguf_source.h"
#include "kernels/quantize.h"
#include "model/model.h"
#include "runtime/session.h"

namespace colibri {
namespace {

constexpr double kLogitTolerance = 1e-4;

std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "fixtures" / name;
}

nlohmann::json load_reference(const std::string& name) {
  std::ifstream in(fixture_dir(name) / "reference.json");
  return nlohmann::json::parse(in);
}

std::int32_t argmax(std::span<const float> logits) {
  std::int32_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<std::size_t>(best)]) best = static_cast<std::int32_t>(i);
  return best;
}

// Logits of every position of a prompt, decoded one token at a time.
std::vector<std::vector<float>> all_logits(const std::shared_ptr<const Model>& model,
                                           const std::vector<std::int32_t>& tokens) {
  Session session(model);
  std::vector<std::vector<float>> out;
  for (std::int32_t token : tokens) {
    auto step = session.decode(token);
    EXPECT_TRUE(step.ok()) << step.error().message;
    if (!step.ok()) break;
    out.emplace_back(step->begin(), step->end());
  }
  return out;
}

// Writes a GGUF image built by a test into the build tree and returns its path.
std::filesystem::path write_gguf(const std::vector<std::uint8_t>& image, const std::string& name) {
  const auto dir = std::filesystem::path(COLIBRI_BINARY_DIR) / "gguf_model_test";
  std::filesystem::create_directories(dir);
  const auto path = dir / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(image.data()), static_cast<std::streamsize>(image.size()));
  EXPECT_TRUE(out.good()) << path;
  return path;
}

// The matrices a quantized GGUF download re-encodes: attention and experts.
bool is_attention_or_expert(const GgufTensorInfo& t) {
  for (std::string_view part : {"_exps.", "attn_q.", "attn_k.", "attn_v.", "attn_output."})
    if (t.name.find(part) != std::string::npos) return true;
  return false;
}

class GgufGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufGolden, LogitsMatchTheHfDirectory) {
  auto from_gguf = Model::load(fixture_dir(GetParam()) / "model.gguf");
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.error().message;
  auto from_hf = Model::load(fixture_dir(GetParam()));
  ASSERT_TRUE(from_hf.ok()) << from_hf.error().message;
  EXPECT_EQ((*from_gguf)->config().vocab, (*from_hf)->config().vocab);

  nlohmann::json reference = load_reference(GetParam());
  for (const auto& prompt : reference["prompts"]) {
    SCOPED_TRACE(prompt["prompt_id"].get<std::string>());
    auto tokens = prompt["tokens"].get<std::vector<std::int32_t>>();
    auto a = all_logits(*from_gguf, tokens);
    auto b = all_logits(*from_hf, tokens);
    ASSERT_EQ(a.size(), tokens.size());
    ASSERT_EQ(b.size(), tokens.size());
    double max_diff = 0.0;
    for (std::size_t pos = 0; pos < tokens.size(); ++pos) {
      ASSERT_EQ(a[pos].size(), b[pos].size());
      for (std::size_t id = 0; id < a[pos].size(); ++id)
        max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[pos][id]) - b[pos][id]));
      EXPECT_EQ(argmax(a[pos]), prompt["positions"][pos]["argmax"].get<std::int32_t>()) << "position " << pos;
    }
    EXPECT_LE(max_diff, kLogitTolerance);
    std::printf("[gguf] %s %s: %zu positions, max |dlogit| GGUF vs safetensors over the whole vocabulary = %.3g\n",
                GetParam().c_str(), prompt["prompt_id"].get<std::string>().c_str(), tokens.size(), max_diff);
  }
}

TEST_P(GgufGolden, SynthesizedTokenizerMatchesReferenceIds) {
  auto model = Model::load(fixture_dir(GetParam()) / "model.gguf");
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto hf = Tokenizer::load(fixture_dir(GetParam()));
  ASSERT_TRUE(hf.ok()) << hf.error().message;
  const Tokenizer& tokenizer = (*model)->tokenizer();
  EXPECT_FALSE(tokenizer.add_bos());
  EXPECT_EQ(tokenizer.eos_id(), hf->eos_id());
  nlohmann::json reference = load_reference(GetParam());
  for (const auto& prompt : reference["prompts"]) {
    SCOPED_TRACE(prompt["prompt_id"].get<std::string>());
    auto text = prompt["prompt"].get<std::string>();
    auto expected = prompt["tokens"].get<std::vector<std::int32_t>>();
    for (bool add_special : {false, true}) {
      EncodeOptions options;
      options.add_special_tokens = add_special;
      auto ids = tokenizer.encode(text, options);
      ASSERT_TRUE(ids.ok()) << ids.error().message;
      EXPECT_EQ(*ids, expected);
    }
    auto decoded = tokenizer.decode(expected);
    ASSERT_TRUE(decoded.ok()) << decoded.error().message;
    EXPECT_EQ(*decoded, text);
  }
  // Special tokens are special in both, and parsed only on request.
  EncodeOptions special;
  special.parse_special = true;
  auto with = tokenizer.encode("<|im_start|>hi<|im_end|>", special);
  auto with_hf = hf->encode("<|im_start|>hi<|im_end|>", special);
  ASSERT_TRUE(with.ok() && with_hf.ok());
  EXPECT_EQ(*with, *with_hf);
  EXPECT_EQ(with->front(), 507);
  auto without = tokenizer.encode("<|im_start|>hi", {});
  auto without_hf = hf->encode("<|im_start|>hi", {});
  ASSERT_TRUE(without.ok() && without_hf.ok());
  EXPECT_EQ(*without, *without_hf);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufGolden,
                         ::testing::Values("mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny", "olmoe-tiny"),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

// Mixtral with every attention and expert matrix re-encoded as Q8_0: exercises
// dequantization together with the Q/K un-permutation and the expert slicing.
TEST(GgufQ8_0, QuantizedMixtralStaysClose) {
  auto f32_file = GgufFile::open(fixture_dir("mixtral-tiny") / "model.gguf");
  ASSERT_TRUE(f32_file.ok()) << f32_file.error().message;
  const auto path =
      write_gguf(testing_gguf::requantize(f32_file->gguf(), is_attention_or_expert), "mixtral-tiny-q8_0.gguf");

  auto q8 = Model::load(path);
  ASSERT_TRUE(q8.ok()) << q8.error().message;
  auto f32 = Model::load(fixture_dir("mixtral-tiny") / "model.gguf");
  ASSERT_TRUE(f32.ok()) << f32.error().message;

  // Weights: the Q8_0 model holds exactly ggml's round trip of the f32 ones.
  const Matrix& q8_q = (*q8)->weights().layers[0].q;
  const Matrix& f32_q = (*f32)->weights().layers[0].q;
  ASSERT_EQ(q8_q.format, WeightFormat::F32);
  ASSERT_EQ(f32_q.format, WeightFormat::F32);
  std::size_t n = static_cast<std::size_t>(f32_q.rows) * static_cast<std::size_t>(f32_q.cols);
  auto requant = testing_gguf::quantize_q8_0(f32_q.f32(), n);
  std::vector<float> expected(n);
  dequantize_q8_0(requant.data(), n, expected.data());
  EXPECT_EQ(std::vector<float>(q8_q.f32(), q8_q.f32() + n), expected);

  nlohmann::json reference = load_reference("mixtral-tiny");
  std::size_t positions = 0, agree = 0;
  double sum_diff = 0.0, max_diff = 0.0;
  std::size_t diff_count = 0;
  for (const auto& prompt : reference["prompts"]) {
    auto tokens = prompt["tokens"].get<std::vector<std::int32_t>>();
    auto a = all_logits(*q8, tokens);
    auto b = all_logits(*f32, tokens);
    ASSERT_EQ(a.size(), b.size());
    std::size_t prompt_agree = 0;
    for (std::size_t pos = 0; pos < a.size(); ++pos) {
      ++positions;
      if (argmax(a[pos]) == argmax(b[pos])) ++agree, ++prompt_agree;
      for (std::size_t id = 0; id < a[pos].size(); ++id) {
        double d = std::fabs(static_cast<double>(a[pos][id]) - b[pos][id]);
        sum_diff += d;
        max_diff = std::max(max_diff, d);
        ++diff_count;
      }
    }
    std::printf("[gguf-q8_0] mixtral-tiny %s: top-1 agreement %zu/%zu\n",
                prompt["prompt_id"].get<std::string>().c_str(), prompt_agree, a.size());
  }
  double agreement = static_cast<double>(agree) / static_cast<double>(positions);
  std::printf("[gguf-q8_0] mixtral-tiny overall: top-1 agreement %.1f%% (%zu/%zu), mean |dlogit| %.4f, "
              "max |dlogit| %.4f\n", 100.0 * agreement, agree, positions,
              sum_diff / static_cast<double>(diff_count), max_diff);
  EXPECT_GE(agreement, 0.90);
  std::filesystem::remove(path);
}

// The same with 4-bit Q4_1 blocks (what a "Q4_1" GGUF download holds): the
// loaded weights are exactly ggml's decoding of the stored blocks, and the
// logits stay near the f32 file's, within 4-bit error: measured 73.5 % top-1
// agreement (180 of 245 positions) with every attention and expert matrix at
// 4 bits (colibri's own int4-all: 80.5 % over the four fixtures).
TEST(GgufQ4_1, QuantizedMixtralStaysClose) {
  auto f32_file = GgufFile::open(fixture_dir("mixtral-tiny") / "model.gguf");
  ASSERT_TRUE(f32_file.ok()) << f32_file.error().message;
  const auto path = write_gguf(testing_gguf::requantize(f32_file->gguf(), is_attention_or_expert, GgmlType::Q4_1),
                               "mixtral-tiny-q4_1.gguf");
  auto q4 = Model::load(path);
  ASSERT_TRUE(q4.ok()) << q4.error().message;
  auto f32 = Model::load(fixture_dir("mixtral-tiny") / "model.gguf");
  ASSERT_TRUE(f32.ok()) << f32.error().message;

  // An expert matrix (sliced out of the stacked tensor) and o_proj (no un-permutation).
  for (auto pick : {+[](const Model& m) -> const Matrix& { return m.weights().layers[1].experts[3].down; },
                    +[](const Model& m) -> const Matrix& { return m.weights().layers[0].o; }}) {
    const Matrix& got = pick(**q4);
    const Matrix& source = pick(**f32);
    ASSERT_EQ(got.format, WeightFormat::F32);
    const std::size_t n = static_cast<std::size_t>(source.rows) * static_cast<std::size_t>(source.cols);
    auto blocks = testing_gguf::quantize_q4_1(source.f32(), n);
    std::vector<float> expected(n);
    ASSERT_TRUE(dequantize_ggml_blocks(GgmlType::Q4_1, blocks.data(), n, expected.data()));
    EXPECT_EQ(std::vector<float>(got.f32(), got.f32() + n), expected);
  }

  nlohmann::json reference = load_reference("mixtral-tiny");
  std::size_t positions = 0, agree = 0;
  for (const auto& prompt : reference["prompts"]) {
    auto tokens = prompt["tokens"].get<std::vector<std::int32_t>>();
    auto a = all_logits(*q4, tokens);
    auto b = all_logits(*f32, tokens);
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t pos = 0; pos < a.size(); ++pos, ++positions)
      if (argmax(a[pos]) == argmax(b[pos])) ++agree;
  }
  const double agreement = static_cast<double>(agree) / static_cast<double>(positions);
  std::printf("[gguf-q4_1] mixtral-tiny: top-1 agreement with the f32 file %.1f%% (%zu/%zu)\n", 100.0 * agreement,
              agree, positions);
  EXPECT_GE(agreement, 0.65);
  std::filesystem::remove(path);
}

// Converts `fixture`'s GGUF, with the tensors `pick` selects re-encoded as
// `type`, to a .colibri file of `scheme`, and counts the values of every
// routed expert matrix that differ from the GGUF's own decoding.
struct SecondRounding {
  std::size_t values = 0, differing = 0;
};
template <typename Pick>
SecondRounding convert_and_compare(const std::string& fixture, GgmlType type, Pick pick, const QuantScheme& scheme,
                                   WeightFormat expected_format) {
  SecondRounding count;
  auto f32_file = GgufFile::open(fixture_dir(fixture) / "model.gguf");
  EXPECT_TRUE(f32_file.ok()) << f32_file.error().message;
  if (!f32_file.ok()) return count;
  const auto gguf_path = write_gguf(testing_gguf::requantize(f32_file->gguf(), pick, type), fixture + "-requantized.gguf");
  const auto colibri_path = gguf_path.parent_path() / (fixture + "-converted.colibri");
  auto checkpoint = open_checkpoint(gguf_path);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.error().message;
  if (!checkpoint.ok()) return count;
  ConvertInput input{checkpoint->config, checkpoint->config_json, checkpoint->tokenizer_json,
                     checkpoint->tokenizer_config_json, checkpoint->kind, checkpoint->source.get()};
  EXPECT_TRUE(write_colibri(colibri_path, input, scheme).ok());
  auto decoded = Model::load(gguf_path);  // the GGUF's blocks decoded to f32
  auto converted = Model::load(colibri_path);
  EXPECT_TRUE(decoded.ok() && converted.ok());
  if (!decoded.ok() || !converted.ok()) return count;
  for (std::size_t l = 0; l < (*decoded)->weights().layers.size(); ++l)
    for (std::size_t e = 0; e < (*decoded)->weights().layers[l].experts.size(); ++e)
      for (auto part : {&FfnWeights::gate, &FfnWeights::up, &FfnWeights::down}) {
        const Matrix& want = (*decoded)->weights().layers[l].experts[e].*part;
        const Matrix& got = (*converted)->weights().layers[l].experts[e].*part;
        EXPECT_EQ(got.format, expected_format);
        std::vector<float> row(static_cast<std::size_t>(got.cols));
        for (std::int32_t r = 0; r < got.rows; ++r) {
          dequantize_row(got, r, row.data());
          for (std::int32_t c = 0; c < got.cols; ++c, ++count.values)
            if (row[static_cast<std::size_t>(c)] != want.f32()[static_cast<std::size_t>(r) * got.cols + c])
              ++count.differing;
        }
      }
  std::filesystem::remove(gguf_path);
  std::filesystem::remove(colibri_path);
  return count;
}

bool is_expert(const GgufTensorInfo& t) { return t.name.find("_exps.") != std::string::npos; }

// A Q4_1 block is exactly what an int4 group holds (32 values, an f16 scale
// and minimum, codes 0..15 spanning the range), so the writer's quantizer finds
// that exact fit again (round-to-nearest over the range, its first candidate):
// converting a Q4_1 GGUF to int4 rounds its experts no further.
TEST(GgufQ4_1, ConvertsToInt4WithoutASecondRounding) {
  const auto count =
      convert_and_compare("olmoe-tiny", GgmlType::Q4_1, is_expert, *quant_scheme("int4"), WeightFormat::Q4R16);
  std::printf("[gguf-q4_1] olmoe-tiny experts to int4: %zu of %zu values differ from the GGUF's\n", count.differing,
              count.values);
  EXPECT_GT(count.values, 0u);
  EXPECT_EQ(count.differing, 0u);
}

// Q8_0 blocks (32 values, d = max|w| / 127, so the largest code is +-127)
// convert to int8 with groups of 32 (`colibri-convert --group 32`) exactly:
// the writer's scale max|w| / 127 is d again and every code comes back. With
// the default groups of 64, two blocks share a scale and values are rounded again.
TEST(GgufQ8_0, ConvertsToInt8WithGroupsOf32WithoutASecondRounding) {
  QuantScheme scheme = *quant_scheme("int8");
  scheme.q8_group = 32;
  const auto exact = convert_and_compare("olmoe-tiny", GgmlType::Q8_0, is_expert, scheme, WeightFormat::Q8R16);
  const auto regrouped =
      convert_and_compare("olmoe-tiny", GgmlType::Q8_0, is_expert, *quant_scheme("int8"), WeightFormat::Q8R16);
  std::printf("[gguf-q8_0] olmoe-tiny experts to int8: %zu of %zu values differ with groups of 32, %zu with 64\n",
              exact.differing, exact.values, regrouped.differing);
  EXPECT_GT(exact.values, 0u);
  EXPECT_EQ(exact.differing, 0u);
  EXPECT_GT(regrouped.differing, 0u);
}

TEST(GgufLoad, MissingGgufFileIsAClearError) {
  auto model = Model::load(fixture_dir("mixtral-tiny") / "absent.gguf");
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.error().message.find("absent.gguf"), std::string::npos) << model.error().message;
}

}  // namespace
}  // namespace colibri
