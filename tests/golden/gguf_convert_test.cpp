// Converting a fixture's model.gguf gives a .colibri whose f32 logits match the
// one converted from the Hugging Face safetensors within 1e-4.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/checkpoint.h"
#include "format/colibri_writer.h"
#include "model/model.h"
#include "runtime/session.h"

namespace colibri {
namespace {

std::filesystem::path convert(const std::filesystem::path& input, const std::string& name) {
  auto out = std::filesystem::temp_directory_path() / ("colibri-ggufconv-" + std::to_string(::getpid()) + "-" + name);
  auto checkpoint = open_checkpoint(input);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.error().message;
  if (!checkpoint.ok()) return out;
  ConvertInput in{checkpoint->config, checkpoint->config_json, checkpoint->tokenizer_json,
                  checkpoint->tokenizer_config_json, checkpoint->kind, checkpoint->source.get()};
  auto status = write_colibri(out, in, *quant_scheme("f32"));
  EXPECT_TRUE(status.ok()) << status.error().message;
  return out;
}

class GgufConversion : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufConversion, LogitsMatchTheSafetensorsConversion) {
  const auto dir = std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "fixtures" / GetParam();
  const auto from_gguf = convert(dir / "model.gguf", GetParam() + "-gguf.colibri");
  const auto from_hf = convert(dir, GetParam() + "-hf.colibri");
  auto a = Model::load(from_gguf, LoadOptions{.verify_checksums = true});
  auto b = Model::load(from_hf, LoadOptions{.verify_checksums = true});
  std::filesystem::remove(from_gguf);
  std::filesystem::remove(from_hf);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(b.ok()) << b.error().message;

  std::ifstream in(dir / "reference.json");
  auto reference = nlohmann::json::parse(in);
  double worst = 0.0;
  for (const auto& prompt : reference["prompts"]) {
    const auto text = prompt["prompt"].get<std::string>();
    EncodeOptions options;
    options.add_special_tokens = false;
    auto tokens_a = (*a)->tokenizer().encode(text, options);
    auto tokens_b = (*b)->tokenizer().encode(text, options);
    ASSERT_TRUE(tokens_a.ok() && tokens_b.ok());
    ASSERT_EQ(*tokens_a, *tokens_b);
    Session sa(*a), sb(*b);
    for (std::int32_t token : *tokens_a) {
      auto la = sa.decode(token);
      auto lb = sb.decode(token);
      ASSERT_TRUE(la.ok() && lb.ok());
      for (std::size_t i = 0; i < la->size(); ++i)
        worst = std::max(worst, static_cast<double>(std::fabs((*la)[i] - (*lb)[i])));
    }
  }
  std::printf("[gguf->colibri] %s: max |dlogit| vs safetensors->colibri = %.3g\n", GetParam().c_str(), worst);
  EXPECT_LE(worst, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufConversion,
                         ::testing::Values("mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny", "olmoe-tiny"),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace colibri
