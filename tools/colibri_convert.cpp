// colibri-convert: Hugging Face directory or GGUF file -> .colibri
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <unistd.h>

#include "core/output_file.h"
#include "format/checkpoint.h"
#include "format/colibri_writer.h"
#include "layout_flags.h"

namespace {

// The input file, or the file of the input directory, that `output` names
// (the same file by device and inode, whatever the spelling), if any.
std::optional<std::string> file_of_input_at(const std::string& input, const std::string& output) {
  std::error_code ec;
  if (!std::filesystem::exists(output, ec)) return std::nullopt;
  auto same = [&](const std::filesystem::path& candidate) {
    std::error_code e;
    return std::filesystem::is_regular_file(candidate, e) && std::filesystem::equivalent(candidate, output, e);
  };
  if (same(input)) return input;
  if (std::filesystem::is_directory(input, ec))
    for (const auto& entry : std::filesystem::directory_iterator(input, ec))
      if (same(entry.path())) return entry.path().string();
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "colibri-convert: convert a Hugging Face checkpoint or a GGUF file into one .colibri file.\n\n"
      "Examples:\n"
      "  colibri-convert --input ./Qwen1.5-MoE-A2.7B --output qwen-moe.colibri --quant int8\n"
      "  colibri-convert --input olmoe-1b-7b.Q8_0.gguf --output olmoe.colibri --quant int4\n\n"
      "GGUF tensors may be F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 or Q2_K..Q6_K; they are\n"
      "decoded and quantized again to --quant. A Q8_0 GGUF with --quant int8 --group 32 keeps its\n"
      "numbers exactly, and so do a Q4_1 GGUF's experts with --quant int4; other 4-bit GGUFs are\n"
      "rounded twice (prefer the Hugging Face checkpoint or a Q8_0/F16 GGUF when there is one).\n\n"
      "Quantization schemes:\n"
      "  int8  every matrix symmetric int8 (groups of --group values along a row, f32 scales;\n"
      "        embedding rows one scale each); router, norms and biases f32\n"
      "  int4  routed/shared experts 4-bit with a scale and minimum per group of --group4; the\n"
      "        rest as int8\n"
      "  int4-all  every matrix 4-bit but the embeddings (int8) and routers (f32): 12 % fewer\n"
      "        bytes per OLMoE token than int4, at a measured cost in fidelity (README)\n"
      "  f16, bf16, f32  every matrix in that type; router, norms and biases f32\n"};
  std::string input, output, quant = "int8";
  int group = 64, group4 = 32, num_experts = 0;
  bool no_progress = false;
  colibri_tools::LayoutFlags layout;
  app.add_option("-i,--input", input, "Hugging Face model directory or .gguf file")->required();
  app.add_option("-o,--output", output, "The .colibri file to write")->required();
  app.add_option("-q,--quant", quant, "int8, int4, int4-all, f16, bf16 or f32")->capture_default_str();
  app.add_option("--group", group, "int8: values per scale along a row")->capture_default_str()
      ->check(CLI::Range(1, 65535));
  app.add_option("--group4", group4, "int4: values per scale and minimum along a row")->capture_default_str()
      ->check(CLI::Range(1, 65535));
  app.add_option("--num-experts", num_experts,
                 "Override the number of experts (for a config.json that lacks it)")
      ->check(CLI::PositiveNumber);
  layout.add(app);
  app.add_flag("--no-progress", no_progress, "Do not draw a progress bar");
  CLI11_PARSE(app, argc, argv);
  // Ctrl-C must not leave a temporary file of many GB beside the output.
  colibri::remove_output_temp_on_signals();

  // The output replaces its path by rename, so a running server that maps the
  // old file is safe; but an output naming the input (or a file of the input
  // directory) would replace the model being converted (RELIABILITY.md row 30).
  if (const auto replaced = file_of_input_at(input, output)) {
    std::fprintf(stderr, "colibri-convert: the output %s is the input's %s, which the conversion would replace; "
                 "write the .colibri file elsewhere\n", output.c_str(), replaced->c_str());
    return 2;
  }

  auto scheme = colibri::quant_scheme(quant);
  if (!scheme) {
    std::fprintf(stderr, "colibri-convert: %s\n", scheme.error().message.c_str());
    return 2;
  }
  scheme->q8_group = group;
  scheme->q4_group = group4;
  auto checkpoint = colibri::open_checkpoint(input, num_experts);
  if (!checkpoint) {
    std::fprintf(stderr, "colibri-convert: %s\n", checkpoint.error().message.c_str());
    return 1;
  }

  colibri::ConvertInput convert{checkpoint->config, checkpoint->config_json, checkpoint->tokenizer_json,
                                checkpoint->tokenizer_config_json, checkpoint->kind,
                                checkpoint->source.get()};
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
  auto start = std::chrono::steady_clock::now();
  auto status = colibri::write_colibri(output, convert, *scheme, options);
  if (!status) {
    std::fprintf(stderr, "colibri-convert: %s\n", status.error().message.c_str());
    return 1;
  }
  auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "colibri-convert: wrote %s (%s, %s, %zu bytes) in %.2f s\n", output.c_str(),
               std::string(checkpoint->config.arch->display_name).c_str(), quant.c_str(),
               static_cast<std::size_t>(std::filesystem::file_size(output)), seconds);
  return 0;
}
