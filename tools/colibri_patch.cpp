// colibri-patch: replace one expert block of a .colibri file with the same
// block of another .colibri file of the same layout.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "core/output_file.h"
#include "format/colibri_writer.h"

int main(int argc, char** argv) {
  CLI::App app{
      "colibri-patch: replace the block of one expert (gate, up and down of one layer's expert)\n"
      "in a .colibri file with the same block of a donor .colibri file.\n\n"
      "The donor must store that block in the same layout (formats, shapes, group sizes, size),\n"
      "which holds when both were converted from the same architecture with the same\n"
      "quantization. The donor's block must pass its checksum. A complete new file is written\n"
      "beside the output (OUTPUT.tmp-PID-RANDOM), synced, and renamed over it, so a process that has\n"
      "the old file mapped keeps reading the old blocks.\n\n"
      "Examples:\n"
      "  colibri-patch --target model.colibri --from finetuned.colibri --layer 3 --expert 17\n"
      "  colibri-patch --target a.colibri --from b.colibri --layer 0 --expert 2 --output c.colibri\n"};
  std::string target, donor, output;
  std::uint32_t layer = 0, expert = 0;
  app.add_option("--target", target, "The .colibri file to patch")->required();
  app.add_option("--from", donor, "The donor .colibri file holding the new block")->required();
  app.add_option("--layer", layer, "Layer of the expert")->required();
  app.add_option("--expert", expert, "Expert index within the layer")->required();
  app.add_option("-o,--output", output, "Where to write the result (default: replace --target in place)");
  CLI11_PARSE(app, argc, argv);
  // Ctrl-C must not leave a temporary file of many GB beside the output.
  colibri::remove_output_temp_on_signals();
  if (output.empty()) output = target;

  auto report = colibri::patch_expert(target, donor, layer, expert, output);
  if (!report) {
    std::fprintf(stderr, "colibri-patch: %s\n", report.error().message.c_str());
    return 1;
  }
  std::printf("patched layer %u expert %u of %s from %s into %s: block %llu bytes, %llu bytes changed\n", layer,
              expert, target.c_str(), donor.c_str(), output.c_str(),
              static_cast<unsigned long long>(report->block_bytes),
              static_cast<unsigned long long>(report->changed_bytes));
  return 0;
}
