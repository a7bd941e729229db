// Quality of the bundled trained model (models/default), measured by
// perplexity on a held-out excerpt: Colibri must agree with the training
// script's own evaluation, and quantization must cost little.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "format/checkpoint.h"
#include "format/colibri_writer.h"
#include "runtime/perplexity.h"

namespace colibri {
namespace {

const std::filesystem::path kData = COLIBRI_TEST_DATA_DIR;
const std::filesystem::path kModel = kData / ".." / ".." / "models" / "default";

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::vector<std::int32_t> excerpt_tokens(const Model& model) {
  std::ifstream in(kData / "default-model" / "heldout-excerpt.txt", std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  EncodeOptions options;
  options.add_special_tokens = false;
  options.parse_special = true;  // documents are separated by <|endoftext|>
  auto tokens = model.tokenizer().encode(text.str(), options);
  EXPECT_TRUE(tokens.ok()) << tokens.error().message;
  return *tokens;
}

std::shared_ptr<const Model> load(const std::filesystem::path& path) {
  auto model = Model::load(path);
  EXPECT_TRUE(model.ok()) << model.error().message;
  return *model;
}

std::filesystem::path convert(const std::string& quant) {
  auto out = std::filesystem::temp_directory_path() /
             ("colibri-default-" + quant + "-" + std::to_string(::getpid()) + ".colibri");
  auto checkpoint = open_checkpoint(kModel);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.error().message;
  ConvertInput input{checkpoint->config, checkpoint->config_json, checkpoint->tokenizer_json,
                     checkpoint->tokenizer_config_json, checkpoint->kind, checkpoint->source.get()};
  auto status = write_colibri(out, input, *quant_scheme(quant));
  EXPECT_TRUE(status.ok()) << status.error().message;
  return out;
}

TEST(DefaultModelQuality, PerplexityMatchesTheTrainingScriptAndBeatsAnUntrainedModel) {
  auto model = load(kModel);
  const auto expected = read_json(kData / "default-model" / "heldout-excerpt.json");
  const auto report = read_json(kModel / "training_report.json");
  auto tokens = excerpt_tokens(*model);
  ASSERT_EQ(static_cast<std::int64_t>(tokens.size()), expected["tokens"].get<std::int64_t>());
  auto result = measure_perplexity(model, nullptr, tokens, {.context = 256, .stride = 256});
  ASSERT_TRUE(result.ok()) << result.error().message;
  const double training_ppl = expected["perplexity"].get<double>();
  const double untrained_ppl = report["untrained_val_perplexity"].get<double>();
  std::printf("[quality] held-out excerpt, %lld predictions: Colibri f32 perplexity %.4f, training "
              "script %.4f; untrained same-shape model %.1f (whole held-out split)\n",
              static_cast<long long>(result->scored), result->perplexity(), training_ppl, untrained_ppl);
  EXPECT_EQ(result->scored, expected["predicted_tokens"].get<std::int64_t>());
  EXPECT_NEAR(result->perplexity(), training_ppl, 0.005 * training_ppl);
  EXPECT_LT(result->perplexity(), untrained_ppl / 4);
}

TEST(DefaultModelQuality, QuantizationCostsLittlePerplexity) {
  auto base = load(kModel);
  auto tokens = excerpt_tokens(*base);
  struct Bound {
    const char* quant;
    double max_ppl_ratio;
    double max_kl;
  };
  for (Bound bound : {Bound{"int8", 1.01, 0.01}, Bound{"int4", 1.05, 0.05}}) {
    auto path = convert(bound.quant);
    auto model = load(path);
    auto result = measure_perplexity(model, base, tokens, {.context = 256, .stride = 256, .max_tokens = 4096});
    std::filesystem::remove(path);
    ASSERT_TRUE(result.ok()) << result.error().message;
    const double ratio = result->perplexity() / result->base_perplexity();
    std::printf("[quality] %s: perplexity %.4f vs f32 %.4f (ratio %.5f), mean KL %.3g, top-1 agreement %.4f\n",
                bound.quant, result->perplexity(), result->base_perplexity(), ratio, result->mean_kl(),
                result->top1_agreement());
    EXPECT_LE(ratio, bound.max_ppl_ratio) << bound.quant;
    EXPECT_LE(result->mean_kl(), bound.max_kl) << bound.quant;
  }
}

}  // namespace
}  // namespace colibri
