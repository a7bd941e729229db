// colibri-synth: a .colibri file of a real model's shape with random weights,
// for measuring speed and memory on models too large to download casually.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "core/output_file.h"
#include "format/colibri_writer.h"
#include "layout_flags.h"
#include "model/model_config.h"
#include "synth/random_source.h"
#include "synth/shapes.h"
#include "synth/tokenizer.h"

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "colibri-synth: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shapes_help;
  for (const auto& shape : colibri::synth::known_shapes())
    shapes_help += "  " + std::string(shape.name) + "\n      " + std::string(shape.description) + "\n";
  CLI::App app{
      "colibri-synth: write a .colibri file of a real model's shape with RANDOM weights.\n\n"
      "For benchmarks only: the file loads and runs like any converted model (colibri-inspect\n"
      "--verify, colibri-run, colibri-bench, the server), but its weights are noise, so the\n"
      "text it generates is meaningless. Matrices are approximately normal(0, --std), the\n"
      "token embeddings normal(0, --embed-std), the products that write into the residual\n"
      "stream (o_proj, every down_proj) normal(0, --residual-std), RMSNorm weights 1: so\n"
      "activations stay finite and each token keeps its identity through the layers, and\n"
      "routing spreads over the experts at every layer as in a trained model (with one std\n"
      "for everything, as before 2026-11-29, a sequence's tokens all pick the same few\n"
      "experts from the second layer on, which makes expert-cache figures meaningless). The\n"
      "embedded tokenizer is a synthetic byte-level BPE sized to the shape's vocabulary (256\n"
      "bytes, generated merges, <|endoftext|> as the last id): it encodes any text, but its\n"
      "merges are not learnt. Tensors are generated and written one at a time.\n\n"
      "Shapes:\n" +
      shapes_help +
      "\nExamples:\n"
      "  colibri-synth olmoe-1b-7b --quant int8            # /tmp/colibri-synth/olmoe-1b-7b-int8.colibri\n"
      "  colibri-synth qwen3-30b-a3b --layers 4 --quant int4 --out /tmp/q3.colibri\n"};
  std::string shape_name, quant = "int8", out;
  std::int32_t layers = 0, group4 = 0;
  std::uint64_t seed = 1;
  colibri::synth::SynthScales scales;
  bool no_progress = false;
  colibri_tools::LayoutFlags layout;
  app.add_option("shape", shape_name, "Model shape (see above)")->required();
  app.add_option("--layers", layers, "Keep only the first N layers (default: all)")->check(CLI::PositiveNumber);
  app.add_option("-q,--quant", quant,
                 "int8 (the q8 scheme colibri-convert writes), int4, int4-all, f16, bf16 or f32")
      ->capture_default_str();
  app.add_option("--group4", group4,
                 "int4, int4-all: values per scale and minimum along a row, as colibri-convert's --group4 "
                 "(default: the scheme's, 32)")
      ->check(CLI::Range(8, 4096));
  app.add_option("--seed", seed, "Seed of the weights; the same seed gives the same file")->capture_default_str();
  app.add_option("--std", scales.weight_std, "Standard deviation of the matrix weights")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1.0));
  app.add_option("--embed-std", scales.embed_std, "Standard deviation of the token embeddings")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 10.0));
  app.add_option("--residual-std", scales.residual_std,
                 "Standard deviation of o_proj and the down_proj of every FFN (default: --std / sqrt(2 x layers))")
      ->check(CLI::Range(1e-6, 1.0));
  app.add_option("-o,--out", out, "Output file (default /tmp/colibri-synth/SHAPE[-LN]-QUANT.colibri)");
  layout.add(app);
  app.add_flag("--no-progress", no_progress, "Do not draw a progress bar");
  CLI11_PARSE(app, argc, argv);
  // Ctrl-C must not leave a temporary file of many GB beside the output.
  colibri::remove_output_temp_on_signals();

  const colibri::synth::Shape* shape = colibri::synth::find_shape(shape_name);
  if (shape == nullptr) return fail("unknown shape '" + shape_name + "' (see --help for the list)");
  auto scheme = colibri::quant_scheme(quant);
  if (!scheme) return fail(scheme.error().message);
  if (group4 > 0) scheme->q4_group = group4;
  auto config_json = colibri::synth::shape_config_json(*shape, layers);
  if (!config_json) return fail(config_json.error().message);
  auto config = colibri::parse_hf_config(*config_json, std::string(shape->name));
  if (!config) return fail(config.error().message);
  auto tokenizer = colibri::synth::synthetic_tokenizer(config->vocab);
  if (!tokenizer) return fail(tokenizer.error().message);

  if (out.empty()) {
    out = "/tmp/colibri-synth/" + std::string(shape->name) + (layers > 0 ? "-L" + std::to_string(layers) : "") +
          "-" + quant + ".colibri";
  }
  const std::filesystem::path parent = std::filesystem::path(out).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) return fail("cannot create " + parent.string() + ": " + ec.message());
  }

  const colibri::synth::RandomSource source(*config, seed, scales);
  const colibri::ConvertInput input{*config, *config_json, tokenizer->tokenizer_json,
                                    tokenizer->tokenizer_config_json, "synthetic", &source};
  colibri::WriteOptions options;
  layout.apply(*scheme, options);
  const bool draw = !no_progress && ::isatty(STDERR_FILENO);
  options.progress = [draw](std::size_t done, std::size_t total) {
    if (!draw) return;
    const int width = 40;
    const int filled = static_cast<int>(width * done / total);
    std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu tensors", filled, "========================================",
                 width - filled, "", done, total);
    if (done == total) std::fputc('\n', stderr);
  };
  const auto start = std::chrono::steady_clock::now();
  if (auto status = colibri::write_colibri(out, input, *scheme, options); !status) return fail(status.error().message);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "colibri-synth: wrote %s (%s shape, %d layers, %s, %.2f GB) in %.1f s\n", out.c_str(),
               std::string(shape->name).c_str(), config->n_layers, quant.c_str(),
               static_cast<double>(std::filesystem::file_size(out)) / 1e9, seconds);
  std::printf("%s\n", out.c_str());
  return 0;
}
